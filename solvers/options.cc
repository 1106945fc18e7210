#include "solvers/options.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <sstream>

#include "solvers/enum_names.h"

namespace stillpoint {
namespace {

template <typename Enum>
bool ParseEnum(const std::string& text, std::initializer_list<Enum> values, Enum* value) {
  return internal::ParseEnumByName(text, values, value);
}

}  // namespace

// ---- enums ----

const char* ToString(ForwardSolverType type) {
  switch (type) {
    case ForwardSolverType::kPicard:
      return "picard";
    case ForwardSolverType::kAnderson:
      return "anderson";
    case ForwardSolverType::kBroyden:
      return "broyden";
    case ForwardSolverType::kNewtonKrylov:
      return "newton_krylov";
    case ForwardSolverType::kCeresLbfgs:
      return "ceres_lbfgs";
    case ForwardSolverType::kCeresTrustRegion:
      return "ceres_trust_region";
  }
  return "unknown";
}

std::vector<ForwardSolverType> AllForwardSolverTypes() {
  return {ForwardSolverType::kPicard,     ForwardSolverType::kAnderson,
          ForwardSolverType::kBroyden,    ForwardSolverType::kNewtonKrylov,
          ForwardSolverType::kCeresLbfgs, ForwardSolverType::kCeresTrustRegion};
}

bool StringToForwardSolverType(const std::string& text, ForwardSolverType* type) {
  return internal::ParseEnumByName(text, AllForwardSolverTypes(), type);
}

const char* ToString(StopMode mode) {
  switch (mode) {
    case StopMode::kAbsolute:
      return "absolute";
    case StopMode::kRelative:
      return "relative";
    case StopMode::kEither:
      return "either";
  }
  return "unknown";
}

bool StringToStopMode(const std::string& text, StopMode* mode) {
  return ParseEnum(text, {StopMode::kAbsolute, StopMode::kRelative, StopMode::kEither}, mode);
}

const char* ToString(TerminationType type) {
  switch (type) {
    case TerminationType::kConverged:
      return "CONVERGED";
    case TerminationType::kInexact:
      return "INEXACT";
    case TerminationType::kUserStop:
      return "USER_STOP";
    case TerminationType::kMaxIterations:
      return "MAX_ITERATIONS";
    case TerminationType::kStagnated:
      return "STAGNATED";
    case TerminationType::kDiverged:
      return "DIVERGED";
    case TerminationType::kLinearAlgebraFailure:
      return "LINEAR_ALGEBRA_FAILURE";
    case TerminationType::kNonFinite:
      return "NON_FINITE";
    case TerminationType::kFailure:
      return "FAILURE";
  }
  return "UNKNOWN";
}

bool StringToTerminationType(const std::string& text, TerminationType* type) {
  return ParseEnum(text,
                   {TerminationType::kConverged, TerminationType::kInexact,
                    TerminationType::kUserStop,
                    TerminationType::kMaxIterations, TerminationType::kStagnated,
                    TerminationType::kDiverged, TerminationType::kLinearAlgebraFailure,
                    TerminationType::kNonFinite, TerminationType::kFailure},
                   type);
}

const char* ToString(AndersonType type) {
  switch (type) {
    case AndersonType::kTypeII:
      return "type_ii";
    case AndersonType::kTypeI:
      return "type_i";
  }
  return "unknown";
}

bool StringToAndersonType(const std::string& text, AndersonType* type) {
  return ParseEnum(text, {AndersonType::kTypeII, AndersonType::kTypeI}, type);
}

const char* ToString(BroydenVariant variant) {
  switch (variant) {
    case BroydenVariant::kGood:
      return "good";
    case BroydenVariant::kBad:
      return "bad";
  }
  return "unknown";
}

bool StringToBroydenVariant(const std::string& text, BroydenVariant* variant) {
  return ParseEnum(text, {BroydenVariant::kGood, BroydenVariant::kBad}, variant);
}

const char* ToString(ForcingTermType type) {
  switch (type) {
    case ForcingTermType::kConstant:
      return "constant";
    case ForcingTermType::kEisenstatWalker:
      return "eisenstat_walker";
  }
  return "unknown";
}

bool StringToForcingTermType(const std::string& text, ForcingTermType* type) {
  return ParseEnum(text, {ForcingTermType::kConstant, ForcingTermType::kEisenstatWalker}, type);
}

const char* ToString(CeresLineSearchDirection direction) {
  switch (direction) {
    case CeresLineSearchDirection::kLbfgs:
      return "lbfgs";
    case CeresLineSearchDirection::kNonlinearCg:
      return "nonlinear_cg";
  }
  return "unknown";
}

bool StringToCeresLineSearchDirection(const std::string& text,
                                      CeresLineSearchDirection* direction) {
  return ParseEnum(text, {CeresLineSearchDirection::kLbfgs, CeresLineSearchDirection::kNonlinearCg},
                   direction);
}

const char* ToString(CeresTrustRegionStrategy strategy) {
  switch (strategy) {
    case CeresTrustRegionStrategy::kLevenbergMarquardt:
      return "levenberg_marquardt";
    case CeresTrustRegionStrategy::kDogleg:
      return "dogleg";
  }
  return "unknown";
}

bool StringToCeresTrustRegionStrategy(const std::string& text, CeresTrustRegionStrategy* strategy) {
  return ParseEnum(
      text, {CeresTrustRegionStrategy::kLevenbergMarquardt, CeresTrustRegionStrategy::kDogleg},
      strategy);
}

// ---- options ----

bool ForwardSolverOptions::FixedBudget() const {
  switch (stop_mode) {
    case StopMode::kAbsolute:
      return absolute_tolerance == 0.0;
    case StopMode::kRelative:
      return relative_tolerance == 0.0;
    case StopMode::kEither:
      return absolute_tolerance == 0.0 && relative_tolerance == 0.0;
  }
  return false;
}

namespace {

// Collects the first violated condition as "ForwardSolverOptions: <field> = <value>: <why>".
class Validator {
 public:
  template <typename T>
  void Check(bool ok, const char* field, T value, const char* requirement) {
    if (ok || failed_) return;
    std::ostringstream out;
    out << "ForwardSolverOptions: " << field << " = " << value << " but it must be " << requirement;
    message_ = out.str();
    failed_ = true;
  }
  bool failed() const { return failed_; }
  const std::string& message() const { return message_; }

