// The forward solvers, one line each. Everything that names them by value
// is made from this list, so a solver is its own file plus one line here:
//   - the enum ForwardSolverType (solvers/forward_options.h), in this order;
//   - its names (ToString, StringToForwardSolverType, AllForwardSolverTypes,
//     and through them the YAML key model.solver.forward.type, its
//     did-you-mean and the reports; solvers/forward_options.cc);
//   - the declaration of each factory (solvers/fixed_point_solver.h), which
//     the solver's own .cc defines, and the switch of
//     FixedPointSolver::Create that calls it (solvers/fixed_point_solver.cc).
//
// SP_FORWARD_SOLVERS(X) calls X(value, "name", factory) per solver:
//   value    the enumerator of ForwardSolverType
//   "name"   its spelling in YAML and reports (matched in any letter case)
//   factory  std::unique_ptr<FixedPointSolver> factory(const ForwardSolverOptions&)
//
//   kPicard            damped fixed-point iteration (solvers/picard.cc)
//   kAnderson          Anderson acceleration, type II or I (solvers/anderson.cc)
//   kBroyden           limited-memory Broyden, good or bad (solvers/broyden.cc)
//   kNewtonKrylov      inexact Newton with matrix-free GMRES (solvers/newton_krylov.cc)
//   kCeresLbfgs        ceres::GradientProblemSolver on the energy (solvers/ceres_backends.cc)
//   kCeresTrustRegion  Ceres LM / dogleg on f(z) - z = 0 (solvers/ceres_backends.cc)
//
// A new solver goes at the end: the enum's values keep their numbers.
#pragma once

#define SP_FORWARD_SOLVERS(X)                                 \
  X(kPicard, "picard", CreatePicardSolver)                    \
  X(kAnderson, "anderson", CreateAndersonSolver)              \
  X(kBroyden, "broyden", CreateBroydenSolver)                 \
  X(kNewtonKrylov, "newton_krylov", CreateNewtonKrylovSolver) \
  X(kCeresLbfgs, "ceres_lbfgs", CreateCeresLbfgsSolver)       \
  X(kCeresTrustRegion, "ceres_trust_region", CreateCeresTrustRegionSolver)
