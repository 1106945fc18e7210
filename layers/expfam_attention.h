// Exponential-family attention (Shim, "A Probabilistic Interpretation of
// Transformers"): attention as the gradient of a log-normaliser.
//
// A token eta (per head, width dh) tilts an intrinsic measure h into the
// exponential family p(x | eta) ∝ h(x) exp(x.eta); its log-partition G(eta)
// is convex with grad G = E_p[x] and Hess G = Cov_p[x]. Three measures:
//
//   discrete  h = sum_s delta(x - x_s), x_s the stored patterns (input):
//             G = (1/beta) lse(beta X eta),  grad G = X^T softmax(beta X eta)
//   gaussian  h = N(mu, Sigma), Sigma = L L^T:
//             G = mu.eta + 1/2 eta^T Sigma eta,  grad G = mu + Sigma eta
//   mixture   h = sum_n pi_n N(mu_n, Sigma) (Prop 2, shared Sigma = L L^T):
//             G = lse_n(log pi_n + mu_n.eta) + 1/2 eta^T Sigma eta,
//             grad G = Sigma eta + sum_n softmax_n(log pi_n + mu_n.eta) mu_n
//             (softmax attention over the means with a log-prior bias, plus
//             a linear skip term).
//
// The energy (per token and head) is E(eta) = 1/2 |eta|^2 - G(eta), whose
// CCCP update eta <- grad G(eta) never increases it. The residual form of the
// attention sublayer, eta <- RN(eta + grad G(eta)), with RN a layer norm or
// nothing, is offered as the other update (no energy guarantee: with the
// Gaussian measure it is normalised power iteration on P (I + Sigma) P, whose
// fixed point is the top eigenvector scaled to norm sqrt(dim)).
//
// Shapes: the state and the input are [B, N, dim]; heads split dim into
// heads x dh and each head has its own measure. Stored patterns (discrete
// measure) are [B, S, dim], projected by W_K unless project_patterns is
// false; the energy's context (ExpFamContext, below) then holds them
// per head, and may hold an attention mask over the scores: a hidden
// pattern drops out of the discrete measure of that query (its
// log-partition sums over the visible patterns only).
//
// Query field (query_field, CCCP update only): the projected queries
// q = x W_Q [B, N, dim] act on the tokens as an external field,
//   E(eta) = 1/2 |eta|^2 - eta.q - G(eta),   eta <- q + grad G(eta),
// so the fixed point keeps the query (for the discrete measure: q plus the
// patterns' mean under softmax(beta X eta)) and W_Q learns through the
// implicit gradient; the context then holds the field q.
//
// Contraction (discrete measure, contraction = c > 0): the Jacobian of the
// CCCP update is beta Cov_p(X), p = softmax(beta X eta), symmetric and
// positive semi-definite with norm at most beta max_s |x_s|^2 (the
// covariance of points of norm at most r has trace at most r^2). Left free,
// training grows |x_s| and beta until this exceeds 1: the energy is no longer
// convex, plain iteration stalls or diverges and the adjoint with it. Each
// head's patterns are therefore rescaled to the norm sqrt(c / beta_h):
// beta Cov_p(X) <= c < 1, the energy is strongly convex (Hessian >= 1 - c),
// the fixed point is unique and plain iteration reaches it at rate c from
// anywhere. The scores beta x_s.eta = sqrt(c beta) u_s.eta (u_s the unit
// pattern) keep their sharpness through eta, i.e. the query field. The
// rescaled patterns are what the context holds.
//
// Parameters: discrete: "beta" [H], and "wk" (Linear) with
// project_patterns; gaussian: "mu" [H, dh], "scale" L [H, dh, dh];
// mixture: "means" [H, K, dh], "log_weights" [H, K] (normalised by a
// log-softmax), "scale" L [H, dh, dh]; with the layer-norm
// renormalisation: "norm" (LayerNorm over dim).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "framework/autograd.h"
#include "framework/option_fields.h"
#include "framework/random.h"
#include "layers/energy_layer.h"
#include "layers/layer_norm.h"
#include "layers/linear.h"

