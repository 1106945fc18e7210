// The energy block "energy_transformer" (model.energy.layer, model.attention):
// EnergyTransformerBlock: the tokens start at x and x drives them as an external current (the
// context's input), so the stationary state x* depends on x; the solver iterates the
// leaky Euler step with step 1, x <- I - dE/dg (see `step`). readout "attention" (default):
// the block's attention weights at x* applied to values x* W_V, through W_O; "move": x* - x.
// W_Q, W_K start at N(0, 0.09/dim), small enough that the dynamics contract, and beta defaults
// to 4/sqrt(dh), so the scores start at the scale of softmax attention's (energy_block.cc).
// Readout adds the skip connection: out + u.
#include <cmath>
#include <memory>
#include <utility>

#include "framework/check.h"
#include "framework/ops.h"
#include "layers/energy_block_catalogue.h"
#include "layers/energy_block_list.h"
#include "layers/energy_transformer.h"
#include "layers/layer_norm.h"
#include "layers/linear.h"

namespace stillpoint {
namespace {

// The Energy Transformer block's energy layer norm epsilon. Its gain
// 1/sqrt(var + eps) is the slope of g(x) at a token of zero variance, such
// as the zero state an explicit stack starts from; with the reference 1e-5
// (slope 316) the leaky dynamics expand there and neither the inner solve
// nor its adjoint converges. For tokens of unit variance (the block's
// normalised input) 0.1 changes g by 5%.
constexpr double kEnergyLayerNormEps = 0.1;

// The Energy Transformer block's W_Q and W_K start at N(0, (0.3)^2 / d) and
// its default attention inverse temperature is 4 / sqrt(dh). The weights set
// the size of the attention force (the energy has no value matrix, so the
// force carries W_Q W_K^T g): at this scale the leaky dynamics contract and
// the solve converges in about 10 Anderson iterations, while at N(0, 1/d)
// the solves stop at their cap. beta sets the sharpness of the scores
// without changing the force: beta q.k then has about the scale of softmax
// attention's scores at its initialisation (weights uniform in
// +-1/sqrt(d)), 0.36 against 0.33. At the softmax scale 1/sqrt(dh) the
// scores start four times smaller and the routing learns too slowly
// (docs/energy-layers.md, "Operating points").
constexpr double kEnergyTransformerWeightStd = 0.3;
constexpr double kEnergyTransformerBeta = 4.0;

// What the energy_transformer block's Output reads besides the state and the
// context.
struct EnergyTransformerExtras {
  Var start;  // [B, T, d]: the tokens the solve started from (readout move)
};

class EnergyTransformerEnergyBlock
    : public CatalogueBlock<EnergyTransformerBlock, EnergyTransformerExtras> {
 public:
  EnergyTransformerEnergyBlock(const EnergyBlockOptions& o, Rng& rng)
      : CatalogueBlock(
            "EnergyTransformerEnergyBlock",
            o,
            std::make_shared<EnergyTransformerBlock>(
                [&] {
                  EnergyTransformerOptions options;
                  options.dim = o.dim;
                  options.heads = o.heads;
                  options.head_dim = o.dim / o.heads;
                  options.memories = o.memories;
                  options.memory = o.memory;
                  options.beta = o.beta > 0.0 ? o.beta
                                              : kEnergyTransformerBeta /
                                                    std::sqrt(static_cast<double>(o.dim / o.heads));
                  options.causal = o.causal;
                  options.layout = o.layout;
                  // Masks can leave a token only itself to attend
                  // to (the first token under causal), so the self
                  // term stays in the energy with them.
                  options.exclude_self =
                      !o.causal && (!o.layout || o.layout->mask == AttentionMaskKind::kNone);
                  options.key_grad = o.key_grad;
                  options.dynamics = o.dynamics;
                  options.step = o.step;
                  options.weight_std =
                      kEnergyTransformerWeightStd / std::sqrt(static_cast<double>(o.dim));
                  options.layer_norm_eps = kEnergyLayerNormEps;
                  options.dtype = o.dtype;
                  return options;
                }(),
                rng)),
        readout_(o.readout) {
    // The key-side force of the attention energy pulls each token toward
    // the queries that see it, later ones under a causal mask: only the
    // query-side update keeps a token's state independent of later tokens.
    const bool causal = o.causal || (o.layout && o.layout->mask == AttentionMaskKind::kCausal);
    SP_CHECK(!causal || o.key_grad == KeyGrad::kStop,
             "EnergyTransformerEnergyBlock: a causal mask needs key_grad stop (the full "
             "key-side force moves earlier tokens with later queries)");
    if (readout_ == EnergyTransformerReadout::kAttention) {
      const LinearOptions linear{.dtype = o.dtype};
      wv_ = RegisterModule("wv", std::make_shared<Linear>(o.dim, o.dim, rng, linear));
      wo_ = RegisterModule("wo", std::make_shared<Linear>(o.dim, o.dim, rng, linear));
    }
  }

  Problem MakeProblem(const Var& u, bool /*with_initial_state*/) const override {
    const Var x = Input(u);
    Problem problem;
    problem.context = typed_->Prepare(x, Mask(x.dim(1)));
    problem.context.input = x;  // the external current
    problem.initial_state = x;
    problem.injection = u;
    problem.extras.start = x;
    return problem;
  }
  Var Output(const Var& state, const Problem& problem) const override {
    if (readout_ == EnergyTransformerReadout::kMove) return sub(state, problem.extras.start);
    // Values per head, weighted by the attention at x*, and merged back.
    const Var values = typed_->SplitHeads(wv_->Forward(state));
    const Var mixed = matmul(typed_->AttentionWeights(state, problem.context), values);
    return wo_->Forward(typed_->MergeHeads(mixed));
  }
  Var AttentionWeights(const Var& state, const Problem& problem) const override {
    return typed_->AttentionWeights(state, problem.context);
  }

 private:
  EnergyTransformerReadout readout_;
  // The value and output maps of the attention readout: the energy has no
  // value matrix (its attention force carries W_Q W_K^T g), so without them
  // the content a token receives is tied to the bilinear form that routes it.
  std::shared_ptr<Linear> wv_, wo_;
};

}  // namespace

std::shared_ptr<EnergyBlock> CreateEnergyTransformerBlock(const EnergyBlockOptions& options,
                                                          Rng& rng) {
  return std::make_shared<EnergyTransformerEnergyBlock>(options, rng);
}

}  // namespace stillpoint
