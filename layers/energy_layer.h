// EnergyLayer: attention defined as an energy.
//
// An energy layer maps a state z (one per sample) and a context (the inputs
// the energy depends on: keys, stored patterns, queries, masks) to a scalar
// energy per sample. Its output is a stationary point z* of the energy, found
// by iterating an update map z -> Update(z) whose fixed points are exactly
// the stationary points (a gradient step, or the layer's own CCCP/EM step,
// which never increases the energy). Gradients flow through z* either by
// backpropagating through k unrolled updates or, at a solved fixed point, by
// the implicit function theorem (solvers/implicit_solve.h); both use the same
// Update, so a layer is written once.
//
// Writing a layer: declare its context, the struct of what the energy
// reads (layers/energy_context.h), derive from EnergyLayer<Context> and
// implement Energy(z, ctx). That is enough: EnergyGrad defaults to
// reverse-mode autodiff of Energy (recorded with create_graph, so the
// gradient step is itself differentiable and the implicit backward can take
// vector-Jacobian products through it), and Update defaults to the gradient
// step z - gradient_step() * EnergyGrad(z). Override EnergyGrad for speed (an
// analytic gradient written with differentiable ops) and Update for a
// better-than-gradient step (CCCP, EM).
//
// The solve code is written once for every layer: it works on a
// BoundEnergy, the layer with one batch's context bound to it (Bind), which
// it evaluates on the samples still iterating (BoundEnergy::Select).
//
// Shapes. States are [B, ...] with the sample on axis 0 (rank 2 to 4); the
// energy is [B]. A context holds per-sample members (axis 0 = sample, so a
// solver that iterates only the unconverged samples can select their rows)
// and shared members (used by every sample as they are).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "framework/autograd.h"
#include "framework/check.h"
#include "framework/module.h"
#include "framework/ops.h"
#include "framework/option_fields.h"
#include "framework/tensor.h"
#include "layers/attention.h"
#include "layers/energy_context.h"
#include "solvers/implicit_solve.h"
#include "solvers/solve_tally.h"
#include "solvers/problem.h"

namespace stillpoint {

// How a self-attention energy (keys computed from the state itself) is
// differentiated inside an update.
//   kFull: the true gradient of the energy, including the key-side term;
//          the only choice that is guaranteed to descend the energy.
//   kStop: keys are held fixed inside the update (the query-side term only),
//          as iterated Hopfield/hflayers attention does. Its fixed points are
//          generally not stationary points of one scalar energy.
// Either way the update map itself depends on the state through the keys, so
// the implicit backward differentiates the map that was actually iterated.
enum class KeyGrad { kStop, kFull };
const char* ToString(KeyGrad key_grad);
// Parses "stop" or "full"; returns false on anything else.
bool StringToKeyGrad(const std::string& text, KeyGrad* key_grad);

// How a layer of the catalogue reaches its state.
enum class EnergySolveMode {
  kFixedSteps,  // "fixed_steps": `steps` updates, backpropagated through
  kFixedPoint   // "fixed_point": solved to the fixed point (SolveImplicit)
};
const char* ToString(EnergySolveMode mode);
// Parses "fixed_steps" or "fixed_point"; returns false on anything else.
bool StringToEnergySolveMode(const std::string& text, EnergySolveMode* mode);

struct EnergySolveOptions {
  EnergySolveMode mode = EnergySolveMode::kFixedSteps;
  // Updates in kFixedSteps mode (0: the state is left as initialised).
  int steps = 1;
  // kFixedPoint: the forward solver and the backward mode. The map solved
  // is the layer's Update; the energy is handed to the solver too (so
  // ceres_lbfgs can minimise it directly). For CCCP/gradient-step updates
  // I - J is the Hessian of the energy up to the step, so the symmetric
  // adjoint solvers (cg at minima, minres at saddles) apply.
  ImplicitOptions implicit;
  // Record the energy of every sample along the solve in the report: after
  // every step (fixed steps), or at z0 and z* (fixed point). Costs one
  // energy evaluation per entry, off the tape.
  bool trace_energy = false;

