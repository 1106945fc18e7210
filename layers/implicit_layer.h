// Implicit: a layer whose output is the fixed point z* = f(z*; u) of a cell,
// with gradients through z* by implicit differentiation (or another backward
// mode), as one Module.
//
//   auto layer = std::make_shared<Implicit>(cell, options);   // cell: a Cell
//   Var z_star = layer->Forward(u);                           // z0 = 0
//   ... loss ...; backward(loss);                            // d/dtheta, d/du
//   layer->forward_summary().BriefReport();
//   layer->backward_summary()->BriefReport();                 // after backward
//
// The cell is any map f(z; u) built from differentiable ops:
//   - a Cell (cell.h), or any Module with Forward(z, u) or
//     Forward(z, u, sample_ids) (registered as the child "cell", so its
//     parameters are this layer's "cell.*");
//   - a plain function f(z, u, sample_ids) that captures its parameters.
// Shapes: u [B, ...] (the injection), z0 and z* [B, ...] (the state; by
// default z0 = 0 shaped like u). The cell is called with z [k, ...] and the
// injection rows u[sample_ids] [k, ...] of the k samples a solver is still
// iterating (sample_ids increasing), and must return z's shape and dtype.
// Rows must not interact (no batch statistics).
//
// Forward, backward and what they cost are those of SolveImplicit
// (solvers/implicit_solve.h): the solver runs with the tape off; for the ift and
// jfb modes one evaluation of f at z* is recorded and the adjoint equation
// w = g + J_f(z*)^T w is solved when backward reaches it. The returned Var is
// f(z*) (equal to z* at a fixed point); with the tape off it is z*.
//
// Dropout in a Module cell: every Forward releases the cell's dropout masks
// and freezes fresh ones (dropout.h), so one solve sees one function; they
// stay frozen until the next Forward, so the backward pass (and the phantom
// and unrolled modes, which re-evaluate f) sees that same function.
//
// The summaries describe the last Forward: forward_summary() the solve, and
// backward_summary() the backward pass through its result, filled when that
// backward runs (null when the tape was off; default-initialised until the
// backward has run).
//
// Over an energy layer (energy_layer.h) the user writes only an energy:
//
//   auto layer = std::make_shared<MyEnergy>(...);  // an EnergyLayer<MyContext>
//   Implicit solved(layer, options);               // child "layer"
//   Var z_star = solved.Forward(MyContext{.keys = keys}, z0);  // z0 [B, ...]
//
// The map solved is the layer's Update, evaluated on the unconverged samples
// with the context selected to them (MakeUpdateCell on Bind(layer, ctx)); the layer's Energy is
// handed to the solver as well, so the ceres_lbfgs forward solver minimises
// it directly. Gradients reach the context's members and the layer's
// parameters through the implicit backward; z0 gets none (a fixed point does
// not depend on where the solve started; for fixed-k-step unrolls that do,
// use UnrollUpdates). With EnergyImplicitOptions::trace_energy the energy of
// every sample is recorded along the solve (energy_trace()).
#pragma once

#include <concepts>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "framework/autograd.h"
#include "framework/check.h"
#include "framework/module.h"
#include "framework/option_fields.h"
#include "framework/tensor.h"
#include "layers/cell.h"
#include "layers/energy_layer.h"
#include "solvers/implicit_solve.h"
#include "solvers/solve_tally.h"
#include "solvers/solver_summary.h"

namespace stillpoint {

// Module cells that Implicit accepts: Forward(z, u, sample_ids) (used when
// present) or Forward(z, u), returning a Var.
template <typename M>
concept CellForwardWithIds = requires(M& m, const Var& z, const std::vector<int64_t>& ids) {
  { m.Forward(z, z, ids) } -> std::convertible_to<Var>;
};
template <typename M>
concept CellForwardWithoutIds = requires(M& m, const Var& z) {
  { m.Forward(z, z) } -> std::convertible_to<Var>;
};
// Energy layers are not cells (their Forward solves on its own); they take
// the EnergyLayer constructor below.
template <typename M>
concept ImplicitCellModule =
    std::derived_from<M, Module> && !std::derived_from<M, EnergyLayerBase> &&
    (CellForwardWithIds<M> || CellForwardWithoutIds<M>);

// Options of an Implicit over an energy layer (besides the solver's).
struct EnergyImplicitOptions {
  // Record energy_trace(): after every forward solver iteration, the energy
  // of the latest state the solver evaluated the map at, for each sample
  // evaluated in that iteration, and at the end the energy at the returned
  // state. Cost: one extra batched energy evaluation per iteration and one
  // at the end, off the tape (about what one Update costs for the layers of
  // the catalogue), plus a copy of the evaluated states. Default off.
  bool trace_energy = false;

  // The fields, declared once (framework/option_fields.h); not config keys.
  static const OptionFields<EnergyImplicitOptions>& Fields();
  // Always valid (one flag); declared for ToString and uniformity.
  bool IsValid(std::string* error) const;
  std::string ToString() const;
};

class Implicit : public Module {
 public:
  // f(z, u_rows, sample_ids) -> f(z; u), see above.
  using Function =
      std::function<Var(const Var& z, const Var& u_rows, const std::vector<int64_t>& sample_ids)>;
  // Optional per-sample energy E(z; u) -> [k] with f = z - s grad E (enables
  // the ceres_lbfgs forward solver).
  using EnergyFunction =
      std::function<Var(const Var& z, const Var& u_rows, const std::vector<int64_t>& sample_ids)>;

  explicit Implicit(Function f,
                    const ImplicitOptions& options = {},
                    EnergyFunction energy = nullptr);

