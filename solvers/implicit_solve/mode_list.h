// The backward modes of SolveImplicit (BackwardOptions::mode), one line
// each. Everything that names them by value is made from this list, so a
// mode is its own file plus one line here:
//   - the enum BackwardMode (solvers/adjoint/backward_options.h), in this order;
//   - its names (ToString, StringToBackwardMode, AllBackwardModes, and
//     through them the YAML key model.solver.backward.mode, its did-you-mean,
//     the reports and the implicit_<mode> variants of `stillpoint compare`;
//     solvers/adjoint/backward_options.cc);
//   - the declaration of each mode's function (solvers/implicit_solve/modes.h),
//     ImplicitResult implicit::function(const ModeInputs&), defined in the
//     mode's own .cc;
//   - the switch of SolveImplicit that calls it (solvers/implicit_solve.cc).
//
// SP_BACKWARD_MODES(X) calls X(value, "name", function, "summary") per mode:
//   value      the enumerator of BackwardMode
//   "name"     its spelling in YAML and reports (matched in any letter case)
//   function   the mode's function (solvers/implicit_solve/<mode>.cc)
//   "summary"  a few words for the documentation of the key (`stillpoint
//              config --doc`, docs/config.md)
//
//   kIft (the default): exact implicit gradient; solves the adjoint equation
//       with BackwardOptions::solver (solvers/implicit_solve/ift.cc).
//   kJfb: Jacobian-free backward, w = g (as if J = 0). One VJP through f,
//       no linear solve. An approximation that is a descent direction when f
//       is a strong enough contraction (solvers/implicit_solve/ift.cc).
//   kPhantom: phantom gradient. The forward value is k damped steps
//       z <- (1 - tau) z + tau f(z) taken from z* (detached), recorded on the
//       tape; backward is plain backprop through those k steps
//       (solvers/implicit_solve/phantom.cc).
//   kUnrolled: the explicit reference. No solver: the value is k plain steps
//       z <- f(z) from z0, recorded on the tape, and backward differentiates
//       through all of them (memory grows with k; solvers/implicit_solve/unrolled.cc).
//
// A new mode goes at the end: the enum's values keep their numbers.
#pragma once

#define SP_BACKWARD_MODES(X)                                              \
  X(kIft, "ift", SolveIft, "implicit function theorem (default)")         \
  X(kJfb, "jfb", SolveJfb, "Jacobian-free")                               \
  X(kPhantom, "phantom", SolvePhantom, "k damped unrolled steps from z*") \
  X(kUnrolled, "unrolled", SolveUnrolled, "backprop through k forward steps")
