// Energy Transformer block (Hoover et al., NeurIPS 2023): tokens descend one
// energy made of an attention term and a Hopfield memory term, both
// functions of the layer-normalised tokens g = EnergyLayerNorm(x).
//
//   g_A    = gamma (x_A - mean(x_A)) / sqrt(var(x_A) + eps) + delta
//            (gamma a scalar, delta [D]); g = grad L of the convex
//            Lagrangian L(x) = D gamma sqrt(var(x) + eps) + delta.x.
//   E_LN   = sum_A (g_A.x_A - L(x_A))                       (Legendre)
//   E_ATT  = -sum_h (1/beta_h) sum_C log sum_{B != C} exp(beta_h K_hB.Q_hC),
//            Q_hC = W^Q_h g_C, K_hB = W^K_h g_B (no value matrix);
//            exclude_self = false keeps B = C in the sum (as the reference
//            code does; the paper excludes it).
//   E_HN   = -1/2 sum_B sum_mu relu(xi_mu.g_B)^2            (relu2 memory)
//         or -(1/beta_m) sum_B lse(beta_m Xi g_B)           (softmax memory)
//
//   -dE_ATT/dg_A = sum_h [sum_C P_h(A, C) W^Q_h^T K_hC + sum_C P_h(C, A) W^K_h^T Q_hC]
// with P_h(C, .) the softmax over keys B of query C. The first term is
// ordinary (query-side) attention; the second, the key-side term, is what
// makes the update descend the energy. key_grad = stop drops it (keys held
// fixed inside the update; no energy guarantee).
//
// Dynamics (Euler steps of tau dx/dt = ..., step alpha), chosen explicitly:
//   non-leaky (the reference code): x <- x - alpha dE/dg,
//             Lyapunov function E = E_ATT + E_HN;
//   leaky (HAMUX):                  x <- x - alpha (x + dE/dg),
//             Lyapunov function E = E_LN + E_ATT + E_HN.
// Energy() returns the Lyapunov function of the chosen dynamics. The flow
// decreases it for any step; Euler steps need a small enough alpha.
//
// External current (optional): the context's input I [B, N, D] drives
// the tokens, as the input current of a Hopfield network:
//   x <- x - alpha (dE/dg - I)   or   x <- x - alpha (x + dE/dg - I),
// and the Lyapunov function gains -sum_A I_A.g_A (its x-gradient is
// (dg/dx)(... - I) because dg/dx is symmetric). Without it the stationary
// states do not depend on the tokens the dynamics start from; with it they
// follow I (for small weights the leaky fixed point is near I).
//
// Shapes: tokens x [B, N, D] -> [B, N, D] (the tokens after T steps, or at
// the fixed point). Masks (AttentionMask, causal) hide keys as in
// MultiHeadAttention; every query must keep at least one key (N >= 2 with
// exclude_self).
//
// Parameters: "gamma" [1], "delta" [D], "wq" and "wk" [D, H * Y] (so
// Q = g W_Q, per head the columns [h Y, (h + 1) Y)), "beta" [H], and
// "memories" Xi [M, D].
#pragma once

#include <cstdint>
#include <string>

#include "framework/autograd.h"
#include "framework/option_fields.h"
#include "framework/random.h"
#include "layers/attention.h"
#include "layers/energy_layer.h"
#include "layers/positions.h"

namespace stillpoint {

enum class EnergyTransformerMemory {
  kRelu2,   // "relu2": -1/2 sum relu(xi.g)^2
  kSoftmax  // "softmax": -(1/beta_m) lse(beta_m Xi g)
};
const char* ToString(EnergyTransformerMemory memory);
bool StringToEnergyTransformerMemory(const std::string& text, EnergyTransformerMemory* memory);

enum class EnergyTransformerDynamics {
  kNonLeaky,  // "non_leaky": x <- x - alpha dE/dg
  kLeaky      // "leaky":     x <- x - alpha (x + dE/dg)
};
const char* ToString(EnergyTransformerDynamics dynamics);
bool StringToEnergyTransformerDynamics(const std::string& text,
                                       EnergyTransformerDynamics* dynamics);

struct EnergyTransformerOptions {
  // Token width D.
  int64_t dim = 64;
  int64_t heads = 4;
  // Query/key width Y per head.
  int64_t head_dim = 16;
  // Hopfield memories M (the paper uses 4 D).
  int64_t memories = 256;
  EnergyTransformerMemory memory = EnergyTransformerMemory::kRelu2;
  // Inverse temperature of the softmax memory.
  double memory_beta = 1.0;
  // Initial attention inverse temperature of every head; 0 = 1/sqrt(head_dim).
  double beta = 0.0;
  bool learn_beta = false;
  // Drop B = C from the attention energy (the paper); false keeps it (the
  // reference code).
  bool exclude_self = true;
  bool causal = false;
  // Positions and mask (positions.h) of the model, or null: its rotary
  // positions turn the queries and keys inside the energy (and its analytic
  // gradient); its mask and ALiBi bias come with Prepare's mask. Not a field.
  std::shared_ptr<const AttentionLayout> layout = nullptr;
  KeyGrad key_grad = KeyGrad::kFull;
  EnergyTransformerDynamics dynamics = EnergyTransformerDynamics::kNonLeaky;
  // Euler step alpha (> 0).
  double step = 0.1;
  // Epsilon of the energy layer norm.
  double layer_norm_eps = 1e-5;
  // Initial weights: W_Q, W_K ~ N(0, weight_std^2), memories ~ N(0, memory_std^2).
  double weight_std = 0.002;
  double memory_std = 0.02;
  // T steps (default 12) or the fixed point.
  EnergySolveOptions solve = FixedSteps(12);
  DType dtype = DType::kFloat32;

