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
// Energy blocks (the attention of ModelKind::kEnergy) have their own
// registry, EnergyBlockRegistry() in energy_block.h; all use the Registry
// template of name_registry.h.
//
// Looking up an unknown name throws stillpoint::Error listing the known
// names; registering a name twice throws unless replace is set. The
// registries are process-wide and filled on first use (so registering from
// a static initialiser is safe); they are not thread safe: register before
// starting threads.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "framework/random.h"
#include "layers/cell.h"
#include "layers/models.h"
#include "layers/name_registry.h"

namespace stillpoint {

using CellFactory = std::function<std::shared_ptr<Cell>(const CellOptions& options, Rng& rng)>;
using ModelFactory = std::function<std::shared_ptr<Model>(const ModelOptions& options)>;

Registry<CellFactory>& CellRegistry();
Registry<ModelFactory>& ModelRegistry();

// Shorthands for CellRegistry().Get(name)(options, rng) and
// ModelRegistry().Get(name)(options).
std::shared_ptr<Cell> CreateCell(const std::string& name, const CellOptions& options, Rng& rng);
std::shared_ptr<Model> CreateModel(const std::string& name, const ModelOptions& options);

}  // namespace stillpoint
