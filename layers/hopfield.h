// Modern Hopfield attention (Ramsauer et al. 2020), as an energy layer.
//
// Per head h, with stored patterns (keys) K_h = Y W_K,h, [S, dk], and a
// state pattern xi (one per query, dk):
//
//   E(xi)   = 1/2 |xi|^2 - (1/beta_h) lse(beta_h K_h xi + a)       (a: mask)
//   [+ (1/beta_h) ln S + M^2/2, M = max_s |k_s|, with energy_constants]
//   Update:  xi <- K_h^T softmax(beta_h K_h xi + a)                 (CCCP)
//
// The CCCP update equals one gradient step of size 1 on E and never
// increases E. The state starts at the projected queries xi_0 = R W_Q,h;
// after the updates (or at the fixed point xi*) the output reads the values
// with the final association:
//
//   out = concat_h( softmax(beta_h xi K_h^T + a) V_h ) W_O,   V_h = Z W_V,h.
//
// So `solve.steps = 0` is one-step multi-head attention with scale beta_h;
// k steps iterate the retrieval in key space before reading the values (as
// hflayers does with update_steps_max = k). The values are applied once,
// after the solve: they are not part of the energy.
//
// In fixed-point mode the output depends on the queries only through the
// basin the iteration starts in, so W_Q (and the queries) get no gradient
// from the implicit backward (the fixed point does not move when xi_0 does).
// With query_field the queries q = xi_0 also act on the state as an
// external field:
//
//   E(xi)   = 1/2 |xi|^2 - xi.q - (1/beta_h) lse(beta_h K_h xi + a)
//   Update:  xi <- q + K_h^T softmax(beta_h K_h xi + a)            (CCCP)
//
// so the fixed point is a function of the query (q + a retrieved pattern
// mix), the queries and W_Q learn through the implicit gradient, and with
// no stored patterns to retrieve the layer would return q itself. The
// context's field then holds q (HopfieldContext, below).
//
// Shapes: stored Y [B, S, stored_size], state R [B, N, state_size], values
// Z [B, S, value_size] (default: Y) -> [B, N, output_size]. The energy's
// state is xi [B, H, N, dk] and its context (HopfieldContext) the keys
// [B, H, S, dk] and the mask when masks are given. Every query must keep at
// least one key.
//
// Parameters: "beta" [H] (learnable unless learn_beta is false), the
// projections "wq", "wk", "wv", "wo" (Linear, [in, out]), and with
// normalize_stored / normalize_state the LayerNorms "norm_stored",
// "norm_state".
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "framework/autograd.h"
#include "framework/option_fields.h"
#include "framework/random.h"
#include "layers/attention.h"
#include "layers/energy_layer.h"
#include "layers/layer_norm.h"
#include "layers/linear.h"

namespace stillpoint {

struct HopfieldOptions {
  // Width of the state patterns R (the query source).
  int64_t state_size = 64;
  // Width of the stored patterns Y (the key source); 0 = state_size.
  int64_t stored_size = 0;
  // Width of the value source Z; 0 = stored_size.
  int64_t value_size = 0;
  int64_t heads = 1;
  // Query/key width per head; 0 = state_size / heads.
  int64_t head_dim = 0;
  // Value width per head; 0 = head_dim.
  int64_t value_head_dim = 0;
  // Output width; 0 = state_size.
  int64_t output_size = 0;
  // Initial inverse temperature of every head; 0 = 1/sqrt(head_dim). Small
  // beta makes the fixed point the average of the stored patterns (a metastable
  // state); learn it or start it large when iterating to the fixed point.
  double beta = 0.0;
  bool learn_beta = true;
  // LayerNorm on the stored / state patterns before their projections.
  bool normalize_stored = false;
  bool normalize_state = false;
  // Biases on the four projections.
  bool projection_bias = false;
  // Autoregressive masking (query i sees keys j <= i + S - N).
  bool causal = false;
  // Adds Ramsauer's constants (1/beta) ln S + M^2/2 per query, which make
  // 0 <= E <= 2 M^2 once |xi| <= M. They do not change the update. S and M
  // count every stored pattern, masked or not.
  bool energy_constants = false;
  // The queries as an external field on the state (see above).
  bool query_field = false;
  // Contraction c > 0: each head's keys k_j are scaled to
  // k_j / sqrt(1 + |beta| |k_j|^2 / c), so |beta| |k_j|^2 < c. The CCCP map
  // xi <- (q +) K^T softmax(beta K xi) has the Jacobian beta K^T Cov_p K,
  // symmetric, whose eigenvalues are at most |beta| sum_j p_j |k_j - m|^2 <
  // c in modulus: with c < 1 it contracts at every state whatever beta and
  // the projections learn. 0: off.
  double contraction = 0.0;
  // Fixed steps (default 0: one-step attention) or the fixed point.
  EnergySolveOptions solve = FixedSteps(0);
  DType dtype = DType::kFloat32;