  // The fields, declared once (framework/option_fields.h); not config keys.
  static const OptionFields<EnergyTransformerOptions>& Fields();
  // The fields' ranges (beta 0: 1/sqrt(head_dim)).
  bool IsValid(std::string* error) const;
  std::string ToString() const;
};

// What the Energy Transformer's energy reads besides the tokens x
// [B, N, D]; every member is per sample.
struct EnergyTransformerContext {
  // [B, 1 or H, N, N]: added to the attention scores, -inf where a token is
  // hidden (exclude_self, causal, the caller's mask; MakeAttentionMask);
  // undefined when nothing is masked.
  Var mask{};
  // [B, N, D]: an external current I, adding -sum_A I_A.g_A to the energy
  // (the energy block sets it to its input); undefined: none.
  Var input{};

  static const ContextFields<EnergyTransformerContext>& Fields();
};

class EnergyTransformerBlock : public EnergyLayer<EnergyTransformerContext> {
 public:
  EnergyTransformerBlock(const EnergyTransformerOptions& options, Rng& rng);

  std::string Name() const override;

  // x [B, N, D] -> [B, N, D].
  Var Forward(const Var& x, const AttentionMask& mask = {}) const;
  // The context of tokens [B, N, D]: the attention mask (exclude_self,
  // causal, mask), if any; no input current.
  EnergyTransformerContext Prepare(const Var& x, const AttentionMask& mask = {}) const;

  // The pieces, for tests and diagnostics. x, g: [B, N, D]; energies [B].
  Var Normalize(const Var& x) const;        // g
  Var Lagrangian(const Var& x) const;       // sum_A L(x_A)
  Var LayerNormEnergy(const Var& x) const;  // E_LN
  Var AttentionEnergy(const Var& g, const EnergyTransformerContext& ctx) const;
  Var MemoryEnergy(const Var& g) const;
  // dE_ATT/dg (both terms, or the query-side term with key_grad = stop).
  Var AttentionEnergyGrad(const Var& g, const EnergyTransformerContext& ctx) const;
  // g W [B, N, dim] -> heads [B, H, N, dh], rotated by the layout's rotary
  // positions; UnrotateMerge applies the transposed rotation and merges.
  Var Project(const Var& g, const Var& weight) const;
  Var UnrotateMerge(const Var& x) const;
  Var MemoryEnergyGrad(const Var& g) const;
  // The attention weights P_h at tokens x: [B, H, N, N].
  Var AttentionWeights(const Var& x, const EnergyTransformerContext& ctx) const;

  // EnergyLayer: the Lyapunov function of the chosen dynamics, x [B, N, D] -> [B].
  Var Energy(const Var& x, const EnergyTransformerContext& ctx) const override;
  // One Euler step of the chosen dynamics.
  Var Update(const Var& x, const EnergyTransformerContext& ctx) const override;

  const EnergyTransformerOptions& options() const { return options_; }

  // [B, N, H * Y] -> [B, H, N, Y] and back (Y = head_dim).
  Var SplitHeads(const Var& x) const;
  Var MergeHeads(const Var& x) const;

 private:
  // beta Q K^T + mask: [B, H, N, N].
  Var Scores(const Var& q, const Var& k, const EnergyTransformerContext& ctx) const;

  EnergyTransformerOptions options_;
  Var gamma_, delta_, wq_, wk_, beta_, memories_;
};

}  // namespace stillpoint