  // The fields, declared once (framework/option_fields.h); not config keys.
  static const OptionFields<EnergySolveOptions>& Fields();
  // The fields' ranges. implicit is not declared (ImplicitOptions has no
  // Fields()): SolveImplicit checks it on each call of the fixed-point mode.
  bool IsValid(std::string* error) const;
  std::string ToString() const;
};

// Fixed-steps options with the given number of steps (for in-class defaults).
inline EnergySolveOptions FixedSteps(int steps) {
  EnergySolveOptions options;
  options.steps = steps;
  return options;
}

// What a solve did (EnergyLayer::last_solve()).
struct EnergySolveReport {
  EnergySolveMode mode = EnergySolveMode::kFixedSteps;
  // Updates taken in kFixedSteps mode.
  int steps = 0;
  // kFixedPoint: the forward summary, and the backward summary once a
  // backward pass has gone through the result (see solvers/implicit_solve.h).
  ImplicitResult implicit;
  // With trace_energy: energies[t][b] as described there.
  std::vector<std::vector<double>> energies;
};

class BoundEnergy;
// An energy layer bound to one batch's context (BoundEnergy, below).
using BoundEnergyPtr = std::shared_ptr<const BoundEnergy>;

// What every energy layer has, whatever its context: the step of the
// default update, its solve's report and runtime state. The solve code holds
// layers by this base; a layer is written as an EnergyLayer<Context>.
class EnergyLayerBase : public Module {
 public:
  // The name of the context struct the energy reads ("HopfieldContext").
  virtual const std::string& ContextName() const = 0;

  // True when Update never increases Energy whatever the state (CCCP and EM
  // updates); a plain gradient step only descends for a small enough step.
  virtual bool UpdateIsMonotone() const { return false; }

  // The step of the default Update. Default 0.1; must be > 0.
  double gradient_step() const { return gradient_step_; }
  void set_gradient_step(double step);

  // What the last Solve did (solver summaries, energies). Not thread safe:
  // one layer object solves on one thread at a time.
  const EnergySolveReport& last_solve() const { return *last_solve_; }
  // The previous adjoint solution of Solve (used with
  // implicit.backward.warm_start): this layer object's own, never shared
  // with another.
  const std::shared_ptr<AdjointWarmStart>& adjoint_warm_start() const {
    return adjoint_warm_start_;
  }
  // Every fixed-point solve of Solve since construction or the last
  // TakeSolveTally(), forward and adjoint (solvers/solve_tally.h); fixed
  // steps are no solve.
  const ImplicitTally& solve_tally() const { return *solve_tally_; }
  ImplicitTally TakeSolveTally() const;

 protected:
  // The body of EnergyLayer<Context>::Solve (layers/energy_solve.cc):
  // SolveEnergy on `energy`, keeping the report and the adjoint warm start.
  Var SolveBound(const BoundEnergyPtr& energy,
                 const Var& z0,
                 const EnergySolveOptions& options) const;

