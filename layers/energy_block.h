// EnergyBlock: an energy layer (energy_layer.h) as the attention block of a
// sequence model (ModelKind::kEnergy in models.h).
//
// A block turns the injection u [B, T, d] into an energy problem, and the
// state the problem is solved to back into tokens:
//
//   EnergyBlockProblemPtr p = block.Prepare(u);   // bound energy + initial state
//   Var z = implicit.Forward(p->energy, p->initial_state);  // or unrolled
//   Var out = block.Readout(z, *p);               // [B, T, d]
//
// where implicit is an Implicit over block.layer() (implicit_layer.h). Prepare
// computes everything the energy depends on from u (keys, stored patterns,
// masks: the layer's context struct) before the solve, so the energy is one
// fixed function of the state while the solver iterates; gradients reach u
// and the projections through the context.
//
// Built-in blocks: layers/energy_block_list.h, one line each; each block's
// file (layers/energy_block_<name>.cc) says what it computes. Each takes
// the T tokens as the queries and keys (self-attention). Every block first
// normalises its input, x = LN(u) (normalize_input, on by default), so its
// operating point does not depend on the scale of the embedding or of the
// state it is given; the projections read x, the skip connection adds u.
// q, k and v are x's projections, per head of width dh = dim / heads, and
// beta is the attention's inverse temperature (0 in the options:
// 1/sqrt(dh)).
//
// A user block: derive from EnergyBlockOf<Layer, Extras> (below), which
// registers the energy layer as the child "layer" and hands the block its
// own typed problem back in Output, then
//   EnergyBlockRegistry().Register("mine", [](const EnergyBlockOptions& o,
//                                             Rng& rng) { ... }, "what it is");
// and set ModelOptions::energy.layer = "mine" (or model.energy.layer), or
// model.attention = mine to make it the attention of a transformer cell.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "framework/autograd.h"
#include "framework/check.h"
#include "framework/module.h"
#include "framework/option_fields.h"
#include "framework/random.h"
#include "framework/tensor.h"
#include "layers/energy_layer.h"
#include "layers/energy_transformer.h"
#include "layers/expfam_attention.h"
#include "layers/name_registry.h"
#include "layers/positions.h"
#include "layers/probabilistic_attention.h"

