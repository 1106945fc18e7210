// The adjoint solve methods behind SolveAdjoint (internal; dispatch.cc picks
// one by BackwardOptions::solver).
//
// The float64 methods share one signature: they start from *w (the initial
// guess, g or a warm start) and iterate the active samples of *samples with
// RunSampleLoop (sample_loop.h), setting each sample's provisional
// termination and iteration count (dense, which does not iterate, sets them
// directly); they fill summary->message, history_bytes, the residual trace
// and any option_usage notes. dispatch.cc then runs Finalize, which measures
// the true residuals (or takes *final_residual, when a method sets it to
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

// krylov.cc: restarted GMRES(m), conjugate gradient and MINRES.
void SolveGmres(Float64Solve* solve);
void SolveConjugateGradient(Float64Solve* solve);
void SolveMinres(Float64Solve* solve);

// neumann.cc: the truncated Neumann series.
void SolveNeumann(Float64Solve* solve);

// dense.cc: LU of I - J^T assembled from n VJPs per sample.
void SolveDense(Float64Solve* solve);

// forward_solvers.cc: fixed_point, anderson and broyden, which run the
// forward fixed-point solvers (solvers/fixed_point_solver.h) on the
// normalised adjoint map, on tensors of the state's dtype rather than on
// float64 rows. Writes the solution into *w (started from *w if defined,
// else g) and fills the per-sample part of the summary itself.
bool UsesForwardSolver(AdjointSolverType type);
void SolveWithFixedPointSolver(const BackwardOptions& options,
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

}  // namespace stillpoint::adjoint