 private:
  bool failed_ = false;
  std::string message_;
};

bool Finite(double x) { return std::isfinite(x); }

}  // namespace

bool ForwardSolverOptions::IsValid(std::string* error) const {
  Validator v;
  v.Check(max_iterations >= 0, "max_iterations", max_iterations, ">= 0");
  v.Check(Finite(absolute_tolerance) && absolute_tolerance >= 0, "absolute_tolerance",
          absolute_tolerance, "finite and >= 0");
  v.Check(Finite(relative_tolerance) && relative_tolerance >= 0, "relative_tolerance",
          relative_tolerance, "finite and >= 0");
  v.Check(Finite(relative_epsilon) && relative_epsilon >= 0, "relative_epsilon", relative_epsilon,
          "finite and >= 0");
  v.Check(stagnation_window >= 0, "stagnation_window", stagnation_window, ">= 0 (0 disables)");
  v.Check(stagnation_min_improvement >= 0 && stagnation_min_improvement < 1,
          "stagnation_min_improvement", stagnation_min_improvement, "in [0, 1)");
  v.Check(divergence_factor == 0 || divergence_factor > 1, "divergence_factor", divergence_factor,
          "> 1, or 0 to disable");
  v.Check(picard_damping > 0 && picard_damping <= 1, "picard_damping", picard_damping, "in (0, 1]");
  v.Check(anderson_memory >= 1 && anderson_memory <= 64, "anderson_memory", anderson_memory,
          "in [1, 64]");
  v.Check(Finite(anderson_lambda) && anderson_lambda >= 0, "anderson_lambda", anderson_lambda,
          "finite and >= 0");
  v.Check(anderson_beta > 0 && anderson_beta <= 1, "anderson_beta", anderson_beta, "in (0, 1]");
  v.Check(anderson_safeguard_factor == 0 || anderson_safeguard_factor >= 1,
          "anderson_safeguard_factor", anderson_safeguard_factor, ">= 1, or 0 to disable");
  v.Check(broyden_memory >= 1 && broyden_memory <= 256, "broyden_memory", broyden_memory,
          "in [1, 256]");
  v.Check(Finite(broyden_initial_scale) && broyden_initial_scale >= 0, "broyden_initial_scale",
          broyden_initial_scale, "finite and >= 0 (0: automatic)");
  v.Check(armijo_c > 0 && armijo_c < 0.5, "armijo_c", armijo_c, "in (0, 0.5)");
  v.Check(line_search_max_backtracks >= 0 && line_search_max_backtracks <= 60,
          "line_search_max_backtracks", line_search_max_backtracks, "in [0, 60]");
  v.Check(line_search_shrink > 0 && line_search_shrink < 1, "line_search_shrink",
          line_search_shrink, "in (0, 1)");
  v.Check(gmres_restart >= 1 && gmres_restart <= 512, "gmres_restart", gmres_restart,
          "in [1, 512]");
  v.Check(gmres_max_iterations >= 1, "gmres_max_iterations", gmres_max_iterations, ">= 1");
  v.Check(newton_forcing > 0 && newton_forcing < 1, "newton_forcing", newton_forcing, "in (0, 1)");
  v.Check(Finite(jvp_finite_difference_step) && jvp_finite_difference_step >= 0,
          "jvp_finite_difference_step", jvp_finite_difference_step,
          ">= 0 (0 picks sqrt(machine epsilon))");
  v.Check(ceres_max_state_size >= 1, "ceres_max_state_size", ceres_max_state_size, ">= 1");
  v.Check(Finite(fallback_residual_threshold) && fallback_residual_threshold >= 0,
          "fallback_residual_threshold", fallback_residual_threshold, "finite and >= 0");
  for (size_t i = 0; i < fallback_chain.size() && !v.failed(); ++i) {
    v.Check(fallback_chain[i] != type, "fallback_chain", stillpoint::ToString(fallback_chain[i]),
            "different from the primary solver type (it would rerun the same solve)");
    for (size_t j = 0; j < i; ++j) {
      v.Check(fallback_chain[i] != fallback_chain[j], "fallback_chain",
              stillpoint::ToString(fallback_chain[i]), "listed once");
    }
  }
  for (size_t i = 0; i < callbacks.size(); ++i) {
    v.Check(static_cast<bool>(callbacks[i]), "callbacks", i, "a callable (entry is empty)");
  }
  if (v.failed() && error != nullptr) *error = v.message();
  return !v.failed();
}

std::string ForwardSolverOptions::ToString() const {
  std::ostringstream out;
  out << "type: " << stillpoint::ToString(type) << "\n"
      << "max_iterations: " << max_iterations << "\n"
      << "stop_mode: " << stillpoint::ToString(stop_mode) << "\n"
      << "absolute_tolerance: " << absolute_tolerance << "\n"
      << "relative_tolerance: " << relative_tolerance << "\n"
      << "relative_epsilon: " << relative_epsilon << "\n"
      << "stagnation_window: " << stagnation_window << "\n"
      << "stagnation_min_improvement: " << stagnation_min_improvement << "\n"
      << "divergence_factor: " << divergence_factor << "\n"
      << "picard_damping: " << picard_damping << "\n"
      << "anderson_memory: " << anderson_memory << "\n"
      << "anderson_lambda: " << anderson_lambda << "\n"
      << "anderson_beta: " << anderson_beta << "\n"
      << "anderson_type: " << stillpoint::ToString(anderson_type) << "\n"
      << "anderson_safeguard_factor: " << anderson_safeguard_factor << "\n"
      << "broyden_memory: " << broyden_memory << "\n"
      << "broyden_initial_scale: " << broyden_initial_scale << "\n"
      << "broyden_variant: " << stillpoint::ToString(broyden_variant) << "\n"
      << "broyden_line_search: " << (broyden_line_search ? "true" : "false") << "\n"
      << "armijo_c: " << armijo_c << "\n"
      << "line_search_max_backtracks: " << line_search_max_backtracks << "\n"
      << "line_search_shrink: " << line_search_shrink << "\n"
      << "gmres_restart: " << gmres_restart << "\n"
      << "gmres_max_iterations: " << gmres_max_iterations << "\n"
      << "forcing_type: " << stillpoint::ToString(forcing_type) << "\n"
      << "newton_forcing: " << newton_forcing << "\n"
      << "jvp_finite_difference_step: " << jvp_finite_difference_step << "\n"
      << "ceres_line_search_direction: " << stillpoint::ToString(ceres_line_search_direction)
      << "\n"
      << "ceres_trust_region_strategy: " << stillpoint::ToString(ceres_trust_region_strategy)
      << "\n"
      << "ceres_max_state_size: " << ceres_max_state_size << "\n"
      << "fallback_chain: [";
  for (size_t i = 0; i < fallback_chain.size(); ++i) {
    out << (i ? ", " : "") << stillpoint::ToString(fallback_chain[i]);
  }
  out << "]\n"
      << "fallback_residual_threshold: " << fallback_residual_threshold << "\n";
  return out.str();
}

}  // namespace stillpoint