 private:
  double gradient_step_ = 0.1;
  // Diagnostic, shared with the adjoint observers of the graphs built.
  std::shared_ptr<ImplicitTally> solve_tally_ = std::make_shared<ImplicitTally>();
  // Diagnostics written by the const Solve (like a cache, not state).
  std::shared_ptr<EnergySolveReport> last_solve_ = std::make_shared<EnergySolveReport>();
  // Solver state carried from one Solve to the next (runtime state, not
  // configuration, so it is not in EnergySolveOptions).
  std::shared_ptr<AdjointWarmStart> adjoint_warm_start_ = std::make_shared<AdjointWarmStart>();
};

// An energy layer with the context of one batch bound to it: the energy as
// a function of the state alone. This is what the solve code (the cells
// below, SolveEnergy, Implicit, TraceUpdates) works on, whatever the
// layer's context type; Bind makes one. The layer must outlive it.
class BoundEnergy {
 public:
  virtual ~BoundEnergy() = default;
  virtual const EnergyLayerBase& layer() const = 0;
  // The samples of the per-sample members (axis 0), -1 when there are none.
  virtual int64_t batch_size() const = 0;
  // The same energy over the samples `ids` (the context's Select).
  virtual BoundEnergyPtr Select(const std::vector<int64_t>& ids) const = 0;
  // The context's defined members, in declaration order.
  virtual VarList ContextValues() const = 0;
  // "HopfieldContext {keys [2, 1, 3, 4]}" (for error messages).
  virtual std::string DescribeContext() const = 0;
  // The layer's SampleEnergies, EnergyGrad, Update and GradientStep at z.
  virtual Var SampleEnergies(const Var& z) const = 0;
  virtual Var EnergyGrad(const Var& z) const = 0;
  virtual Var Update(const Var& z) const = 0;
  virtual Var GradientStep(const Var& z, double step) const = 0;
};

// Throws an Error naming the layer when `energy` is not [B] for a state z of
// B samples (a scalar, e.g. a sum over the batch, would otherwise be
// accepted and its gradient silently mixed across samples).
void CheckSampleEnergies(const EnergyLayerBase& layer, const Var& z, const Var& energy);
// dE/dz of sample_energies (z -> [B]) by reverse-mode autodiff: see
// AutodiffEnergyGrad.
Var AutodiffStateGrad(const std::function<Var(const Var&)>& sample_energies, const Var& z);

// An energy layer whose energy reads a Context (energy_context.h): the
// struct its block or its caller prepares, e.g. HopfieldContext.
template <EnergyContextType Context>
class EnergyLayer : public EnergyLayerBase {
 public:
  using ContextType = Context;
  const std::string& ContextName() const final { return Context::Fields().name(); }

  // The energy of every sample.
  //   z: [B, ...] state; ctx: per-sample members with extent B on axis 0.
  //   returns [B].
  // Must be written with differentiable ops (the default gradient and the
  // implicit backward differentiate it).
  virtual Var Energy(const Var& z, const Context& ctx) const = 0;

  // Energy with its contract checked (CheckSampleEnergies). The solvers and
  // the default gradient call this.
  Var SampleEnergies(const Var& z, const Context& ctx) const {
    Var energy = Energy(z, ctx);
    CheckSampleEnergies(*this, z, energy);
    return energy;
  }

  // dE/dz, shaped like z. Default: AutodiffEnergyGrad. An override must
  // equal the autodiff gradient (tests compare them) and use differentiable
  // ops, so the update built on it can be differentiated.
  virtual Var EnergyGrad(const Var& z, const Context& ctx) const {
    return AutodiffStateGrad([&](const Var& state) { return SampleEnergies(state, ctx); }, z);
  }

  // The update map, shaped like z. Its fixed points are the stationary
  // points of Energy. Default: GradientStep(z, ctx, gradient_step()).
  virtual Var Update(const Var& z, const Context& ctx) const {
    return GradientStep(z, ctx, gradient_step());
  }

  // z - step * EnergyGrad(z, ctx).
  Var GradientStep(const Var& z, const Context& ctx, double step) const {
    return sub(z, mul_scalar(EnergyGrad(z, ctx), step));
  }

  // SolveEnergy on this layer, keeping the report for last_solve() and its
  // previous adjoint solution in adjoint_warm_start(). The layers of the
  // catalogue call it from Forward.
  Var Solve(const Var& z0, const Context& ctx, const EnergySolveOptions& options) const;
};

// BoundEnergy for a layer reading a Context: holds a copy of the context
// (Vars are handles) and a pointer to the layer.
template <EnergyContextType Context>
class BoundEnergyOf final : public BoundEnergy {
 public:
  // Checks that the per-sample members agree on the samples (an Error
  // naming the layer and its context otherwise).
  BoundEnergyOf(const EnergyLayer<Context>& layer, Context ctx)
      : layer_(&layer),
        ctx_(std::move(ctx)),
        batch_size_(Context::Fields().BatchSize(ctx_, layer.Name())) {}

