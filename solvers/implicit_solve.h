// An implicit layer as ONE node of the autodiff graph.
//
//   ImplicitResult r = SolveImplicit(cell, z0, options);
//   Var loss = ...(r.z_star)...;
//   backward(loss);              // parameters and injection get dL/dtheta
//   r.backward->BriefReport();   // what the backward pass did
//
// The cell f maps states to states with differentiable ops; its parameters
// and its input injection are Vars it captures (or gathers by sample id). The
// fixed point z* = f(z*) is found per sample by a forward solver (solvers/
// fixed_point_solver.h), and gradients flow through z* by the mode in
// options.backward (solvers/adjoint.h):
//
//   kIft, kJfb. The solver runs with the tape OFF (NoGrad), so the forward
//     iterations are never recorded and memory does not grow with them. At
//     z* one evaluation f_star = f(z_leaf) is recorded, z_leaf being a fresh
//     leaf holding z*. (With a fixed budget the solver's last evaluation is
//     recorded instead, tape on, and is f_star when z* is bitwise its input:
//     no second evaluation at the same point.) The result is a node
//     "implicit" with value f(z*) and the single input f_star. Its VJP
//     receives g = dL/dz* and returns the adjoint w, solving w = g + J^T w
//     (kIft; each iteration one VJP through f_star, J = df/dz at z*) or
//     w = g (kJfb); the engine then pushes w through f_star into the
//     parameters and the injection (one more VJP). The recorded graph is
//     that of one cell evaluation, whatever the number of forward
//     iterations.
//   kPhantom. After the solve, k damped steps z <- (1 - tau) z + tau f(z)
//     from z* (detached) are recorded; the value is their result.
//   kUnrolled. No solver: k plain steps z <- f(z) from z0 are recorded (the
//     explicit reference; memory grows with k).
// kPhantom and kUnrolled also end in an "implicit" node (it passes g through
// unchanged and fills the backward summary), so every mode reports.
//
// Graph semantics: the node is part of the graph like any op. A second
// backward through it without retain_graph on the first throws
// stillpoint::Error (the recorded f_star was freed); with retain_graph it
// solves again. Under create_graph, w is computed numerically and enters the
// new graph as a constant (second derivatives through the adjoint solve are
// not recorded). With the tape off (NoGrad, inference) SolveImplicit only
// runs the solver and returns z* as a constant; kUnrolled then returns its k
// steps, unrecorded.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "framework/autograd.h"
#include "framework/tensor.h"
#include "solvers/adjoint.h"
#include "solvers/forward_options.h"
#include "solvers/solver_summary.h"