  // The fields, declared once (framework/option_fields.h); not config keys.
  static const OptionFields<HopfieldOptions>& Fields();
  // The fields' ranges (0 picks a size's or beta's default), state_size a
  // multiple of heads when head_dim is 0, and solve's fields.
  bool IsValid(std::string* error) const;
  std::string ToString() const;
};

// What the Hopfield energy reads besides the state xi [B, H, N, dk]; every
// member is per sample.
struct HopfieldContext {
  // [B, H, S, dk]: the projected stored patterns (scaled by contraction).
  Var keys;
  // [B, 1 or H, N, S]: added to the scores, -inf where a key is hidden
  // (MakeAttentionMask); undefined when nothing is masked.
  Var mask{};
  // [B, H, N, dk]: the queries as an external field (query_field);
  // undefined otherwise.
  Var field{};

  static const ContextFields<HopfieldContext>& Fields();
};

// What Prepare computes from the inputs: the energy's context, the initial
// state and the per-head values.
struct HopfieldProblem {
  HopfieldContext context;
  Var initial_state;  // xi_0 [B, H, N, dk]
  Var values;         // [B, H, S, dv]
};

class HopfieldAttention : public EnergyLayer<HopfieldContext> {
 public:
  HopfieldAttention(const HopfieldOptions& options, Rng& rng);

  std::string Name() const override;

  // Stored patterns also serve as values.
  Var Forward(const Var& stored, const Var& state, const AttentionMask& mask = {}) const;
  Var Forward(const Var& stored,
              const Var& state,
              const Var& values,
              const AttentionMask& mask = {}) const;

  // The steps of Forward, for tests and for callers that drive the solve.
  HopfieldProblem Prepare(const Var& stored,
                          const Var& state,
                          const Var& values,
                          const AttentionMask& mask = {}) const;
  // xi [B, H, N, dk] -> [B, N, output_size].
  Var Readout(const Var& xi, const HopfieldProblem& problem) const;
  // softmax(beta K xi + a): [B, H, N, S].
  Var Association(const Var& xi, const HopfieldContext& ctx) const;

  // EnergyLayer: xi [B, H, N, dk] -> [B].
  Var Energy(const Var& xi, const HopfieldContext& ctx) const override;
  // xi - [q +] K^T softmax(beta K xi + a) (analytic).
  Var EnergyGrad(const Var& xi, const HopfieldContext& ctx) const override;
  // CCCP: [q +] K^T softmax(beta K xi + a) (hopfield_update, framework/ops_hopfield.h).
  Var Update(const Var& xi, const HopfieldContext& ctx) const override;
  bool UpdateIsMonotone() const override { return true; }

  const HopfieldOptions& options() const { return options_; }
  // How Forward solves (for callers that tighten the backward, such as the
  // trainer's gradient-quality probe).
  EnergySolveOptions& mutable_solve_options() { return options_.solve; }
  // [H]
  const Var& beta() const { return beta_; }
  int64_t heads() const { return options_.heads; }
  int64_t head_dim() const { return options_.head_dim; }
  int64_t value_head_dim() const { return options_.value_head_dim; }

 private:
  // [B, T, H * d] -> [B, H, T, d].
  Var SplitHeads(const Var& x, int64_t head_width) const;
  // beta as [1, H, 1, 1].
  Var Beta4() const;
  // Throws unless xi is [B, H, N, dk] with the keys' batch.
  void CheckState(const Var& xi, const HopfieldContext& ctx) const;
  // beta K xi + a: [B, H, N, S].
  Var Scores(const Var& xi, const HopfieldContext& ctx) const;

  HopfieldOptions options_;
  Var beta_;
  std::shared_ptr<Linear> wq_, wk_, wv_, wo_;
  std::shared_ptr<LayerNorm> norm_stored_, norm_state_;
};

// Hopfield pooling: `quantity` learned state patterns query the input, so a
// set [B, S, stored_size] is pooled into [B, quantity, output_size].
// Parameters: "state_patterns" [quantity, state_size] (init N(0, 0.02^2))
// and the inner layer "hopfield".
class HopfieldPooling : public Module {
 public:
  HopfieldPooling(const HopfieldOptions& options, int64_t quantity, Rng& rng);

  std::string Name() const override;

  // stored [B, S, stored_size] -> [B, quantity, output_size].
  Var Forward(const Var& stored, const AttentionMask& mask = {}) const;

  const std::shared_ptr<HopfieldAttention>& hopfield() const { return hopfield_; }
  const Var& state_patterns() const { return state_patterns_; }

 private:
  std::shared_ptr<HopfieldAttention> hopfield_;
  Var state_patterns_;
};

// Hopfield lookup: the input queries `quantity` learned stored patterns,
// each with a learned target that is read as its value.
// Parameters: "stored_patterns" [quantity, stored_size], "targets"
// [quantity, value_size] (both init N(0, 0.02^2)) and "hopfield".
class HopfieldLookup : public Module {
 public:
  HopfieldLookup(const HopfieldOptions& options, int64_t quantity, Rng& rng);

  std::string Name() const override;

  // state [B, N, state_size] -> [B, N, output_size]. Masks refer to the
  // `quantity` stored patterns as keys.
  Var Forward(const Var& state, const AttentionMask& mask = {}) const;

  const std::shared_ptr<HopfieldAttention>& hopfield() const { return hopfield_; }
  const Var& stored_patterns() const { return stored_patterns_; }
  const Var& targets() const { return targets_; }

 private:
  std::shared_ptr<HopfieldAttention> hopfield_;
  Var stored_patterns_;
  Var targets_;
};

}  // namespace stillpoint
