// The backward modes of SolveImplicit, one function per mode, and what they
// share (internal to solvers/; the dispatcher is SolveImplicit in
// solvers/implicit_solve.cc). Each mode function receives checked inputs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "framework/autograd.h"
#include "framework/tensor.h"
#include "solvers/implicit_solve.h"

namespace stillpoint::implicit {

// What every mode works on: SolveImplicit's arguments, checked, and the
// problem's sizes.
struct ModeInputs {
  const CellFn& f;
  const Tensor& z0;
  const ImplicitOptions& options;
  const CellEnergyFn& energy;
  const VarList& explicit_inputs;
  // The call site's previous adjoint solution (may be null; see
  // AdjointWarmStart).
  std::shared_ptr<AdjointWarmStart> warm_start;
  Shape shape;  // z0's shape, [B, ...]
  int64_t batch = 0;
  int64_t n = 0;                 // state size per sample
  std::vector<int64_t> all_ids;  // 0..B-1
  bool recording = false;        // the tape was on when SolveImplicit was called
};

// ---- one function per BackwardMode ----
// One per line of solvers/implicit_solve/mode_list.h, each defined in its mode's
// file (unrolled.cc, phantom.cc; ift.cc holds kIft and kJfb, which share one
// recorded evaluation at z* and one "implicit" node whose backward solves the
// adjoint equation (kIft) or passes g through (kJfb)).
#define SP_DECLARE_BACKWARD_MODE(value, name, function, summary) \
  ImplicitResult function(const ModeInputs& in);
SP_BACKWARD_MODES(SP_DECLARE_BACKWARD_MODE)
#undef SP_DECLARE_BACKWARD_MODE

// ---- shared (common.cc) ----

// Gives the solver `value` as the output of its map or VJP: *out is rebound
// to it (no copy; BatchedMap and BatchedVjp allow that) when it has out's
// dtype and size, else it is copied into *out, converting.
void HandOver(const Tensor& value, Tensor* out);

// Evaluates the cell and checks its contract.
Var EvaluateCell(const CellFn& f, const Var& z, const std::vector<int64_t>& ids);

// A recorded cell evaluation f_z = f(z_leaf) over the whole batch, made by
// the forward solve's map (see SolveForward).
struct RecordedEvaluation {
  Var z_leaf;
  Var f_z;
  // The forward solve's ForwardSolveScope id, set by SolveForward whether or
  // not it recorded, so that a mode evaluating f at z* afterwards can do it
  // inside the same scope (a nested solve in f then warm-starts from the
  // solve's last evaluation).
  uint64_t solve_scope = 0;

  // Whether it was recorded at exactly z (every entry bitwise equal).
  bool RecordedAt(const Tensor& z) const;
};

// The forward solve, tape off, into result->forward (and
// result->sampled_iterates). With record_at_solution (kIft and kJfb while
// recording) and a fixed budget, the solver's last evaluation of f is
// recorded, tape on, into *last_recorded: it is f at what is almost always
// the returned z*, so the mode can reuse it instead of evaluating f there
// again. Returns z*, shaped like z0.
Tensor SolveForward(const ModeInputs& in,
                    bool record_at_solution,
                    ImplicitResult* result,
                    RecordedEvaluation* last_recorded);

// Fills a backward summary for a mode that solves no adjoint equation.
void ReportInexact(BackwardMode mode,
                   int steps,
                   int64_t batch,
                   int64_t n,
                   const std::string& message,
                   AdjointSummary* summary);

// Wraps `last` (the recorded steps of kPhantom / kUnrolled) in an "implicit"
// node that passes the gradient through and reports the backward pass.
Var PassThroughNode(const Var& last,
                    BackwardMode mode,
                    int steps,
                    int64_t batch,
                    int64_t n,
                    std::string message,
                    std::shared_ptr<AdjointSummary> summary);

}  // namespace stillpoint::implicit
