#include "solvers/adjoint/options.h"

#include <cmath>
#include <initializer_list>
#include <limits>
#include <sstream>

#include "solvers/enum_names.h"

namespace stillpoint {

// ------------------------------------------------------------------- enums

const char* ToString(BackwardMode mode) {
  switch (mode) {
    case BackwardMode::kIft:
      return "ift";
    case BackwardMode::kJfb:
      return "jfb";
    case BackwardMode::kPhantom:
      return "phantom";
    case BackwardMode::kUnrolled:
      return "unrolled";
  }
  return "unknown";
}

bool StringToBackwardMode(const std::string& text, BackwardMode* mode) {
  return internal::ParseEnumByName(
      text,
      std::initializer_list<BackwardMode>{BackwardMode::kIft, BackwardMode::kJfb,
                                          BackwardMode::kPhantom, BackwardMode::kUnrolled},
      mode);
}

const char* ToString(AdjointSolverType type) {
  switch (type) {
    case AdjointSolverType::kFixedPoint:
      return "fixed_point";
    case AdjointSolverType::kAnderson:
      return "anderson";
    case AdjointSolverType::kBroyden:
      return "broyden";
    case AdjointSolverType::kGmres:
      return "gmres";
    case AdjointSolverType::kConjugateGradient:
      return "cg";
    case AdjointSolverType::kMinres:
      return "minres";
    case AdjointSolverType::kNeumann:
      return "neumann";
    case AdjointSolverType::kDense:
      return "dense";
  }
  return "unknown";
}

std::vector<AdjointSolverType> AllAdjointSolverTypes() {
  return {AdjointSolverType::kFixedPoint,        AdjointSolverType::kAnderson,
          AdjointSolverType::kBroyden,           AdjointSolverType::kGmres,
          AdjointSolverType::kConjugateGradient, AdjointSolverType::kMinres,
          AdjointSolverType::kNeumann,           AdjointSolverType::kDense};
}

bool StringToAdjointSolverType(const std::string& text, AdjointSolverType* type) {
  return internal::ParseEnumByName(text, AllAdjointSolverTypes(), type);
}

// ------------------------------------------------------------------ options

const OptionFields<BackwardOptions>& BackwardOptions::Fields() {
  using O = BackwardOptions;
  constexpr double kInf = std::numeric_limits<double>::max();
  constexpr int kMaxIterations = 1 << 20;
  const auto ift = [](const O& o) { return o.mode == BackwardMode::kIft; };
  static const auto* fields =
      &(new OptionFields<O>)
           ->Enum("mode", &O::mode,
                  {BackwardMode::kIft, BackwardMode::kJfb, BackwardMode::kPhantom,
                   BackwardMode::kUnrolled},
                  stillpoint::ToString,
                  "ift: implicit function theorem (default); jfb: Jacobian-free; phantom: k damped "
                  "unrolled steps from z*; unrolled: backprop through k forward steps")
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