namespace stillpoint {

// energy_transformer: what the block outputs from the stationary tokens x*.
enum class EnergyTransformerReadout {
  kAttention,  // "attention": the block's attention weights at x* applied to
               // values of x*: softmax(beta Q* K*^T) (x* W_V) W_O
  kMove        // "move": x* - x, the tokens' move (no value map)
};
const char* ToString(EnergyTransformerReadout readout);

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
  // 0 (the default): 1/sqrt(dh), dh = dim / heads, the scale of softmax
  // attention; for expfam 4 (its patterns have norm sqrt(0.5 / beta), so
  // its scores are sqrt(beta / 2) times those of unit patterns), for
  // energy_transformer 4/sqrt(dh) (its W_Q, W_K start smaller). Learnable
  // in hopfield, expfam and probabilistic. Small values make the fixed
  // point the average of the stored patterns (docs/seeds.md D6).
  double beta = 0.0;
  // probabilistic: initial value precision times the head width,
  // beta_v = value_precision / dh (>= 0). The value term of the EM logits
  // then has the scale kappa = beta_v E|mu|^2, about value_precision / 3 at
  // initialisation for normalised inputs, whatever the width: EM iterates
  // (kappa > 0) without snapping each query onto one value by content
  // (kappa above about 2 does, and the model stops routing by position;
  // docs/energy-layers.md). 0 is one-step softmax attention.
  double value_precision = 2.0;
  // probabilistic: the EM map's contraction bound c (ProbabilisticAttention
  // Options::contraction): the values are scaled to beta_v |mu_j|^2 < c, so
  // the map's Jacobian beta_v Cov_w(mu) has every eigenvalue in [0, c) and
  // the fixed point attracts, the fixed-point adjoint converges and the
  // symmetric positive definite I - J admits CG. 0: off (the value term can
  // then outgrow the mixture's spread and the fixed point becomes a saddle).
  double value_contraction = 0.9;
  // hopfield: the same bound for its CCCP map (HopfieldOptions::
  // contraction): the keys are scaled to |beta| |k_j|^2 < c, so the map's
  // Jacobian beta K^T Cov_p K has every eigenvalue below c in modulus. 0: off.
  double pattern_contraction = 0.9;
  // Layer norm of the block's input before its projections (parameters
  // "norm.gain", "norm.bias"): keeps every block at its operating point
  // whatever the scale of the embedding or of the state.
  bool normalize_input = true;
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
  // energy_transformer: Euler step alpha (> 0) of the leaky dynamics, the
  // map the solver iterates. The stationary state does not depend on it;
  // at 1 the map is x <- I - dE/dg(x), which contracts at the block's
  // initialisation (Anderson converges in about 10 iterations), while a
  // small step contracts only by 1 - alpha per iteration and the solves stop
  // at their cap.
  double step = 1.0;
  // energy_transformer: the output read from the stationary tokens x*.
  EnergyTransformerReadout readout = EnergyTransformerReadout::kAttention;
  // probabilistic: online key adaptation (MAP-EM over the keys given the
  // queries, before value inference; probabilistic_attention.h). Off by
  // default (iterations 0).
  KeyAdaptationOptions key_adaptation;
  // expfam: the intrinsic measure (discrete: the tokens' key patterns;
  // gaussian and mixture: learned, with the query as the field) and the
  // mixture's components.
  ExpFamMeasure measure = ExpFamMeasure::kDiscrete;
  int64_t components = 4;
  // probabilistic: biases on the projections W_Q, W_K, W_V, W_O, and whether
  // the precisions alpha and beta_v are learned (false: constants at their
  // initial values, as in bench/SPEC.md W4). Library options, not config keys.
  bool projection_bias = false;
  bool learn_precisions = true;
  // Autoregressive masking of the attention (every block).
  bool causal = false;
  // The model's positions and attention mask (positions.h), or null; shared
  // with the model, which sets its grid width at run time. Each block
  // applies the mask and the ALiBi bias to its attention logits and turns its
  // queries and keys by rotary positions (energy_transformer inside its
  // energy). expfam with the gaussian or mixture measure attends over no
  // tokens: masks and positions do not apply to it. Not a field.
  std::shared_ptr<const AttentionLayout> layout = nullptr;
  DType dtype = DType::kFloat32;

  // model.energy.* (framework/option_fields.h); dim, heads, causal, dtype,
  // projection_bias and learn_precisions are settings for code only. A
  // block-specific field applies when `layer` is its block.
  static const OptionFields<EnergyBlockOptions>& Fields();
  // The fields' ranges and dim a multiple of heads.
  bool IsValid(std::string* error) const;
  std::string ToString() const;
};

// What Prepare computes from u, as the code that solves any block sees it
// (EnergyAttention, the energy model kind, the diagnostics). A block's own
// problem (EnergyBlockOf::Problem) derives from it and adds the typed
// context and what its Output reads besides the state.
struct EnergyBlockProblem {
  virtual ~EnergyBlockProblem() = default;
  // The block's energy layer bound to this batch's context: what is solved.
  BoundEnergyPtr energy;
  // [B, ...] (rank >= 2); undefined from PrepareForWarmStart when the block
  // skips it.
  Var initial_state;
  Var injection;  // u [B, T, d]
};
using EnergyBlockProblemPtr = std::shared_ptr<const EnergyBlockProblem>;

class EnergyBlock : public Module {
 public:
  // The energy solved (registered as the child "layer").
  virtual const std::shared_ptr<EnergyLayerBase>& layer() const = 0;
  // u [B, T, d] -> the problem (see above). Every per-sample context member
  // has extent B on axis 0; the initial state is [B, ...] (rank >= 2).
  virtual EnergyBlockProblemPtr Prepare(const Var& u) const = 0;
  // Prepare for a solve that starts from a state of the caller's (a warm
  // start, energy_attention.h): the same problem, except that
  // initial_state may be left undefined (a block whose initial state costs
  // real work, such as probabilistic's attention, skips it). Default:
  // Prepare.
  virtual EnergyBlockProblemPtr PrepareForWarmStart(const Var& u) const { return Prepare(u); }
  // The attention's output for the solved state (shaped like
  // problem.initial_state), without the skip connection: [B, T, d]. This is
  // what a transformer cell adds to its residual stream. problem must come
  // from this block's Prepare.
  virtual Var Output(const Var& state, const EnergyBlockProblem& problem) const = 0;
  // The block's output with the skip connection: injection + Output.
  Var Readout(const Var& state, const EnergyBlockProblem& problem) const;
  // The attention weights at a state, [B, H, T, S] (rows sum to 1), for the
  // collapse diagnostics (energy_attention.h). Null for a block without
  // attention weights (the default).
  virtual Var AttentionWeights(const Var& state, const EnergyBlockProblem& problem) const;
};

