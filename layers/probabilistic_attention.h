// Probabilistic attention (Movellan & Gabbur 2020, "Probabilistic
// Transformers"): attention as inference in a Gaussian mixture. Equation
// numbers are the seed's, as docs/seeds.md states them (seed 004).
//
// Every key unit j is a Gaussian over (query, value) pairs,
//   p_j(q, v) = N(q; xi_j, alpha_j^-1 I_d) N(v; mu_j, beta_j^-1 I_dv),
// and query unit i's belief is the mixture p_i = sum_j pi_ij p_j. The output
// value of unit i is the MAP value v_i = argmax_v p_i(q_i, v), found by EM
// (eqs 13-15):
//   w_ij = softmax_j( l_ij(v_i) ),
//   l_ij(v) = log pi_ij + (d/2) log alpha_j - alpha_j/2 |q_i - xi_j|^2
//             + (dv/2) log beta_j - beta_j/2 |v - mu_j|^2,
//   v_i <- sum_j w_ij beta_j mu_j / sum_j w_ij beta_j.
// As an energy layer the state is v [B, H, N, dv] and the energy is
//   E(v) = sum_i -lse_j l_ij(v_i)   (= -log p_i(q_i, v_i) up to a constant),
// which EM never increases. With uniform precisions and the magnitude
// priors pi_ij ∝ exp(alpha/2 |xi_j|^2 + beta/2 |mu_j|^2) (eqs 16-19) the
// weights are softmax_j(alpha q_i.xi_j + beta v_i.mu_j), the update is
// v_i <- sum_j w_ij mu_j, and beta = 0 is standard softmax attention with
// scale alpha (one EM step is then exact). For beta > 0 the fixed point is
// v0 + beta Cov_w[mu] v0 + O(beta^2) (v0 the beta = 0 output).
//
// Layer: q = x W_Q, xi = c W_K, mu = c W_V per head (c = x for
// self-attention), then optionally
//   - online key adaptation (eqs 22-30, AdaptKeys), before value inference;
//   - clamped-value belief propagation (eqs 31-38, PropagateClampedValues):
//     units with known values re-estimate the values (and optionally value
//     precisions and mixing proportions) of the key units;
// then value inference to the fixed point (or fixed EM steps), optional
// overwriting of clamped units' outputs (force_clamped_output; the
// reference implementation does not do it), and out = concat_h(v) W_O.
//
// Shapes: x [B, N, dim], context [B, S, dim] -> [B, N, dim]. The energy
// reads a ProbabilisticContext (below): the logits l_ij without the
// v-dependent part, the values mu and the value precision beta.
//
// Parameters: "log_query_precision" log alpha [H] and "log_value_precision"
// log beta [H] (uniform precisions, learned in log space so that no update
// can make them negative; learnable unless learn_precisions is false; with
// value_precision = 0 there is no value parameter and beta stays exactly 0),
// and the Linears "wq", "wk", "wv", "wo".
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "framework/autograd.h"
#include "framework/option_fields.h"
#include "framework/random.h"
#include "layers/attention.h"
#include "layers/energy_layer.h"
#include "layers/positions.h"
#include "layers/linear.h"

namespace stillpoint {

// ------------------------------------------------- online key adaptation

struct KeyAdaptationOptions {
  // EM iterations over the keys (values marginalised out); 0 = off.
  int iterations = 0;
  // lambda_xi >= 0: precision of the Gaussian prior on each key, centred on
  // the pretrained key (eq 29). 0 gives the soft k-means (ML) update;
  // +infinity freezes the keys.
  double key_prior_precision = 1.0;
  // Reference-code variant: the prior is centred on the current key at each
  // step, so iterating converges to the lambda = 0 point. Not exact MAP-EM.
  bool recentre_prior = false;
  // Re-estimate the key precisions alpha_j with a Gamma(shape, rate) prior
  // (eq 30): alpha_j <- (d sum_i w_ij + 2 (shape - 1)) /
  //                     (sum_i w_ij |q_i - xi_j|^2 + 2 rate).
  // shape >= 1, rate >= 0 (shape 1, rate 0: maximum likelihood).
  bool adapt_precision = false;
  double precision_prior_shape = 1.0;
  double precision_prior_rate = 0.0;