  const EnergyLayerBase& layer() const override { return *layer_; }
  const Context& context() const { return ctx_; }
  int64_t batch_size() const override { return batch_size_; }
  BoundEnergyPtr Select(const std::vector<int64_t>& ids) const override {
    if (batch_size_ >= 0 && !SelectsEverySample(ids, batch_size_)) {
      CheckSampleIds(ids, batch_size_, layer_->Name());
    }
    return std::make_shared<BoundEnergyOf>(*layer_,
                                           Context::Fields().Select(ctx_, ids, batch_size_),
                                           batch_size_ < 0 ? -1 : static_cast<int64_t>(ids.size()));
  }
  VarList ContextValues() const override { return Context::Fields().Values(ctx_); }
  std::string DescribeContext() const override { return Context::Fields().Describe(ctx_); }
  Var SampleEnergies(const Var& z) const override { return layer_->SampleEnergies(z, ctx_); }
  Var EnergyGrad(const Var& z) const override { return layer_->EnergyGrad(z, ctx_); }
  Var Update(const Var& z) const override { return layer_->Update(z, ctx_); }
  Var GradientStep(const Var& z, double step) const override {
    return layer_->GradientStep(z, ctx_, step);
  }

  // A selection of an already checked context (Select).
  BoundEnergyOf(const EnergyLayer<Context>& layer, Context ctx, int64_t batch_size)
      : layer_(&layer), ctx_(std::move(ctx)), batch_size_(batch_size) {}

 private:
  const EnergyLayer<Context>* layer_;
  Context ctx_;
  int64_t batch_size_;
};

// The layer bound to ctx. ctx must be the layer's own Context type (another
// struct is a compile error).
template <EnergyContextType Context>
BoundEnergyPtr Bind(const EnergyLayer<Context>& layer, std::type_identity_t<Context> ctx) {
  return std::make_shared<BoundEnergyOf<Context>>(layer, std::move(ctx));
}

// The context an energy was bound to, typed (an Error naming the layer when
// it reads another struct).
template <EnergyContextType Context>
const Context& ContextOf(const BoundEnergy& energy) {
  const auto* typed = dynamic_cast<const BoundEnergyOf<Context>*>(&energy);
  SP_CHECK(typed != nullptr, energy.layer().Name(), "'s energy reads a ",
           energy.layer().ContextName(), ", not a ", Context::Fields().name());
  return typed->context();
}

template <EnergyContextType Context>
Var EnergyLayer<Context>::Solve(const Var& z0,
                                const Context& ctx,
                                const EnergySolveOptions& options) const {
  return SolveBound(Bind(*this, ctx), z0, options);
}

// dE/dz by reverse-mode autodiff of layer.Energy. With grad mode on, the
// gradient is recorded (create_graph), so it is a differentiable function of
// z, the context and the parameters. With grad mode off (inside solver
// iterations) the tape is switched on just long enough to differentiate and
// a plain value is returned. A state that does not require grad is
// differentiated through a fresh leaf holding its value.
template <EnergyContextType Context>
Var AutodiffEnergyGrad(const EnergyLayer<Context>& layer,
                       const Var& z,
                       const std::type_identity_t<Context>& ctx) {
  return AutodiffStateGrad([&](const Var& state) { return layer.SampleEnergies(state, ctx); }, z);
}

// ---------------------------------------------------------- driving updates

// A map for the implicit solver (the signature of solvers/implicit_solve.h's
// CellFn): z holds the states of the samples listed in sample_ids, either
// shaped [k, ...state_shape] or flattened [k, n]; the result has z's shape.
// The energy is selected to the same samples. The layer must outlive the
// returned function and every graph recorded through it.
using EnergyCellFn = CellFn;

// state_shape: the shape of one sample's state (without the batch axis).
EnergyCellFn MakeUpdateCell(const BoundEnergyPtr& energy, const Shape& state_shape);
// The same for states shaped like `states` ([B, ...state_shape]).
EnergyCellFn MakeUpdateCellFor(const BoundEnergyPtr& energy, const Tensor& states);
// The same with the plain gradient step z - step * grad E instead of the
// layer's Update (its Jacobian satisfies I - J = step * Hessian).
EnergyCellFn MakeGradientStepCell(const BoundEnergyPtr& energy,
                                  const Shape& state_shape,
                                  double step);
// The per-sample energy and gradient on flattened states, for solvers that
// minimise the energy directly (solvers/problem.h BatchedEnergy).
BatchedEnergy MakeBatchedEnergy(const BoundEnergyPtr& energy, const Shape& state_shape);

// k updates recorded on the tape (the fixed-k-step mode: gradients by
// backpropagation through the unrolled steps). steps = 0 returns z0.
Var UnrollUpdates(const BoundEnergy& energy, const Var& z0, int steps);

// The same on a layer and its context.
template <EnergyContextType Context>
EnergyCellFn MakeUpdateCell(const EnergyLayer<Context>& layer,
                            const std::type_identity_t<Context>& ctx,
                            const Shape& state_shape) {
  return MakeUpdateCell(Bind(layer, ctx), state_shape);
}
template <EnergyContextType Context>
EnergyCellFn MakeGradientStepCell(const EnergyLayer<Context>& layer,
                                  const std::type_identity_t<Context>& ctx,
                                  const Shape& state_shape,
                                  double step) {
  return MakeGradientStepCell(Bind(layer, ctx), state_shape, step);
}
template <EnergyContextType Context>
BatchedEnergy MakeBatchedEnergy(const EnergyLayer<Context>& layer,
                                const std::type_identity_t<Context>& ctx,
                                const Shape& state_shape) {
  return MakeBatchedEnergy(Bind(layer, ctx), state_shape);
}
template <EnergyContextType Context>
Var UnrollUpdates(const EnergyLayer<Context>& layer,
                  const Var& z0,
                  const std::type_identity_t<Context>& ctx,
                  int steps) {
  return UnrollUpdates(*Bind(layer, ctx), z0, steps);
}

// ------------------------------------------------------ attention masks

// The masks of an attention energy over scores [B, H, N, S] (N queries, S
// keys), for a context's per-sample `mask` member: one additive tensor
// [B, 1 or H, N, S] holding -inf where a key is hidden (causal masking,
// key_mask) plus mask.additive; undefined when there is nothing to mask.
// The conventions are those of MultiHeadAttention (attention.h): causal
// hides key j from query i when j > i + (S - N); key_mask is [B, S] or [S];
// additive broadcasts to [B, H, N, S].
Var MakeAttentionMask(const AttentionMask& mask,
                      bool causal,
                      int64_t batch,
                      int64_t heads,
                      int64_t queries,
                      int64_t keys,
                      DType dtype);
// scores + mask when the mask is defined, else scores.
Var ApplyAttentionMask(const Var& scores, const Var& mask);

struct EnergyTraceOptions {
  // Updates to run at most.
  int max_steps = 100;
  // Stop when every sample's step ||z_{t+1} - z_t|| (Euclidean over the
  // whole state) is <= tolerance. 0 runs exactly max_steps updates.
  double tolerance = 0.0;