namespace stillpoint {

// The cell: z has shape [k, ...] (the rows of the samples in sample_ids,
// increasing, a subset of 0..B-1); returns f(z), same shape and dtype, built
// from differentiable ops. The cell gathers its own per-sample injection by
// sample_ids. Rows must not interact (no batch statistics): the solvers
// evaluate subsets of samples.
using CellFn = std::function<Var(const Var& z, const std::vector<int64_t>& sample_ids)>;

// Optional energy of the cell: z [k, ...] -> [k], one value E(z_b) per row,
// with f(z) = z - s grad E(z) for some step s > 0. Enables the ceres_lbfgs
// forward solver (which minimises E directly); its gradient comes from the
// tape.
using CellEnergyFn = std::function<Var(const Var& z, const std::vector<int64_t>& sample_ids)>;

// The previous adjoint solution of one implicit call site, for
// BackwardOptions::warm_start: runtime state, not configuration, so it is no
// part of ImplicitOptions. The owner of the call site (an Implicit layer
// instance, an energy layer) keeps one and passes it to every SolveImplicit
// call; each ift backward starts from `solution` when it has the shape
// [B, n] and dtype of the new solve, then stores its own solution there. Not
// thread safe: one call site runs on one thread, and two layer instances
// (data-parallel replicas) each keep their own.
struct AdjointWarmStart {
  Tensor solution;  // [B, n], undefined before the first backward
};

struct ImplicitOptions {
  ForwardSolverOptions forward;
  BackwardOptions backward;
  // Give the forward solvers that use Jacobian-vector products (newton_krylov,
  // ceres_trust_region) exact JVPs from the tape by the double-VJP trick
  // (J v = d/du <J^T u, v>; a transient graph per call). When false they use
  // finite differences (ForwardSolverOptions::jvp_finite_difference_step).
  bool autodiff_jvp = true;
  // Forward iterates to keep for FixedPointCorrectionLoss (solvers/
  // regularizers.h): the latest evaluated state of every sample after
  // iterations spread evenly over the iterations the solve actually ran
  // (the last one included), sampled_iterates of them (fewer if the solve
  // ran fewer iterations). Memory: at most (2 x sampled_iterates + 1) x [B, n]
  // during the solve. 0 keeps none.
  int sampled_iterates = 0;
  // kIft, for an implicit layer nested in another one's map (the inner
  // solve of an energy attention in a DEQ cell): every VJP of the outer
  // adjoint solve passes through this layer's recorded node and solves its
  // adjoint once more, for a right-hand side that changes less and less as
  // the outer adjoint converges. With this on, each of those solves starts
  // from the node's previous solution in the same outer adjoint solve
  // (AdjointSolveScope, solvers/solve_scope.h) instead of from g; the first
  // solve of every outer adjoint solve starts from g, so repeated backward
  // passes give the same gradient. Only a solution that met the tolerance is
  // reused, and a warm-started solve that does not meet it goes through
  // SolveAdjointFromStart (solvers/adjoint.h): solved again from g when g
  // was the better start (the smaller first residual), else kept.
  // Off by default; EnergyAttention turns it on with its warm_start.
  bool nested_adjoint_warm_start = false;
  // kIft: called with the summary of every adjoint solve of this solve's
  // node, once per backward pass through it (for a nested layer, once per
  // VJP of the outer adjoint as well), e.g. to count the adjoint work of
  // an inner solve. Empty: none. It must outlive the graph (capture shared
  // state by value, not a pointer to a layer that may be destroyed first).
  std::function<void(const AdjointSummary&)> adjoint_observer;

  // Checks forward, backward and the fields above; the message names the
  // field.
  bool IsValid(std::string* error) const;
};

struct ImplicitResult {
  // [B, ...] like z0: f(z*) for kIft / kJfb, the last recorded step for
  // kPhantom / kUnrolled, z* when the tape is off.
  Var z_star;
  // The forward solve. For kUnrolled (no solver runs) it describes the k
  // steps: iterations k and the residual ||f(z_k) - z_k|| judged by the
  // forward stopping rule.
  SolverSummary forward;
  // Filled when a backward pass runs through z_star (the same object is
  // overwritten by later passes); null when the tape was off.
  std::shared_ptr<AdjointSummary> backward;
  // The forward iterates kept by ImplicitOptions::sampled_iterates, oldest
  // first, each [B, ...] like z0.
  std::vector<Tensor> sampled_iterates;
};

// Throws stillpoint::Error for invalid options, a z0 that is not [B, ...]
// with B >= 1, or a cell whose output shape or dtype differs from its input.
// z0 is not modified.
//
// explicit_inputs: every Var f reads besides z that gradients should reach
// (the cell's parameters, the injection, an energy's context). With them,
// the ift node also differentiates to second order: under
// grad(..., create_graph) its backward re-evaluates f at z* as a function of
// z* itself, makes the adjoint w = g + J^T w an implicit node of its own (a
// linear fixed point in w, solved by `backward` again when differentiated),
// and returns J_theta(z*)^T w for the explicit inputs, all on the tape, so
// gradient penalties and Hessian-vector products through the layer are
// exact. The first-order backward is unchanged. Without them a create_graph
// backward treats the adjoint and z* as constants (first order exact, second
// order not).
//
// warm_start: the call site's previous adjoint solution (see
// AdjointWarmStart); required when options.backward.warm_start is set
// (stillpoint::Error otherwise), unused when it is not.
ImplicitResult SolveImplicit(const CellFn& f,
                             const Tensor& z0,
                             const ImplicitOptions& options,
                             const CellEnergyFn& energy = nullptr,
                             const VarList& explicit_inputs = {},
                             const std::shared_ptr<AdjointWarmStart>& warm_start = nullptr);

}  // namespace stillpoint
