// Options of the backward half of an implicit layer: the backward modes, the
// adjoint linear solvers and BackwardOptions (see solvers/adjoint.h for the
// equation they solve and the stopping rule they share).
#pragma once

#include <string>
#include <vector>

#include "framework/option_fields.h"
#include "solvers/adjoint/method_list.h"
#include "solvers/implicit_solve/mode_list.h"

namespace stillpoint {

// How gradients flow through an implicit layer (solvers/implicit_solve.h): one
// enumerator per line of solvers/implicit_solve/mode_list.h, in its order (see
// there what each does; kIft is the default).
enum class BackwardMode {
#define SP_BACKWARD_MODE_ENUMERATOR(value, name, function, summary) value,
  SP_BACKWARD_MODES(SP_BACKWARD_MODE_ENUMERATOR)
#undef SP_BACKWARD_MODE_ENUMERATOR
};
const char* ToString(BackwardMode mode);
bool StringToBackwardMode(const std::string& text, BackwardMode* mode);
// Every value, in declaration order (for tests and docs).
std::vector<BackwardMode> AllBackwardModes();

// Linear solver for (*) in BackwardMode::kIft: one enumerator per line of
// solvers/adjoint/method_list.h, in its order (see there what each does and
// needs).
enum class AdjointSolverType {
#define SP_ADJOINT_SOLVER_ENUMERATOR(value, name, method) value,
  SP_ADJOINT_SOLVERS(SP_ADJOINT_SOLVER_ENUMERATOR, SP_ADJOINT_SOLVER_ENUMERATOR)
#undef SP_ADJOINT_SOLVER_ENUMERATOR
};
const char* ToString(AdjointSolverType type);
bool StringToAdjointSolverType(const std::string& text, AdjointSolverType* type);
// Every value, in declaration order (for tests and docs).
std::vector<AdjointSolverType> AllAdjointSolverTypes();

struct BackwardOptions {
  BackwardMode mode = BackwardMode::kIft;

  // -- kIft: the adjoint linear solve --
  AdjointSolverType solver = AdjointSolverType::kFixedPoint;
  // Adjoint iterations per sample (each one VJP, Broyden/Anderson safeguard
  // steps excepted). Used by every solver except kNeumann (neumann_terms)
  // and kDense (always n VJPs).
  int max_iterations = 40;
  // Converged when ||g + J^T w - w||_2 <= tolerance * ||g||_2 per sample.
  double tolerance = 1e-6;
  // kGmres: Krylov vectors kept per sample before a restart (memory
  // (gmres_restart + 1) * n float64 values per sample).
  int gmres_restart = 20;
  // kAnderson / kBroyden: history columns (other forward-solver parameters
  // keep the ForwardSolverOptions defaults; the summary lists them).
  int anderson_memory = 5;
  int broyden_memory = 10;
  // kFixedPoint / kAnderson / kBroyden: a sample ends STAGNATED when its
  // relative adjoint residual has not fallen by 0.1% within this many
  // iterations (0 disables; not judged in a fixed budget, tolerance 0).
  int stagnation_window = 10;
  // kNeumann: terms of the series after g (k VJPs). With tolerance 0 every
  // sample gets exactly this many terms (a truncated series), even when its
  // residual reaches 0 in the state's precision before.
  int neumann_terms = 10;
  // kDense: largest state size it accepts (it builds an n x n matrix per
  // sample); beyond it the solve throws stillpoint::Error.
  int dense_max_state_size = 1024;
  // Start each adjoint solve from the previous solution of the same implicit
  // call site instead of from g (kIft only, ignored by kDense). The call site
  // (a layer instance) keeps the previous solution in its own
  // AdjointWarmStart (solvers/implicit_solve.h), which is runtime state and no
  // part of these options; a solution of another shape or dtype is not used.
  bool warm_start = false;

  // -- kPhantom: k damped steps z <- (1 - tau) z + tau f(z) from z* --
  int phantom_steps = 5;
  double phantom_tau = 0.5;  // in (0, 1]

  // -- kUnrolled: k plain steps z <- f(z) from z0 --
  int unrolled_steps = 30;

  // False, with a message naming the field and its value, if any option is
  // out of range (the ranges of Fields()).
  bool IsValid(std::string* error) const;
  // The options as "key: value" lines, for logs.
  std::string ToString() const;

  // Every field, declared once: name, range, meaning, and when it applies
  // (framework/option_fields.h). The config keys model.solver.backward.*
  // and model.attention_solver.backward.* are made from it.
  static const OptionFields<BackwardOptions>& Fields();
};

}  // namespace stillpoint
