// The energy block "expfam" (model.energy.layer, model.attention):
// ExpFamAttention, discrete measure over the patterns k = x W_K with the query q = x W_Q as an
// external field: eta <- q + grad G(eta) from eta_0 = q; out = grad G(eta*) W_O (the patterns'
// softmax-weighted mean at the fixed point, through an output projection "wo"). Each head's
// patterns are rescaled to the norm sqrt(c / beta), c = 0.5
// (ExpFamAttentionOptions::contraction), so the update contracts with factor at most 0.5
// however training moves W_K and beta (unrescaled, the trained map expanded: spectral radius
// 1.2-3.5, and neither the solve nor its adjoint converged); beta starts at 4 and W_O reads
// sqrt(dh) times the mean of the unit patterns.
#include <cmath>
#include <memory>
#include <utility>

#include "framework/check.h"
#include "framework/ops.h"
#include "layers/energy_block_catalogue.h"
#include "layers/energy_block_list.h"
#include "layers/expfam_attention.h"
#include "layers/layer_norm.h"
#include "layers/linear.h"

namespace stillpoint {
namespace {

// The expfam block (discrete measure): each head's patterns are rescaled to
// the norm sqrt(c / beta), so its CCCP map contracts with factor at most c
// (ExpFamAttentionOptions::contraction) whatever W_K, beta and the input
// learn. Its scores are then sqrt(c beta) u_s.eta (u_s the unit patterns):
// the default beta makes c beta = 2, scores sqrt(2) u_s.eta, which depend on
// the width as softmax attention's q.k / sqrt(dh) do for unit-variance
// tokens (docs/energy-layers.md, "Operating points", has the measurements
// behind c and beta).
constexpr double kExpFamContraction = 0.5;
constexpr double kExpFamScoreScaleSquared = 2.0;

// The expfam block's contraction: kExpFamContraction for the discrete
// measure (the learned measures have no patterns to rescale).
double ExpFamContraction(const EnergyBlockOptions& o) {
  return o.measure == ExpFamMeasure::kDiscrete ? kExpFamContraction : 0.0;
}

// The expfam block's beta: 2 / c (scores sqrt(2) u_s.eta) when beta is 0,
// else beta.
double ExpFamBeta(const EnergyBlockOptions& o) {
  return o.beta > 0.0 ? o.beta : kExpFamScoreScaleSquared / kExpFamContraction;
}

class ExpFamBlock : public CatalogueBlock<ExpFamAttention> {
 public:
  ExpFamBlock(const EnergyBlockOptions& o, Rng& rng)
      : CatalogueBlock("ExpFamBlock",
                       o,
                       std::make_shared<ExpFamAttention>(
                           ExpFamAttentionOptions{.measure = o.measure,
                                                  .dim = o.dim,
                                                  .heads = o.heads,
                                                  .components = o.components,
                                                  .beta = ExpFamBeta(o),
                                                  .contraction = ExpFamContraction(o),
                                                  .update = ExpFamUpdate::kCccp,
                                                  .query_field = true,
                                                  .dtype = o.dtype},
                           rng)) {
    wo_ = RegisterModule(
        "wo", std::make_shared<Linear>(o.dim, o.dim, rng, LinearOptions{.dtype = o.dtype}));
  }

  Problem MakeProblem(const Var& u, bool /*with_initial_state*/) const override {
    const Var x = Input(u);
    const bool discrete = typed_->options().measure == ExpFamMeasure::kDiscrete;
    Problem problem;
    problem.context = typed_->Prepare(discrete ? x : Var(), x);
    ExpFamContext& context = problem.context;
    if (discrete) {
      // The gaussian and mixture measures attend over no tokens: a token's
      // fixed point depends on that token alone, so there is nothing to mask
      // or to place.
      const int64_t length = x.dim(1);
      context.mask =
          MakeAttentionMask(Mask(length), causal_, x.dim(0), heads_, length, length, dtype_);
      if (Rotary()) {
        context.patterns = Rotate(context.patterns);
        context.field = ApplyRotaryMerged(context.field, *layout_, heads_);
      }
    }
    problem.initial_state = context.field;
    problem.injection = u;
    return problem;
  }
  Var Output(const Var& eta, const Problem& problem) const override {
    Var mean = typed_->LogPartitionGrad(eta, problem.context);
    if (typed_->options().contraction > 0.0) {
      // grad G is the mean of patterns of norm sqrt(c / beta), small by
      // design; W_O reads it at the scale of a unit-variance token instead,
      // sqrt(dh) times the mean of the unit patterns.
      const int64_t heads = typed_->options().heads, dh = typed_->head_dim();
      Var scale =
          mul_scalar(rdiv_scalar(1.0, typed_->PatternNorm()), std::sqrt(static_cast<double>(dh)));
      Var split = reshape(mean, Shape{mean.dim(0), mean.dim(1), heads, dh});
      mean = reshape(mul(split, reshape(scale, Shape{1, 1, heads, 1})), mean.shape());
    }
    return wo_->Forward(mean);
  }
  Var AttentionWeights(const Var& eta, const Problem& problem) const override {
    // Only the discrete measure attends over tokens.
    if (typed_->options().measure != ExpFamMeasure::kDiscrete) return Var();
    return typed_->Weights(eta, problem.context);
  }

 private:
  // The patterns are keys and content at once (grad G is their weighted
  // mean); the output projection lets the content read out differ from the
  // address, as W_V W_O does for the other blocks.
  std::shared_ptr<Linear> wo_;
};

}  // namespace

std::shared_ptr<EnergyBlock> CreateExpFamBlock(const EnergyBlockOptions& options, Rng& rng) {
  return std::make_shared<ExpFamBlock>(options, rng);
}

}  // namespace stillpoint
