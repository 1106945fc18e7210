// The energy block "hopfield" (model.energy.layer, model.attention):
// HopfieldAttention with the query as an external field: E(xi) = |xi|^2/2 - xi.q - lse_beta(K
// xi), CCCP update xi <- q + K^T softmax(beta K xi), from xi_0 = q; out = softmax(beta xi*
// K^T) V W_O. The field keeps the fixed point a function of the query, so routing by position
// survives the solve and W_Q learns through the implicit gradient.
#include <cmath>
#include <memory>
#include <utility>

#include "framework/check.h"
#include "framework/ops.h"
#include "layers/energy_block_catalogue.h"
#include "layers/energy_block_list.h"
#include "layers/hopfield.h"
#include "layers/layer_norm.h"
#include "layers/linear.h"

namespace stillpoint {
namespace {

// What the hopfield block's Output reads besides the state and the context.
struct HopfieldExtras {
  Var values;  // [B, H, T, dv]: the tokens' values per head
};

class HopfieldBlock : public CatalogueBlock<HopfieldAttention, HopfieldExtras> {
 public:
  HopfieldBlock(const EnergyBlockOptions& o, Rng& rng)
      : CatalogueBlock("HopfieldBlock",
                       o,
                       std::make_shared<HopfieldAttention>(
                           HopfieldOptions{.state_size = o.dim,
                                           .heads = o.heads,
                                           .head_dim = o.dim / o.heads,
                                           .beta = ResolvedBeta(o),
                                           .causal = o.causal,
                                           .query_field = true,
                                           .contraction = o.pattern_contraction,
                                           .dtype = o.dtype},
                           rng)) {}

  Problem MakeProblem(const Var& u, bool /*with_initial_state*/) const override {
    const Var x = Input(u);
    HopfieldProblem hopfield = typed_->Prepare(x, x, x, Mask(x.dim(1)));
    if (Rotary()) {
      // Keys and queries (the start and the field) turned by position; the
      // values are not.
      hopfield.context.keys = Rotate(hopfield.context.keys);
      hopfield.initial_state = Rotate(hopfield.initial_state);
      if (hopfield.context.field.defined()) hopfield.context.field = hopfield.initial_state;
    }
    Problem problem;
    problem.context = hopfield.context;
    problem.initial_state = hopfield.initial_state;
    problem.injection = u;
    problem.extras.values = hopfield.values;
    return problem;
  }
  Var Output(const Var& xi, const Problem& problem) const override {
    const HopfieldProblem hopfield{problem.context, problem.initial_state, problem.extras.values};
    return typed_->Readout(xi, hopfield);
  }
  Var AttentionWeights(const Var& xi, const Problem& problem) const override {
    return typed_->Association(xi, problem.context);
  }
};

}  // namespace

std::shared_ptr<EnergyBlock> CreateHopfieldBlock(const EnergyBlockOptions& options, Rng& rng) {
  return std::make_shared<HopfieldBlock>(options, rng);
}

}  // namespace stillpoint