  // A Module cell with Forward(z, u, sample_ids) or Forward(z, u).
  template <ImplicitCellModule M>
  explicit Implicit(std::shared_ptr<M> cell, const ImplicitOptions& options = {})
      : Implicit(MakeFunction(cell), std::shared_ptr<Module>(cell), options) {}

  // Solves layer's Update to its fixed point (see above). The layer is
  // registered as the child "layer" (its parameters are "layer.*").
  explicit Implicit(std::shared_ptr<EnergyLayerBase> layer,
                    const ImplicitOptions& options = {},
                    const EnergyImplicitOptions& energy_options = {});

  std::string Name() const override;

  // Energy layers only: the fixed point of the layer's Update for the
  // context ctx (per-sample members with extent B on axis 0), solved from
  // z0 [B, ...] (the layer's state shape; rank >= 2). Returns Update(z*)
  // (equal to z* at a fixed point), shaped like z0. ctx must be the layer's
  // Context (an Error naming the layer and both structs otherwise).
  template <EnergyContextType Context>
  Var Forward(const Context& ctx, const Var& z0) {
    const auto* typed = dynamic_cast<const EnergyLayer<Context>*>(&EnergyLayerOrThrow());
    SP_CHECK(typed != nullptr, "Implicit: ", energy_layer_->Name(), "'s energy reads a ",
             energy_layer_->ContextName(), ", not a ", Context::Fields().name());
    return Forward(Bind(*typed, ctx), z0);
  }
  // The same for the layer already bound to its context (Bind); energy
  // must be bound to this Implicit's layer.
  Var Forward(const BoundEnergyPtr& energy, const Var& z0);

  // u [B, ...] -> f(z*) [B, ...], solved from z0 = 0 of u's shape.
  Var Forward(const Var& u);
  // As above from the given z0 [B, ...] (same B and dtype as u).
  Var Forward(const Var& u, const Tensor& z0);

  const ImplicitOptions& options() const { return options_; }
  // Changing the options between calls is allowed (e.g. more iterations at
  // evaluation time); they are validated at the next Forward.
  ImplicitOptions& mutable_options() { return options_; }

  // The Module cell (null for a plain function; the energy layer for an
  // energy Implicit).
  const std::shared_ptr<Module>& cell() const { return cell_; }
  // The energy layer (null unless built from one).
  const std::shared_ptr<EnergyLayerBase>& energy_layer() const { return energy_layer_; }
  const EnergyImplicitOptions& energy_options() const { return energy_options_; }
  EnergyImplicitOptions& mutable_energy_options() { return energy_options_; }

  // With trace_energy, the last Forward(ctx, z0)'s energies:
  // energy_trace()[b][t] is sample b's energy at the t-th state the solver
  // iterated it through (t = 0: z0, evaluated by the solver's Init), and
  // energy_trace()[b].back() its energy at the returned state. Samples that
  // converge early have shorter traces. The unrolled backward mode runs no
  // solver: its trace holds the returned state's energy only. Empty without
  // trace_energy.
  const std::vector<std::vector<double>>& energy_trace() const { return energy_trace_; }

  // The last Forward's solve (default-initialised before the first).
  const SolverSummary& forward_summary() const { return last_.forward; }
  // Its backward pass; see above.
  std::shared_ptr<const AdjointSummary> backward_summary() const { return last_.backward; }
  // Everything SolveImplicit returned for the last Forward, with z_star's
  // value only (Forward returned it with its graph).
  const ImplicitResult& last_result() const { return last_; }

  // Every solve of this layer since construction or the last TakeTally():
  // each Forward's solve, and each adjoint solve through a result (for a
  // layer nested in another's map, one per VJP of the outer adjoint solve),
  // whatever the summaries above were overwritten with since.
  const ImplicitTally& tally() const { return *tally_; }
  // Returns the tally and starts a new one.
  ImplicitTally TakeTally() const;

  // The previous adjoint solution (used with options().backward.warm_start;
  // checkpoints save and restore it). Runtime state of this layer object,
  // not configuration: every Implicit has its own, so two replicas built
  // from the same options never share one.
  const std::shared_ptr<AdjointWarmStart>& adjoint_warm_start() const {
    return adjoint_warm_start_;
  }

 private:
  Implicit(Function f, std::shared_ptr<Module> cell, const ImplicitOptions& options);
  // The energy layer; an Error when this Implicit solves a cell.
  const EnergyLayerBase& EnergyLayerOrThrow() const;
  // Tallies a Forward's result and keeps it as last_ (z* by value); returns
  // z* with its graph.
  Var KeepResult(ImplicitResult result);

  template <typename M>
  static Function MakeFunction(const std::shared_ptr<M>& cell) {
    SP_CHECK(cell != nullptr, "Implicit: the cell is null");
    return [cell](const Var& z, const Var& u, const std::vector<int64_t>& ids) -> Var {
      if constexpr (CellForwardWithIds<M>) {
        return cell->Forward(z, u, ids);
      } else {
        return cell->Forward(z, u);
      }
    };
  }

  Function f_;
  EnergyFunction energy_;
  std::shared_ptr<Module> cell_;
  std::shared_ptr<EnergyLayerBase> energy_layer_;
  ImplicitOptions options_;
  EnergyImplicitOptions energy_options_;
  // Shared with the adjoint observers of the graphs built (solve_tally.h).
  std::shared_ptr<ImplicitTally> tally_ = std::make_shared<ImplicitTally>();
  ImplicitResult last_;
  std::vector<std::vector<double>> energy_trace_;
  std::shared_ptr<AdjointWarmStart> adjoint_warm_start_ = std::make_shared<AdjointWarmStart>();
};

}  // namespace stillpoint
