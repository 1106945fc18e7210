// The adjoint solve methods behind SolveAdjoint (internal; solvers/adjoint.cc
// picks one by BackwardOptions::solver, from solvers/adjoint/method_list.h).
//
// The float64 methods share one signature: they start from *w (the initial
// guess, g or a warm start) and iterate the active samples of *samples with
// RunSampleLoop (sample_loop.h), setting each sample's provisional
// termination and iteration count (dense, which does not iterate, sets them
// directly); they fill summary->message, history_bytes, the residual trace
// and any option_usage notes. solvers/adjoint.cc then runs Finalize, which
// measures the true residuals (or takes *final_residual, when a method sets it to
// g - (I - J^T) w of its returned w) and fills the per-sample summary.
#pragma once

#include "solvers/adjoint.h"
#include "solvers/adjoint/operator.h"
#include "solvers/adjoint/sample_loop.h"

namespace stillpoint::adjoint {

// What a float64 method works on.
struct Float64Solve {
  const BackwardOptions& options;
  AdjointOperator* op;
  const RowMatrix& g;
  RowMatrix* w;
  SampleState* samples;
  AdjointSummary* summary;
  // A method that ends knowing g - (I - J^T) w for its returned w stores it
  // here and sets has_final_residual (saves Finalize one VJP).
  RowMatrix* final_residual;
  bool has_final_residual = false;
};

// The float64 methods, one per ON_FLOAT64_ROWS line of
// solvers/adjoint/method_list.h: krylov.cc (SolveGmres,
// SolveConjugateGradient, SolveMinres), neumann.cc (SolveNeumann), dense.cc
// (SolveDense, LU of I - J^T assembled from n VJPs per sample).
#define SP_DECLARE_FLOAT64_ADJOINT_METHOD(value, name, method) void method(Float64Solve* solve);
#define SP_IGNORE_FORWARD_SOLVER(value, name, forward)
SP_ADJOINT_SOLVERS(SP_IGNORE_FORWARD_SOLVER, SP_DECLARE_FLOAT64_ADJOINT_METHOD)
#undef SP_IGNORE_FORWARD_SOLVER
#undef SP_DECLARE_FLOAT64_ADJOINT_METHOD

// forward_solvers.cc: the methods of the ON_FORWARD_SOLVER lines
// (fixed_point, anderson, broyden), which run the forward solver `forward`
// (solvers/fixed_point_solver.h) on the normalised adjoint map, on tensors
// of the state's dtype rather than on float64 rows. Writes the solution
// into *w (started from *w if defined, else g) and fills the per-sample part
// of the summary itself.
void SolveWithFixedPointSolver(const BackwardOptions& options,
                               ForwardSolverType forward,
                               const BatchedVjp& vjp,
                               const Tensor& g,
                               Tensor* w,
                               AdjointSummary* summary);

// SolveAdjoint without its check of the options, for a caller that checked
// them already (SolveImplicit checks its ImplicitOptions once per call).
AdjointSummary SolveWithCheckedOptions(const BackwardOptions& options,
                                       const BatchedVjp& vjp,
                                       const Tensor& g,
                                       Tensor* w);
// SolveAdjointFromStart likewise.
AdjointSummary SolveFromStartWithCheckedOptions(const BackwardOptions& options,
                                                const BatchedVjp& vjp,
                                                const Tensor& g,
                                                Tensor* w);

}  // namespace stillpoint::adjoint