  // model.energy.key_adaptation.* (framework/option_fields.h). The declared
  // range of key_prior_precision is finite (a config value); IsValid also
  // accepts +infinity, the library's frozen keys.
  static const OptionFields<KeyAdaptationOptions>& Fields();
  bool IsValid(std::string* error) const;
  std::string ToString() const;
};

struct KeyAdaptationResult {
  Var keys;           // [B, H, S, d]
  Var key_precision;  // alpha_j, broadcastable to [B, H, S]
  // The log posterior (up to a constant) before the first and after every
  // iteration, summed over samples and heads:
  //   sum_i log sum_j pi_ij N(q_i; xi_j, alpha_j^-1 I)
  //   + sum_j log N(xi_j; xi°_j, lambda^-1 I)     (0 < lambda < inf)
  //   + sum_j (shape - 1) log alpha_j - rate alpha_j   (adapt_precision)
  std::vector<double> log_posterior;
};

// MAP-EM over the keys given the queries (eqs 22-30). The prior over units
// pi_ij = softmax_j(log_prior_ij) is held fixed (exact EM).
//   queries [B, H, N, d], keys (pretrained xi°) [B, H, S, d],
//   key_precision broadcastable to [B, H, S] (each entry > 0),
//   log_prior undefined (uniform) or broadcastable to [B, H, N, S].
// Written with differentiable ops: gradients flow through the iterations.
KeyAdaptationResult AdaptKeys(const Var& queries,
                              const Var& keys,
                              const Var& key_precision,
                              const Var& log_prior,
                              const KeyAdaptationOptions& options);

// --------------------------------------- clamped-value belief propagation

struct ValueBeliefOptions {
  // EM iterations over the value parameters; 0 = off.
  int iterations = 0;
  // lambda_mu >= 0: precision of the Gaussian prior on each value mean,
  // centred on the pretrained value (eqs 35-36). 0: the mean is the
  // weighted mean of the clamped values; +infinity freezes the values.
  double value_prior_precision = 0.0;
  // Re-estimate the value precisions beta_j with a Gamma(shape, rate)
  // prior (eq 37); shape >= 1, rate >= 0.
  bool adapt_value_precision = false;
  double precision_prior_shape = 1.0;
  double precision_prior_rate = 0.0;
  // Re-estimate mixing proportions pi_j (shared by all query units) with a
  // symmetric Dirichlet(concentration) prior (eq 38); concentration >= 1.
  bool adapt_mixing = false;
  double mixing_concentration = 1.0;

