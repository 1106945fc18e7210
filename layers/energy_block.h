// EnergyBlock: an energy layer (energy_layer.h) as the attention block of a
// sequence model (ModelKind::kEnergy in models.h).
//
// A block turns the injection u [B, T, d] into an energy problem, and the
// state the problem is solved to back into tokens:
//
//   EnergyBlockProblem p = block.Prepare(u);      // context + initial state
//   Var z = implicit.Forward(p.context, p.initial_state);  // or unrolled
//   Var out = block.Readout(z, p);                // [B, T, d]
//
// where implicit is an Implicit over block.layer() (implicit.h). Prepare
// computes everything the energy depends on from u (keys, stored patterns,
// masks) before the solve, so the energy is one fixed function of the state
// while the solver iterates; gradients reach u and the projections through
// the context.
//
// Built-in blocks (EnergyBlockRegistry()), each with T tokens as the queries
// and keys (self-attention):
//   "hopfield"            HopfieldAttention: stored patterns, values and
//                         state patterns all u; the state starts at the
//                         projected queries xi_0 = u W_Q and follows the CCCP
//                         update; out = u + Readout(xi*) (values and W_O
//                         after the solve). In fixed-point mode the queries
//                         only pick the basin: W_Q gets no gradient there.
//   "probabilistic"       ProbabilisticAttention: queries, keys and values
//                         from u; the state (the values v) starts at the
//                         value_precision = 0 answer and follows EM;
//                         out = u + Readout(v*).
//   "expfam"              ExpFamAttention with the discrete measure: the
//                         stored patterns are u W_K, the tokens eta start at
//                         u and follow the CCCP update eta <- grad G(eta);
//                         out = u + eta*.
//   "energy_transformer"  EnergyTransformerBlock: the tokens start at u and
//                         u drives them as an external current (the
//                         context entry "input"), so the stationary state
//                         depends on u; out = x* (already follows u).
//                         Weights start at the reference N(0, 0.002^2), so
//                         the block starts close to the identity on u
//                         (larger weights made the leaky solve stagnate).
// The residual "u +" is the attention sublayer's skip connection: without
// it every token's fixed point forgets which token it started from.
//
// A user block: derive from EnergyBlock (register the energy layer as a
// child module so its parameters are the block's), then
//   EnergyBlockRegistry().Register("mine", [](const EnergyBlockOptions& o,
//                                             Rng& rng) { ... }, "what it is");
// and set ModelOptions::energy.layer = "mine" (or model.energy.layer).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "framework/autograd.h"
#include "framework/module.h"
#include "framework/random.h"
#include "framework/tensor.h"
#include "layers/energy_layer.h"
#include "layers/energy_transformer.h"
#include "layers/name_registry.h"

namespace stillpoint {

struct EnergyBlockOptions {
  // The block, by EnergyBlockRegistry() name. Default "probabilistic": its
  // energy depends on the queries (every projection learns through the
  // fixed point) and its EM update converges steadily under plain
  // iteration.
  std::string layer = "probabilistic";
  // Token width d (a model sets it from its own dim).
  int64_t dim = 64;
  // Attention heads; dim must be a multiple (head width dim / heads).
  int64_t heads = 4;
  // Initial inverse temperature of the attention, per head: beta of
  // hopfield, expfam (discrete measure) and energy_transformer, the query
  // precision alpha of probabilistic (the same role: scores alpha q.k).
  // Learnable in hopfield, expfam and probabilistic. Small values make the
  // fixed point the average of the stored patterns (energy-models.md §4.6).
  double beta = 1.0;
  // probabilistic: initial value precision (> 0: the values take part in
  // the responsibilities, so EM iterates; 0 would be one-step softmax
  // attention). The EM map contracts while beta_v lambda_max(Cov_w) < 1.
  double value_precision = 0.5;
  // energy_transformer: key-side term of the attention gradient (full: the
  // update descends the energy; stop: keys held fixed inside the update).
  KeyGrad key_grad = KeyGrad::kFull;
  // energy_transformer: leaky (the default; isolated fixed points, as an
  // implicit layer needs) or non-leaky (the reference code's Euler steps:
  // stationary states are not isolated, as g ignores the tokens' mean and
  // scale, so solve it with fixed steps).
  EnergyTransformerDynamics dynamics = EnergyTransformerDynamics::kLeaky;
  // energy_transformer: Hopfield memory type and number of memories.
  EnergyTransformerMemory memory = EnergyTransformerMemory::kRelu2;
  int64_t memories = 64;
  // energy_transformer: Euler step alpha (> 0).
  double step = 0.1;
  // Autoregressive masking of the attention (every block).
  bool causal = false;
  DType dtype = DType::kFloat32;
};

// What Prepare computes from u: the energy's context, the initial state,
// and whatever Readout needs besides the state (by name, in `extras`).
struct EnergyBlockProblem {
  EnergyContext context;
  Var initial_state;
  Var injection;         // u [B, T, d]
  EnergyContext extras;  // e.g. "values" for hopfield
};

class EnergyBlock : public Module {
 public:
  // The energy solved (registered as the child "layer").
  virtual const std::shared_ptr<EnergyLayer>& layer() const = 0;
  // u [B, T, d] -> the problem (see above). Every per-sample context entry
  // has extent B on axis 0; the initial state is [B, ...] (rank >= 2).
  virtual EnergyBlockProblem Prepare(const Var& u) const = 0;
  // The solved state (shaped like problem.initial_state) -> [B, T, d].
  virtual Var Readout(const Var& state, const EnergyBlockProblem& problem) const = 0;
};

using EnergyBlockFactory =
    std::function<std::shared_ptr<EnergyBlock>(const EnergyBlockOptions& options, Rng& rng)>;

// Built-ins: "hopfield", "probabilistic", "expfam", "energy_transformer".
Registry<EnergyBlockFactory>& EnergyBlockRegistry();

// EnergyBlockRegistry().Get(options.layer)(options, rng), after checking
// dim, heads and dim % heads (an Error names the option).
std::shared_ptr<EnergyBlock> CreateEnergyBlock(const EnergyBlockOptions& options, Rng& rng);

}  // namespace stillpoint