// What a block's Output reads besides the state and the context: nothing.
struct NoExtras {};

// The base of a block whose energy layer is a Layer (an EnergyLayer<Context>)
// and whose Output reads Extras besides the state and the context (a struct
// of Vars: hopfield's values). The block writes three typed functions:
//   MakeProblem(u, with_initial_state)  the context, start and extras;
//   Output(state, problem)              its attention output;
//   AttentionWeights(state, problem)    (optional) the weights at a state;
// and this base binds the energy (EnergyBlockProblem::energy) and hands each
// function the block's own Problem back.
template <typename Layer, typename Extras = NoExtras>
class EnergyBlockOf : public EnergyBlock {
 public:
  using Context = typename Layer::ContextType;
  struct Problem : EnergyBlockProblem {
    Context context;
    Extras extras;
  };

  // Registers layer as the child "layer".
  explicit EnergyBlockOf(std::shared_ptr<Layer> layer) : typed_(layer), layer_(std::move(layer)) {
    SP_CHECK(typed_ != nullptr, "EnergyBlockOf: the energy layer is null");
    RegisterModule("layer", layer_);
  }

  const std::shared_ptr<EnergyLayerBase>& layer() const final { return layer_; }
  EnergyBlockProblemPtr Prepare(const Var& u) const final { return Bound(u, true); }
  EnergyBlockProblemPtr PrepareForWarmStart(const Var& u) const final { return Bound(u, false); }
  Var Output(const Var& state, const EnergyBlockProblem& problem) const final {
    return Output(state, Typed(problem));
  }
  Var AttentionWeights(const Var& state, const EnergyBlockProblem& problem) const final {
    return AttentionWeights(state, Typed(problem));
  }

 protected:
  // u [B, T, d] -> the problem without its energy (this base binds it).
  // with_initial_state false: the initial state may be left undefined.
  virtual Problem MakeProblem(const Var& u, bool with_initial_state) const = 0;
  virtual Var Output(const Var& state, const Problem& problem) const = 0;
  // Default: none (null).
  virtual Var AttentionWeights(const Var& state, const Problem& problem) const { return Var(); }

  // The energy layer with its own type.
  std::shared_ptr<Layer> typed_;

 private:
  EnergyBlockProblemPtr Bound(const Var& u, bool with_initial_state) const {
    auto problem = std::make_shared<Problem>(MakeProblem(u, with_initial_state));
    problem->energy = Bind(*typed_, problem->context);
    return problem;
  }
  const Problem& Typed(const EnergyBlockProblem& problem) const {
    const auto* typed = dynamic_cast<const Problem*>(&problem);
    SP_CHECK(typed != nullptr, Name(), ": the problem was not prepared by a block of its kind");
    return *typed;
  }

  std::shared_ptr<EnergyLayerBase> layer_;
};

using EnergyBlockFactory =
    std::function<std::shared_ptr<EnergyBlock>(const EnergyBlockOptions& options, Rng& rng)>;

// The built-ins of layers/energy_block_list.h, and any block a program
// registers.
Registry<EnergyBlockFactory>& EnergyBlockRegistry();
// The built-in blocks' names in list order, and as "a, b, c" for docs.
const std::vector<std::string>& BuiltinEnergyBlockNames();
std::string BuiltinEnergyBlockList();
// The attention kinds model.attention accepts: "softmax", then every
// registered energy block (the built-ins first, in list order).
std::vector<std::string> AttentionKindNames();

// EnergyBlockRegistry().Get(options.layer)(options, rng), after checking
// dim, heads and dim % heads (an Error names the option).
std::shared_ptr<EnergyBlock> CreateEnergyBlock(const EnergyBlockOptions& options, Rng& rng);

}  // namespace stillpoint