  // The fields, declared once (framework/option_fields.h); not config keys.
  static const OptionFields<ValueBeliefOptions>& Fields();
  // The fields' ranges; value_prior_precision may also be +infinity (frozen
  // values).
  bool IsValid(std::string* error) const;
  std::string ToString() const;
};

struct ValueBeliefResult {
  Var values;           // mu [B, H, S, dv]
  Var value_precision;  // beta, broadcastable to [B, H, S]
  // The prior over units to use afterwards: log pi_j as [B, H, 1, S] when
  // adapt_mixing, else the log_prior given (possibly undefined).
  Var log_prior;
  // Before the first and after every iteration, summed over samples and
  // heads (up to a constant):
  //   sum_{i clamped} log sum_j pi_ij N(q_i; xi_j, alpha_j^-1) N(v_i; mu_j, beta_j^-1)
  //   + sum_{i free} log sum_j pi_ij N(q_i; xi_j, alpha_j^-1)
  //   + value-mean, value-precision and Dirichlet log priors (when active).
  std::vector<double> log_posterior;
};

// EM over the value parameters given units with clamped values (eqs 35-38).
//   queries [B, H, N, d], keys [B, H, S, d], key_precision and
//   value_precision broadcastable to [B, H, S] (> 0), values (pretrained
//   mu°) [B, H, S, dv], log_prior as in AdaptKeys, clamped_values
//   [B, H, N, dv] (read where clamped), clamp_mask [B, N] (nonzero =
//   clamped).
ValueBeliefResult PropagateClampedValues(const Var& queries,
                                         const Var& keys,
                                         const Var& key_precision,
                                         const Var& values,
                                         const Var& value_precision,
                                         const Var& log_prior,
                                         const Var& clamped_values,
                                         const Tensor& clamp_mask,
                                         const ValueBeliefOptions& options);

// ------------------------------------------------------------ the layer

struct ProbabilisticAttentionOptions {
  // Model width of x and the context (and of the output).
  int64_t dim = 64;
  int64_t heads = 1;
  // Query/key width d per head; 0 = dim / heads.
  int64_t head_dim = 0;
  // Value width dv per head; 0 = head_dim.
  int64_t value_head_dim = 0;
  // Initial uniform query/key precision alpha; 0 = 1/sqrt(head_dim).
  double query_precision = 0.0;
  // Initial uniform value precision beta (0 = standard attention, kept at
  // 0: beta is learned in log space, which cannot reach 0).
  double value_precision = 0.0;
  bool learn_precisions = true;
  // Contraction c > 0 (uniform value precision): each value mu_j is scaled
  // to mu_j / sqrt(1 + beta |mu_j|^2 / c) before inference, so that
  // beta |mu_j|^2 < c. The EM map v <- sum_j w_j mu_j has the Jacobian
  // beta Cov_w(mu), symmetric positive semidefinite, whose largest
  // eigenvalue is at most its trace, beta sum_j w_j |mu_j - m|^2 <
  // beta max_j |mu_j|^2 < c: with c < 1 the map contracts at every state,
  // whatever beta and the values learn. Without it the value term can
  // outgrow the mixture's spread (beta Cov_w(mu) above 1: the fixed point
  // is a saddle of the energy, and no damping makes it attract). 0: off.
  double contraction = 0.0;
  // pi_ij ∝ exp(alpha_j/2 |xi_j|^2 + beta_j/2 |mu_j|^2) (eq 17).
  bool magnitude_prior = true;
  // Keep (d/2) log alpha_j + (dv/2) log beta_j in the logits when
  // precisions are given per key (the reference code drops them, which is
  // only right for uniform precisions, where they cancel).
  bool log_normalizer = true;
  bool causal = false;
  bool projection_bias = false;
  EnergySolveOptions solve = FixedSteps(20);
  KeyAdaptationOptions key_adaptation;
  ValueBeliefOptions value_belief;
  // Output the clamped value itself at clamped units.
  bool force_clamped_output = false;
  DType dtype = DType::kFloat32;

  // The fields, declared once (framework/option_fields.h); not config keys.
  static const OptionFields<ProbabilisticAttentionOptions>& Fields();
  // The fields' ranges (0 picks head_dim's, value_head_dim's or
  // query_precision's default), dim a multiple of heads when head_dim is 0,
  // and the nested key_adaptation and value_belief options.
  bool IsValid(std::string* error) const;
  std::string ToString() const;
};

// Optional inputs of a forward pass.
struct ProbabilisticAttentionInputs {
  // Per-key precisions [B, H, S] replacing the uniform parameters.
  Var key_precision;
  Var value_precision{};
  // log pi°_ij, broadcastable to [B, H, N, S] (undefined: uniform).
  Var log_prior;
  AttentionMask mask;
  // Rotary positions (positions.h) on the queries and keys, or null. The
  // magnitude prior is unchanged (a rotation keeps the norms).
  const AttentionLayout* positions = nullptr;
  // Clamped-value belief propagation (self-attention, N = S): clamp_mask
  // [B, N] nonzero where unit i's value is known, clamped_values
  // [B, N, H * dv] those values in the per-head value space.
  Tensor clamp_mask;
  Var clamped_values;
};

// What the EM energy reads besides the state v [B, H, N, dv].
struct ProbabilisticContext {
  // [B, H, N, S], per sample: l_ij without the v-dependent part, masks
  // applied.
  Var logits;
  // [B, H, S, dv], per sample: the values mu.
  Var values;
  // The value precision beta: exactly one of the two is defined.
  // [1, H, 1, 1], shared: uniform per head (the layer's parameter).
  Var value_precision;
  // [B, H, 1, S], per sample: per key (given, or adapted by value belief
  // propagation).
  Var value_precision_per_key{};

