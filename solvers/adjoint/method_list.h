// The adjoint solvers (BackwardOptions::solver, the linear solve of
// BackwardMode::kIft), one line each. Everything that names them by value is
// made from this list, so a method is its own code plus one line here:
//   - the enum AdjointSolverType (solvers/adjoint/backward_options.h), in this order;
//   - its names (ToString, StringToAdjointSolverType, AllAdjointSolverTypes,
//     and through them the YAML key model.solver.backward.solver, its
//     did-you-mean and the reports; solvers/adjoint/backward_options.cc);
//   - the declarations of the float64 methods (solvers/adjoint/methods.h);
//   - the switch of SolveAdjoint that runs each (solvers/adjoint.cc).
//
// SP_ADJOINT_SOLVERS(ON_FORWARD_SOLVER, ON_FLOAT64_ROWS) calls, per solver,
// one of:
//   ON_FORWARD_SOLVER(value, "name", forward)  a forward solver (ForwardSolverType::forward)
//       run on the normalised adjoint map, on tensors of the state's dtype
//       (solvers/adjoint/forward_solvers.cc);
//   ON_FLOAT64_ROWS(value, "name", method)     void adjoint::method(Float64Solve*) on
//       float64 copies of the rows (solvers/adjoint/methods.h);
// value is the enumerator of AdjointSolverType, "name" its spelling in YAML
// and reports (matched in any letter case).
//
//   kFixedPoint ("fixed_point"): w <- g + J^T w, the forward Picard solver
//       (tau = 1) run on the adjoint equation. Converges when the spectral
//       radius of J is below 1.
//   kAnderson: the forward Anderson solver (memory anderson_memory);
//       converges faster and also for mildly expansive J.
//   kBroyden: the forward limited-memory Broyden solver (broyden_memory).
//   kGmres: restarted GMRES on (I - J^T) w = g; any nonsingular I - J.
//   kConjugateGradient ("cg"): conjugate gradient; requires I - J symmetric
//       positive definite (energy maps f = z - s grad E at a minimum of E).
//       A non-positive curvature ends the sample in kLinearAlgebraFailure.
//   kMinres: MINRES; requires I - J symmetric, may be indefinite (energy
//       maps at saddle points).
//   kNeumann: the truncated Neumann series w = sum_{i=0..k} (J^T)^i g, i.e.
//       k = neumann_terms fixed-point steps; a fixed-cost approximation that
//       stops early once the tolerance is met.
//   kDense: assembles J_b^T from n VJPs and solves exactly by LU. For small
//       states (n <= dense_max_state_size); the reference for the others.
//
// A new solver goes at the end: the enum's values keep their numbers.
#pragma once

#define SP_ADJOINT_SOLVERS(ON_FORWARD_SOLVER, ON_FLOAT64_ROWS)      \
  ON_FORWARD_SOLVER(kFixedPoint, "fixed_point", kPicard)            \
  ON_FORWARD_SOLVER(kAnderson, "anderson", kAnderson)               \
  ON_FORWARD_SOLVER(kBroyden, "broyden", kBroyden)                  \
  ON_FLOAT64_ROWS(kGmres, "gmres", SolveGmres)                      \
  ON_FLOAT64_ROWS(kConjugateGradient, "cg", SolveConjugateGradient) \
  ON_FLOAT64_ROWS(kMinres, "minres", SolveMinres)                   \
  ON_FLOAT64_ROWS(kNeumann, "neumann", SolveNeumann)                \
  ON_FLOAT64_ROWS(kDense, "dense", SolveDense)
