// Registry<Factory>: a name -> factory table with descriptions, the one
// mechanism behind CellRegistry(), ModelRegistry() (registry.h) and
// EnergyBlockRegistry() (energy_block.h).
//
// Looking up an unknown name throws stillpoint::Error listing the known
// names; registering a name twice throws unless replace is set. Not thread
// safe: register before starting threads.
#pragma once

#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "framework/check.h"

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

}  // namespace stillpoint
