// The energy block "probabilistic" (model.energy.layer, model.attention):
// ProbabilisticAttention: EM over the values from the value_precision = 0 answer; query
// precision alpha = beta, value precision beta_v = value_precision / dh, both learned in log
// space (positive whatever the optimiser does); out = v* W_O.
#include <cmath>
#include <memory>
#include <utility>

#include "framework/check.h"
#include "framework/ops.h"
#include "layers/energy_block_catalogue.h"
#include "layers/energy_block_list.h"
#include "layers/layer_norm.h"
#include "layers/linear.h"
#include "layers/probabilistic_attention.h"

namespace stillpoint {
namespace {

class ProbabilisticBlock : public CatalogueBlock<ProbabilisticAttention> {
 public:
  ProbabilisticBlock(const EnergyBlockOptions& o, Rng& rng)
      : CatalogueBlock("ProbabilisticBlock",
                       o,
                       std::make_shared<ProbabilisticAttention>(
                           [&] {
                             ProbabilisticAttentionOptions options;
                             options.dim = o.dim;
                             options.heads = o.heads;
                             options.query_precision = ResolvedBeta(o);
                             options.value_precision =
                                 o.value_precision / static_cast<double>(o.dim / o.heads);
                             options.key_adaptation = o.key_adaptation;
                             options.projection_bias = o.projection_bias;
                             options.learn_precisions = o.learn_precisions;
                             options.contraction = o.value_contraction;
                             options.causal = o.causal;
                             options.dtype = o.dtype;
                             return options;
                           }(),
                           rng)) {}

  Problem MakeProblem(const Var& u, bool with_initial_state) const override {
    const Var x = Input(u);
    ProbabilisticProblem p = typed_->Prepare(x, x, Inputs(x.dim(1)), with_initial_state);
    Problem problem;
    problem.context = p.context;
    problem.initial_state = p.initial_state;
    problem.injection = u;
    return problem;
  }
  Var Output(const Var& v, const Problem& problem) const override {
    ProbabilisticProblem p;
    p.context = problem.context;
    p.initial_state = problem.initial_state;
    return typed_->Readout(v, p);
  }
  Var AttentionWeights(const Var& v, const Problem& problem) const override {
    return typed_->Responsibilities(v, problem.context);
  }

 private:
  ProbabilisticAttentionInputs Inputs(int64_t length) const {
    ProbabilisticAttentionInputs inputs;
    inputs.mask = Mask(length);
    inputs.positions = layout_.get();
    return inputs;
  }
};

}  // namespace

std::shared_ptr<EnergyBlock> CreateProbabilisticBlock(const EnergyBlockOptions& options, Rng& rng) {
  return std::make_shared<ProbabilisticBlock>(options, rng);
}

}  // namespace stillpoint