  // Whichever of the two is defined.
  const Var& ValuePrecision() const {
    return value_precision.defined() ? value_precision : value_precision_per_key;
  }
  static const ContextFields<ProbabilisticContext>& Fields();
};

// What Prepare computes: the energy context (see above), the initial state
// (the beta = 0 answer softmax(l) mu; undefined when Prepare was asked not
// to compute it) and the clamping, if any.
struct ProbabilisticProblem {
  ProbabilisticContext context;
  Var initial_state;   // [B, H, N, dv]
  Var clamped_values;  // [B, H, N, dv] or undefined
  Tensor clamp_mask;   // [B, N] or undefined
  // Diagnostics of the adaptation steps that ran (empty otherwise).
  std::vector<double> key_log_posterior;
  std::vector<double> value_log_posterior;
};

class ProbabilisticAttention : public EnergyLayer<ProbabilisticContext> {
 public:
  ProbabilisticAttention(const ProbabilisticAttentionOptions& options, Rng& rng);

  std::string Name() const override;

  // Self-attention: x [B, N, dim] -> [B, N, dim].
  Var Forward(const Var& x, const ProbabilisticAttentionInputs& inputs = {}) const;
  // Queries from x [B, N, dim], keys and values from context [B, S, dim].
  Var Forward(const Var& x,
              const Var& context,
              const ProbabilisticAttentionInputs& inputs = {}) const;

  // with_initial_state false leaves problem.initial_state undefined, for a
  // solve that starts elsewhere (a warm start); it saves one attention
  // (a softmax over the logits and a product with the values).
  ProbabilisticProblem Prepare(const Var& x,
                               const Var& context,
                               const ProbabilisticAttentionInputs& inputs = {},
                               bool with_initial_state = true) const;
  // Applies force_clamped_output and W_O: v [B, H, N, dv] -> [B, N, dim].
  Var Readout(const Var& v, const ProbabilisticProblem& problem) const;

  // EnergyLayer: v [B, H, N, dv] -> [B].
  Var Energy(const Var& v, const ProbabilisticContext& ctx) const override;
  // EM step (eq 15, or eq 19 for uniform precisions).
  Var Update(const Var& v, const ProbabilisticContext& ctx) const override;
  bool UpdateIsMonotone() const override { return true; }
  // The EM responsibilities w_ij at v: [B, H, N, S].
  Var Responsibilities(const Var& v, const ProbabilisticContext& ctx) const;

  const ProbabilisticAttentionOptions& options() const { return options_; }

  // Inference-time corrections of a trained layer inside a model, whose
  // forward reaches this layer only through its block's Prepare(x, x)
  // (`stillpoint correct`, training/demos/correction_demo.h): while set,
  // every Prepare uses these key-adaptation and value-belief options instead
  // of the layer's own, and these clamps when its inputs carry none. Not part
  // of the layer's parameters or options (never saved).
  struct TestTimeInference {
    KeyAdaptationOptions key_adaptation;
    ValueBeliefOptions value_belief;
    Tensor clamp_mask;   // [B, N] or undefined
    Var clamped_values;  // [B, N, H * dv] with a clamp_mask
  };
  void SetTestTimeInference(const TestTimeInference& inference) const {
    test_time_ = std::make_shared<TestTimeInference>(inference);
  }
  void ClearTestTimeInference() const { test_time_.reset(); }

  // alpha = exp(log alpha) and beta (exp(log beta), or zeros): [H].
  Var query_precision() const;
  Var value_precision() const;

 private:
  Var SplitHeads(const Var& x, int64_t head_width) const;
  // l_ij(v) for the state v: [B, H, N, S].
  Var Logits(const Var& v, const ProbabilisticContext& ctx) const;

  ProbabilisticAttentionOptions options_;
  Var log_query_precision_, log_value_precision_;  // the latter undefined for beta = 0
  std::shared_ptr<Linear> wq_, wk_, wv_, wo_;
  mutable std::shared_ptr<const TestTimeInference> test_time_;  // null: none
};

}  // namespace stillpoint
