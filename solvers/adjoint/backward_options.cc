#include "solvers/adjoint/backward_options.h"

#include <cmath>
#include <limits>
#include <sstream>

#include "solvers/enum_names.h"

namespace stillpoint {

// ------------------------------------------------------------------- enums

// The names and the lists of values come from solvers/implicit_solve/mode_list.h
// and solvers/adjoint/method_list.h.

const char* ToString(BackwardMode mode) {
  switch (mode) {
#define SP_BACKWARD_MODE_NAME(value, name, function, summary) \
  case BackwardMode::value:                                   \
    return name;
    SP_BACKWARD_MODES(SP_BACKWARD_MODE_NAME)
#undef SP_BACKWARD_MODE_NAME
  }
  return "unknown";
}

std::vector<BackwardMode> AllBackwardModes() {
  return {
#define SP_BACKWARD_MODE_VALUE(value, name, function, summary) BackwardMode::value,
      SP_BACKWARD_MODES(SP_BACKWARD_MODE_VALUE)
#undef SP_BACKWARD_MODE_VALUE
  };
}

bool StringToBackwardMode(const std::string& text, BackwardMode* mode) {
  return internal::ParseEnumByName(text, AllBackwardModes(), mode);
}

const char* ToString(AdjointSolverType type) {
  switch (type) {
#define SP_ADJOINT_SOLVER_NAME(value, name, method) \
  case AdjointSolverType::value:                    \
    return name;
    SP_ADJOINT_SOLVERS(SP_ADJOINT_SOLVER_NAME, SP_ADJOINT_SOLVER_NAME)
#undef SP_ADJOINT_SOLVER_NAME
  }
  return "unknown";
}

std::vector<AdjointSolverType> AllAdjointSolverTypes() {
  return {
#define SP_ADJOINT_SOLVER_VALUE(value, name, method) AdjointSolverType::value,
      SP_ADJOINT_SOLVERS(SP_ADJOINT_SOLVER_VALUE, SP_ADJOINT_SOLVER_VALUE)
#undef SP_ADJOINT_SOLVER_VALUE
  };
}

bool StringToAdjointSolverType(const std::string& text, AdjointSolverType* type) {
  return internal::ParseEnumByName(text, AllAdjointSolverTypes(), type);
}

// ------------------------------------------------------------------ options

namespace {

// The doc of the key backward.mode, "ift: ...; jfb: ...", from the
// summaries of solvers/implicit_solve/mode_list.h.
std::string BackwardModeDoc() {
  std::string doc;
#define SP_BACKWARD_MODE_DOC(value, name, function, summary) \
  doc += std::string(doc.empty() ? "" : "; ") + name + ": " + summary;
  SP_BACKWARD_MODES(SP_BACKWARD_MODE_DOC)
#undef SP_BACKWARD_MODE_DOC
  return doc;
}

}  // namespace

const OptionFields<BackwardOptions>& BackwardOptions::Fields() {
  using O = BackwardOptions;
  constexpr double kInf = std::numeric_limits<double>::max();
  constexpr int kMaxIterations = 1 << 20;
  const auto ift = [](const O& o) { return o.mode == BackwardMode::kIft; };
  static const auto* fields =
      &(new OptionFields<O>)
           ->Enum("mode", &O::mode, AllBackwardModes(), stillpoint::ToString, BackwardModeDoc())
           .Enum("solver", &O::solver, AllAdjointSolverTypes(), stillpoint::ToString,
                 "ift: solver of the adjoint equation g = dL/dz* + J^T g")
           .AppliesWhen(ift)
           .Int("max_iterations", &O::max_iterations, 0, kMaxIterations,
                "ift: adjoint iteration budget")
           .AppliesWhen(ift)
           .Double("tolerance", &O::tolerance, 0.0, kInf,
                   "ift: relative adjoint residual to stop at (0: a fixed budget)")
           .AppliesWhen(ift)
           .Int("neumann_terms", &O::neumann_terms, 0, kMaxIterations,
                "neumann: terms of the series")
           .AppliesWhen([](const O& o) {
             return o.mode == BackwardMode::kIft && o.solver == AdjointSolverType::kNeumann;
           })
           .Int("gmres_restart", &O::gmres_restart, 1, 512, "gmres: restart length")
           .AppliesWhen([](const O& o) {
             return o.mode == BackwardMode::kIft && o.solver == AdjointSolverType::kGmres;
           })
           .Int("anderson_memory", &O::anderson_memory, 1, 64, "anderson: history columns")
           .NotInConfig()
           .Int("broyden_memory", &O::broyden_memory, 1, 256, "broyden: rank-one updates kept")
           .NotInConfig()
           .Int("stagnation_window", &O::stagnation_window, 0, kMaxIterations,
                "fixed_point, anderson, broyden: iterations without 0.1% improvement of the "
                "adjoint residual before STAGNATED (0: never; not judged when tolerance is 0)")
           .AppliesWhen(ift)
           .Int("dense_max_state_size", &O::dense_max_state_size, 1, kMaxIterations,
                "dense: largest state size accepted")
           .NotInConfig()
           .Bool("warm_start", &O::warm_start, "ift: start from the previous step's solution")
           .AppliesWhen(ift)
           .Int("phantom_steps", &O::phantom_steps, 1, 4096, "phantom: unrolled steps k")
           .AppliesWhen([](const O& o) { return o.mode == BackwardMode::kPhantom; })
           .Double("phantom_tau", &O::phantom_tau, OptionBounds::OpenClosed(0.0, 1.0),
                   "phantom: damping tau")
           .AppliesWhen([](const O& o) { return o.mode == BackwardMode::kPhantom; })
           .Int("unrolled_steps", &O::unrolled_steps, 1, 1 << 16,
                "unrolled: forward steps recorded")
           .AppliesWhen([](const O& o) { return o.mode == BackwardMode::kUnrolled; });
  return *fields;
}

bool BackwardOptions::IsValid(std::string* error) const {
  const std::string problem = Fields().Check(*this);
  if (!problem.empty() && error != nullptr) *error = "BackwardOptions: " + problem;
  return problem.empty();
}

std::string BackwardOptions::ToString() const { return Fields().Describe(*this) + "\n"; }

}  // namespace stillpoint
