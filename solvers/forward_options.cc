#include "solvers/forward_options.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
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

// The names and the list of values come from solvers/forward_solver_list.h.
const char* ToString(ForwardSolverType type) {
  switch (type) {
#define SP_FORWARD_SOLVER_NAME(value, name, factory) \
  case ForwardSolverType::value:                     \
    return name;
    SP_FORWARD_SOLVERS(SP_FORWARD_SOLVER_NAME)
#undef SP_FORWARD_SOLVER_NAME
  }
  return "unknown";
}

std::vector<ForwardSolverType> AllForwardSolverTypes() {
  return {
#define SP_FORWARD_SOLVER_VALUE(value, name, factory) ForwardSolverType::value,
      SP_FORWARD_SOLVERS(SP_FORWARD_SOLVER_VALUE)
#undef SP_FORWARD_SOLVER_VALUE
  };
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

// Whether the primary solver or a fallback is `type`.
bool UsesSolver(const ForwardSolverOptions& options, ForwardSolverType type) {
  if (options.type == type) return true;
  return std::find(options.fallback_chain.begin(), options.fallback_chain.end(), type) !=
         options.fallback_chain.end();
}

// Applies-when predicates of the solver-specific fields.
std::function<bool(const ForwardSolverOptions&)> Uses(ForwardSolverType type) {
  return [type](const ForwardSolverOptions& o) { return UsesSolver(o, type); };
}
bool UsesLineSearch(const ForwardSolverOptions& o) {
  return UsesSolver(o, ForwardSolverType::kNewtonKrylov) ||
         (UsesSolver(o, ForwardSolverType::kBroyden) && o.broyden_line_search);
}
bool UsesJvp(const ForwardSolverOptions& o) {
  return UsesSolver(o, ForwardSolverType::kNewtonKrylov) ||
         UsesSolver(o, ForwardSolverType::kCeresTrustRegion);
}

}  // namespace

