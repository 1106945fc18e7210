#include "layers/registry.h"

#include "layers/deq_cell.h"

namespace stillpoint {

// The registries are created on first use and never destroyed, so static
// initialisers and destructors elsewhere may use them in any order.
Registry<CellFactory>& CellRegistry() {
  static Registry<CellFactory>* registry = [] {
    auto* r = new Registry<CellFactory>("cell");
    r->Register(
        "deq_transformer",
        [](const CellOptions& options, Rng& rng) -> std::shared_ptr<Cell> {
          return std::make_shared<DEQCell>(options, rng);
        },
        "post-norm transformer cell: h = LN1(z + MHA(z) + u), f = LN2(h + FFN(h))");
    return r;
  }();
  return *registry;
}

Registry<ModelFactory>& ModelRegistry() {
  static Registry<ModelFactory>* registry = [] {
    auto* r = new Registry<ModelFactory>("model");
    r->Register(
        "sequence",
        [](const ModelOptions& options) -> std::shared_ptr<Model> {
          return std::make_shared<SequenceModel>(options);
        },
        "per-token logits [B, T, V] from an explicit, tied or implicit transformer");
    r->Register(
        "classifier",
        [](const ModelOptions& options) -> std::shared_ptr<Model> {
          return std::make_shared<SequenceClassifier>(options);
        },
        "class logits [B, C] from the mean-pooled states of a transformer");
    return r;
  }();
  return *registry;
}

std::shared_ptr<Cell> CreateCell(const std::string& name, const CellOptions& options, Rng& rng) {
  return CellRegistry().Get(name)(options, rng);
}

std::shared_ptr<Model> CreateModel(const std::string& name, const ModelOptions& options) {
  return ModelRegistry().Get(name)(options);
}

}  // namespace stillpoint