  // The fields, declared once (framework/option_fields.h); not config keys.
  static const OptionFields<EnergyTraceOptions>& Fields();
  // The fields' ranges.
  bool IsValid(std::string* error) const;
  std::string ToString() const;
};

// The energy along the updates, for tests and diagnostics. Nothing is
// recorded on the tape.
struct EnergyTrace {
  // energies[t][b]: the energy of sample b after t updates (t = 0: z0).
  std::vector<std::vector<double>> energies;
  // step_norms[t][b] = ||z_{t+1} - z_t|| for sample b.
  std::vector<std::vector<double>> step_norms;
  // The state after the last update, shaped like z0.
  Tensor final_state;
  int steps = 0;
  // True when the tolerance was reached.
  bool converged = false;

  // How many (t, b) have energies[t + 1][b] > energies[t][b] + slack.
  int64_t CountIncreases(double slack = 0.0) const;
  // The largest energy increase over all steps and samples (<= 0 when the
  // energy never went up).
  double MaxIncrease() const;
};

EnergyTrace TraceUpdates(const BoundEnergy& energy,
                         const Tensor& z0,
                         const EnergyTraceOptions& options = {});
template <EnergyContextType Context>
EnergyTrace TraceUpdates(const EnergyLayer<Context>& layer,
                         const Tensor& z0,
                         const std::type_identity_t<Context>& ctx,
                         const EnergyTraceOptions& options = {}) {
  return TraceUpdates(*Bind(layer, ctx), z0, options);
}

}  // namespace stillpoint