const OptionFields<ForwardSolverOptions>& ForwardSolverOptions::Fields() {
  using O = ForwardSolverOptions;
  using T = ForwardSolverType;
  constexpr double kInf = std::numeric_limits<double>::max();
  constexpr int kMaxIterations = kMaxSolverIterations;
  static const auto* fields =
      &(new OptionFields<O>)
           ->Enum("type", &O::type, AllForwardSolverTypes(), stillpoint::ToString,
                  "Forward solver")
           .Int("max_iterations", &O::max_iterations, 0, kMaxIterations,
                "Iteration budget per solve")
           .Enum("stop_mode", &O::stop_mode,
                 {StopMode::kAbsolute, StopMode::kRelative, StopMode::kEither},
                 stillpoint::ToString, "Which residual decides convergence")
           .Double("absolute_tolerance", &O::absolute_tolerance, 0.0, kInf,
                   "Stop when ||f(z) - z|| <= this (absolute or either)")
           .Double("relative_tolerance", &O::relative_tolerance, 0.0, kInf,
                   "Stop when ||f(z) - z|| / (||f(z)|| + eps) <= this (relative or "
                   "either)")
           .Double("relative_epsilon", &O::relative_epsilon, 0.0, kInf,
                   "Added to ||f(z)|| in the relative residual")
           .NotInConfig()
           .Int("stagnation_window", &O::stagnation_window, 0, kMaxIterations,
                "Iterations without enough improvement before STAGNATED (DIVERGED when the "
                "residual rose at each of them; 0: never)")
           .Double("stagnation_min_improvement", &O::stagnation_min_improvement,
                   OptionBounds{0.0, 1.0, false, true},
                   "The relative drop of the best residual that counts as improvement")
           .NotInConfig()
           .Double("divergence_factor", &O::divergence_factor,
                   OptionBounds{1.0, kInf, true, false}.OrZero(),
                   "Protective break: DIVERGED when the residual exceeds this x the initial one "
                   "(0: off)")
           .Double("picard_damping", &O::picard_damping, OptionBounds::OpenClosed(0.0, 1.0),
                   "picard: z <- (1 - tau) z + tau f(z)")
           .AppliesWhen(Uses(T::kPicard))
           .Int("anderson_memory", &O::anderson_memory, 1, 64, "anderson: history size m")
           .AppliesWhen(Uses(T::kAnderson))
           .Double("anderson_lambda", &O::anderson_lambda, 0.0, kInf,
                   "anderson: Tikhonov regularisation")
           .AppliesWhen(Uses(T::kAnderson))
           .Double("anderson_beta", &O::anderson_beta, OptionBounds::OpenClosed(0.0, 1.0),
                   "anderson: mixing")
           .AppliesWhen(Uses(T::kAnderson))
           .Enum("anderson_type", &O::anderson_type, {AndersonType::kTypeII, AndersonType::kTypeI},
                 stillpoint::ToString, "anderson: type II (default) or type I")
           .AppliesWhen(Uses(T::kAnderson))
           .Double("anderson_safeguard_factor", &O::anderson_safeguard_factor,
                   OptionBounds::Closed(1.0, kInf).OrZero(),
                   "anderson: reject a step raising the residual by this factor and restart (0: "
                   "off)")
           .AppliesWhen(Uses(T::kAnderson))
           .Int("broyden_memory", &O::broyden_memory, 1, 256, "broyden: rank-one updates kept")
           .AppliesWhen(Uses(T::kBroyden))
           .Double("broyden_initial_scale", &O::broyden_initial_scale, 0.0, kInf,
                   "broyden: alpha of the initial inverse Jacobian -alpha I (1: the first step is "
                   "a plain fixed-point step; 0: automatic, a first step of at most half of "
                   "max(|z0|, 1))")
           .AppliesWhen(Uses(T::kBroyden))
           .Enum("broyden_variant", &O::broyden_variant,
                 {BroydenVariant::kGood, BroydenVariant::kBad}, stillpoint::ToString,
                 "broyden: which update")
           .AppliesWhen(Uses(T::kBroyden))
           .Bool("broyden_line_search", &O::broyden_line_search, "broyden: Armijo line search")
           .AppliesWhen(Uses(T::kBroyden))
           .Double("armijo_c", &O::armijo_c, OptionBounds::Open(0.0, 0.5),
                   "Line search: accept step t when ||F(z + t p)||^2 <= (1 - 2 c t) ||F(z)||^2")
           .NotInConfig()
           .AppliesWhen(UsesLineSearch)
           .Int("line_search_max_backtracks", &O::line_search_max_backtracks, 0, 60,
                "Line search: halvings of the step tried")
           .NotInConfig()
           .AppliesWhen(UsesLineSearch)
           .Double("line_search_shrink", &O::line_search_shrink, OptionBounds::Open(0.0, 1.0),
                   "Line search: step factor per backtrack")
           .NotInConfig()
           .AppliesWhen(UsesLineSearch)
           .Int("gmres_restart", &O::gmres_restart, 1, 512,
                "newton_krylov: Krylov vectors kept")
           .AppliesWhen(Uses(T::kNewtonKrylov))
           .Int("gmres_max_iterations", &O::gmres_max_iterations, 1, kMaxIterations,
                "newton_krylov: inner GMRES iterations per Newton step")
           .NotInConfig()
           .AppliesWhen(Uses(T::kNewtonKrylov))
           .Enum("forcing_type", &O::forcing_type,
                 {ForcingTermType::kConstant, ForcingTermType::kEisenstatWalker},
                 stillpoint::ToString, "newton_krylov: inner tolerance rule")
           .NotInConfig()
           .AppliesWhen(Uses(T::kNewtonKrylov))
           .Double("newton_forcing", &O::newton_forcing, OptionBounds::Open(0.0, 1.0),
                   "newton_krylov: forcing term eta (the cap for eisenstat_walker)")
           .AppliesWhen(Uses(T::kNewtonKrylov))
           .Double("jvp_finite_difference_step", &O::jvp_finite_difference_step, 0.0, kInf,
                   "newton_krylov: finite-difference step of J v when the problem has no jvp "
                   "(0: sqrt of the dtype's machine epsilon)")
           .NotInConfig()
           .AppliesWhen(UsesJvp)
           .Enum("ceres_line_search_direction", &O::ceres_line_search_direction,
                 {CeresLineSearchDirection::kLbfgs, CeresLineSearchDirection::kNonlinearCg},
                 stillpoint::ToString, "ceres_lbfgs: search direction")
           .NotInConfig()
           .AppliesWhen(Uses(T::kCeresLbfgs))
           .Enum("ceres_trust_region_strategy", &O::ceres_trust_region_strategy,
                 {CeresTrustRegionStrategy::kLevenbergMarquardt, CeresTrustRegionStrategy::kDogleg},
                 stillpoint::ToString, "ceres_trust_region: strategy")
           .NotInConfig()
           .AppliesWhen(Uses(T::kCeresTrustRegion))
           .Int("ceres_max_state_size", &O::ceres_max_state_size, 1, kMaxIterations,
                "ceres_trust_region: largest state per sample (it forms a dense Jacobian)")
           .NotInConfig()
           .AppliesWhen(Uses(T::kCeresTrustRegion))
           .EnumList("fallback_chain", &O::fallback_chain, AllForwardSolverTypes(),
                     stillpoint::ToString,
                     "Solvers tried in order for samples that end DIVERGED / NON_FINITE / "
                     "LINEAR_ALGEBRA_FAILURE or above fallback_residual_threshold")
           .Double("fallback_residual_threshold", &O::fallback_residual_threshold, 0.0, kInf,
                   "Relative residual above which a sample is handed to the fallback chain");
  return *fields;
}

bool ForwardSolverOptions::IsValid(std::string* error) const {
  std::string problem = Fields().Check(*this);
  for (size_t i = 0; i < fallback_chain.size() && problem.empty(); ++i) {
    if (fallback_chain[i] == type) {
      problem = std::string("fallback_chain holds ") + stillpoint::ToString(type) +
                ", the primary solver type (it would rerun the same solve)";
    }
    for (size_t j = 0; j < i && problem.empty(); ++j) {
      if (fallback_chain[i] == fallback_chain[j]) {
        problem = std::string("fallback_chain lists ") + stillpoint::ToString(fallback_chain[i]) +
                  " twice";
      }
    }
  }
  for (size_t i = 0; i < callbacks.size() && problem.empty(); ++i) {
    if (!callbacks[i]) problem = "callbacks[" + std::to_string(i) + "] is empty, not a callable";
  }
  if (!problem.empty() && error != nullptr) *error = "ForwardSolverOptions: " + problem;
  return problem.empty();
}

std::string ForwardSolverOptions::ToString() const { return Fields().Describe(*this) + "\n"; }

}  // namespace stillpoint