namespace stillpoint {

enum class ExpFamMeasure { kDiscrete, kGaussian, kMixture };
const char* ToString(ExpFamMeasure measure);
// "discrete", "gaussian", "mixture".
bool StringToExpFamMeasure(const std::string& text, ExpFamMeasure* measure);

enum class ExpFamUpdate {
  kCccp,     // "cccp": eta <- grad G(eta), energy descent
  kResidual  // "residual": eta <- RN(eta + grad G(eta)), the attention sublayer
};
const char* ToString(ExpFamUpdate update);
bool StringToExpFamUpdate(const std::string& text, ExpFamUpdate* update);

struct ExpFamAttentionOptions {
  ExpFamMeasure measure = ExpFamMeasure::kDiscrete;
  // Width of the tokens (state and input).
  int64_t dim = 64;
  // Heads; dim must be a multiple. Each head has its own measure.
  int64_t heads = 1;
  // Mixture components K (mixture measure).
  int64_t components = 4;
  // Discrete measure: initial inverse temperature beta of every head.
  double beta = 1.0;
  bool learn_beta = true;
  // Discrete measure: project the stored patterns with W_K (dim -> dim).
  bool project_patterns = true;
  // Discrete measure: c in (0, 1) rescales each head's patterns to the norm
  // sqrt(c / beta_h) (see "Contraction" above), so the CCCP map contracts
  // with factor at most c whatever W_K, beta and the input become; 0 (the
  // default): the patterns as given.
  double contraction = 0.0;
  ExpFamUpdate update = ExpFamUpdate::kResidual;
  // The queries as an external field (see above; needs update = cccp).
  // Registers the query projection "wq" (dim -> dim, no bias).
  bool query_field = false;
  // Residual update: renormalise with a layer norm over dim.
  bool layer_norm = false;
  // The layer norm's epsilon (0 is allowed: exact normalisation).
  double layer_norm_eps = 1e-5;
  // Learn the layer norm's gain and bias.
  bool layer_norm_affine = true;
  // Default: one step, i.e. the one-step attention sublayer.
  EnergySolveOptions solve = FixedSteps(1);
  DType dtype = DType::kFloat32;

  // The fields, declared once (framework/option_fields.h); not config keys.
  static const OptionFields<ExpFamAttentionOptions>& Fields();
  // The fields' ranges (beta is read by the discrete measure only,
  // components by the mixture only: each is checked when read), dim a
  // multiple of heads, and query_field only with the cccp update.
  bool IsValid(std::string* error) const;
  std::string ToString() const;
};

// What the exponential-family energy reads besides the state eta
// [B, N, dim]; every member is per sample.
struct ExpFamContext {
  // [B, N, dim]: the projected queries q = x W_Q (query_field); undefined
  // otherwise.
  Var field{};
  // [B, H, S, dh]: the stored patterns per head (discrete measure only).
  Var patterns{};
  // [B, 1 or H, N, S]: added to the pattern scores, -inf where a pattern is
  // hidden (MakeAttentionMask, energy_layer.h); undefined: no mask.
  Var mask{};

  static const ContextFields<ExpFamContext>& Fields();
};

class ExpFamAttention : public EnergyLayer<ExpFamContext> {
 public:
  ExpFamAttention(const ExpFamAttentionOptions& options, Rng& rng);

  std::string Name() const override;

  // Gaussian and mixture measures: x [B, N, dim] -> [B, N, dim].
  Var Forward(const Var& x) const;
  // Discrete measure: tokens x [B, N, dim] attend to patterns [B, S, dim].
  Var Forward(const Var& x, const Var& patterns) const;

  // The context for a state [B, ...] (patterns: discrete measure only).
  ExpFamContext Prepare(const Var& patterns) const;
  // With query_field: also the field x W_Q of the queries x [B, N, dim].
  ExpFamContext Prepare(const Var& patterns, const Var& queries) const;

  // G(eta) per token and head: eta [B, N, dim] -> [B, H, N].
  Var LogPartition(const Var& eta, const ExpFamContext& ctx) const;
  // grad G(eta) (analytic): [B, N, dim].
  Var LogPartitionGrad(const Var& eta, const ExpFamContext& ctx) const;
  // Discrete measure: the weights softmax(beta X eta) of the patterns,
  // [B, H, N, S].
  Var Weights(const Var& eta, const ExpFamContext& ctx) const;
  // Discrete measure with contraction c > 0: each head's pattern norm
  // sqrt(c / beta_h), [H].
  Var PatternNorm() const;
  // The measure's covariance matrices Sigma = L L^T: [H, dh, dh]
  // (gaussian and mixture measures).
  Var Covariance() const;

  // EnergyLayer: eta [B, N, dim] -> [B].
  Var Energy(const Var& eta, const ExpFamContext& ctx) const override;
  // eta - grad G(eta) (analytic).
  Var EnergyGrad(const Var& eta, const ExpFamContext& ctx) const override;
  // CCCP or residual (options().update).
  Var Update(const Var& eta, const ExpFamContext& ctx) const override;
  bool UpdateIsMonotone() const override { return options_.update == ExpFamUpdate::kCccp; }

  const ExpFamAttentionOptions& options() const { return options_; }
  int64_t head_dim() const { return options_.dim / options_.heads; }

 private:
  // [B, N, dim] <-> [B, H, N, dh].
  Var SplitHeads(const Var& x) const;
  Var MergeHeads(const Var& x) const;
  // eta_h Sigma_h for eta [B, H, N, dh].
  Var TimesCovariance(const Var& eta) const;

  ExpFamAttentionOptions options_;
  Var beta_, mu_, scale_, means_, log_weights_;
  std::shared_ptr<Linear> wk_, wq_;
  std::shared_ptr<LayerNorm> norm_;
};

}  // namespace stillpoint
