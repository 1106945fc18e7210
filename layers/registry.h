// Name -> factory registries for cells and models, so a configuration file
// can name them ("cell: deq_transformer", "model: sequence") and a user can
// add their own next to the built-in ones:
//
//   CellRegistry().Register("my_cell", [](const CellOptions& o, Rng& rng) {
//     return std::make_shared<MyCell>(o, rng);
//   }, "my cell: what it computes");
//   ModelOptions options;
//   options.cell = "my_cell";          // now usable in every model kind
//
// Built-in cells:  "deq_transformer" (DEQCell).
// Built-in models: "sequence" (SequenceModel), "classifier" (SequenceClassifier).
//
// Looking up an unknown name throws stillpoint::Error listing the known
// names; registering a name twice throws unless replace is set. The
// registries are process-wide and filled on first use (so registering from
// a static initialiser is safe); they are not thread safe: register before
// starting threads.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "framework/check.h"
#include "framework/random.h"
#include "layers/cell.h"
#include "layers/models.h"

namespace stillpoint {

template <typename Factory>
class Registry {
 public:
  // kind names the registry in messages: "cell", "model".
  explicit Registry(std::string kind) : kind_(std::move(kind)) {}

  // Adds (or, with replace, overwrites) name. Names are non-empty.
  void Register(const std::string& name,
                Factory factory,
                const std::string& description = "",
                bool replace = false) {
    SP_CHECK(!name.empty(), kind_, " registry: the name must not be empty");
    SP_CHECK(static_cast<bool>(factory), kind_, " registry: the factory for '", name, "' is empty");
    SP_CHECK(replace || entries_.count(name) == 0, kind_, " registry: '", name,
             "' is already registered (pass replace = true to overwrite it)");
    entries_[name] = Entry{std::move(factory), description};
  }

  bool Has(const std::string& name) const { return entries_.count(name) > 0; }

  // The factory of name; an unknown name throws, listing the known ones.
  const Factory& Get(const std::string& name) const { return Find(name).factory; }
  const std::string& Description(const std::string& name) const { return Find(name).description; }

  // Registered names, sorted.
  std::vector<std::string> Names() const {
    std::vector<std::string> names;
    for (const auto& [name, entry] : entries_) names.push_back(name);
    return names;
  }

 private:
  struct Entry {
    Factory factory;
    std::string description;
  };

  const Entry& Find(const std::string& name) const {
    auto it = entries_.find(name);
    if (it == entries_.end()) {
      std::ostringstream known;
      for (const auto& [known_name, entry] : entries_) {
        known << (known.tellp() > 0 ? ", " : "") << known_name;
      }
      throw Error(
          detail::StrCat("unknown ", kind_, " '", name, "'; known ", kind_, "s: ", known.str()));
    }
    return it->second;
  }

  std::string kind_;
  std::map<std::string, Entry> entries_;
};

using CellFactory = std::function<std::shared_ptr<Cell>(const CellOptions& options, Rng& rng)>;
using ModelFactory = std::function<std::shared_ptr<Model>(const ModelOptions& options)>;

Registry<CellFactory>& CellRegistry();
Registry<ModelFactory>& ModelRegistry();

// Shorthands for CellRegistry().Get(name)(options, rng) and
// ModelRegistry().Get(name)(options).
std::shared_ptr<Cell> CreateCell(const std::string& name, const CellOptions& options, Rng& rng);
std::shared_ptr<Model> CreateModel(const std::string& name, const ModelOptions& options);

}  // namespace stillpoint
