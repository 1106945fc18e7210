#include "solvers/adjoint/options.h"

#include <cmath>
#include <initializer_list>
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

bool BackwardOptions::IsValid(std::string* error) const {
  std::ostringstream message;
  auto check = [&](bool ok, const char* field, const auto& value, const char* requirement) {
    if (!ok && message.tellp() == 0) {
      message << "BackwardOptions: " << field << " = " << value << " must be " << requirement;
    }
  };
  check(max_iterations >= 0, "max_iterations", max_iterations, ">= 0");
  check(std::isfinite(tolerance) && tolerance >= 0, "tolerance", tolerance,
        "finite and >= 0 (0 runs a fixed budget)");
  check(gmres_restart >= 1 && gmres_restart <= 512, "gmres_restart", gmres_restart, "in [1, 512]");
  check(anderson_memory >= 1 && anderson_memory <= 64, "anderson_memory", anderson_memory,
        "in [1, 64]");
  check(broyden_memory >= 1 && broyden_memory <= 256, "broyden_memory", broyden_memory,
        "in [1, 256]");
  check(stagnation_window >= 0, "stagnation_window", stagnation_window, ">= 0 (0 disables)");
  check(neumann_terms >= 0, "neumann_terms", neumann_terms, ">= 0");
  check(dense_max_state_size >= 1, "dense_max_state_size", dense_max_state_size, ">= 1");
  check(phantom_steps >= 1, "phantom_steps", phantom_steps, ">= 1");
  check(phantom_tau > 0 && phantom_tau <= 1, "phantom_tau", phantom_tau, "in (0, 1]");
  check(unrolled_steps >= 1, "unrolled_steps", unrolled_steps, ">= 1");
  const bool ok = message.tellp() == 0;
  if (!ok && error != nullptr) *error = message.str();
  return ok;
}

std::string BackwardOptions::ToString() const {
  std::ostringstream out;
  out << "mode: " << stillpoint::ToString(mode) << "\n"
      << "solver: " << stillpoint::ToString(solver) << "\n"
      << "max_iterations: " << max_iterations << "\n"
      << "tolerance: " << tolerance << "\n"
      << "gmres_restart: " << gmres_restart << "\n"
      << "anderson_memory: " << anderson_memory << "\n"
      << "broyden_memory: " << broyden_memory << "\n"
      << "stagnation_window: " << stagnation_window << "\n"
      << "neumann_terms: " << neumann_terms << "\n"
      << "dense_max_state_size: " << dense_max_state_size << "\n"
      << "warm_start: " << (warm_start ? "true" : "false") << "\n"
      << "phantom_steps: " << phantom_steps << "\n"
      << "phantom_tau: " << phantom_tau << "\n"
      << "unrolled_steps: " << unrolled_steps << "\n";
  return out.str();
}

}  // namespace stillpoint
