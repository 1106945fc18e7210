// The one solve of an energy layer's state (layers/energy_solve.cc): the
// fixed-point solve behind SolveEnergy's kFixedPoint mode, EnergyLayer::Solve
// and Implicit::Forward(ctx, z0), and the fixed-step runs of SolveEnergy.
// BoundEnergy (an energy layer with its context), EnergySolveOptions and
// EnergySolveReport are declared in layers/energy_layer.h.
#pragma once

#include <memory>
#include <type_traits>
#include <vector>

#include "layers/energy_layer.h"
#include "solvers/implicit_solve.h"

namespace stillpoint {

// What the update of `energy` reads besides its state: the context's members
// and the layer's parameters (SolveImplicit's explicit_inputs, which make the
// solve differentiable to second order).
VarList ImplicitInputsOf(const BoundEnergy& energy);

// The one fixed-point solve of an energy layer (behind SolveEnergy's
// kFixedPoint mode and Implicit::Forward(ctx, z0)): the layer's Update
// solved from z0 [B, ...] (rank >= 2) by SolveImplicit, with the layer's
// energy handed to the solver (so ceres_lbfgs can minimise it directly) and
// ImplicitInputsOf as the explicit inputs. warm_start: the call site's
// previous adjoint solution (required with options.backward.warm_start).
// iteration_trace (optional) receives, per sample b, the energy at every
// state the solver iterated it through ([b][0]: z0, evaluated by the
// solver's Init) and, last, at the returned state; samples that converge
// early have shorter traces. Tracing costs one batched energy evaluation
// per iteration and one at the end, off the tape.
ImplicitResult SolveEnergyFixedPoint(const BoundEnergyPtr& energy,
                                     const Tensor& z0,
                                     const ImplicitOptions& options,
                                     const std::shared_ptr<AdjointWarmStart>& warm_start = nullptr,
                                     std::vector<std::vector<double>>* iteration_trace = nullptr);

// Runs the layer's updates from z0 as options say; the result is
// differentiable with respect to the context and the parameters (and, with
// fixed steps, z0; a fixed point does not depend on where the solve
// started). report (optional) receives what happened; warm_start as for
// SolveEnergyFixedPoint (kFixedPoint only).
Var SolveEnergy(const BoundEnergyPtr& energy,
                const Var& z0,
                const EnergySolveOptions& options,
                EnergySolveReport* report = nullptr,
                const std::shared_ptr<AdjointWarmStart>& warm_start = nullptr);
// The same on a layer and its context.
template <EnergyContextType Context>
Var SolveEnergy(const EnergyLayer<Context>& layer,
                const Var& z0,
                const std::type_identity_t<Context>& ctx,
                const EnergySolveOptions& options,
                EnergySolveReport* report = nullptr,
                const std::shared_ptr<AdjointWarmStart>& warm_start = nullptr) {
  return SolveEnergy(Bind(layer, ctx), z0, options, report, warm_start);
}

}  // namespace stillpoint
