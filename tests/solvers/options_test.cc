// ForwardSolverOptions validation, the enum <-> string functions, and the
// summary's reports.
#include "solvers/forward_options.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "solvers/fixed_point_solver.h"
#include "solvers/solver_summary.h"

namespace stillpoint::options_test {
namespace {

TEST(ForwardSolverOptions, DefaultsAreValid) {
  const ForwardSolverOptions options;
  std::string error = "untouched";
  EXPECT_TRUE(options.IsValid(&error));
  EXPECT_EQ(error, "untouched");
  EXPECT_TRUE(options.IsValid(nullptr));
  EXPECT_EQ(options.type, ForwardSolverType::kAnderson);
  EXPECT_EQ(options.max_iterations, 40);
  EXPECT_FALSE(options.FixedBudget());
}

struct InvalidCase {
  const char* field;
  std::function<void(ForwardSolverOptions*)> mutate;
};

TEST(ForwardSolverOptions, InvalidFieldsAreNamedInTheMessage) {
  const std::vector<InvalidCase> cases = {
      {"max_iterations", [](ForwardSolverOptions* o) { o->max_iterations = -1; }},
      {"absolute_tolerance", [](ForwardSolverOptions* o) { o->absolute_tolerance = -1e-3; }},
      {"relative_tolerance",
       [](ForwardSolverOptions* o) {
         o->relative_tolerance = std::numeric_limits<double>::infinity();
       }},
      {"relative_epsilon", [](ForwardSolverOptions* o) { o->relative_epsilon = -1; }},
      {"stagnation_window", [](ForwardSolverOptions* o) { o->stagnation_window = -2; }},
      {"stagnation_min_improvement",
       [](ForwardSolverOptions* o) { o->stagnation_min_improvement = 1.0; }},
      {"divergence_factor", [](ForwardSolverOptions* o) { o->divergence_factor = 0.5; }},
      {"picard_damping", [](ForwardSolverOptions* o) { o->picard_damping = 0.0; }},
      {"picard_damping", [](ForwardSolverOptions* o) { o->picard_damping = 1.5; }},
      {"anderson_memory", [](ForwardSolverOptions* o) { o->anderson_memory = 0; }},
      {"anderson_memory", [](ForwardSolverOptions* o) { o->anderson_memory = 65; }},
      {"anderson_lambda", [](ForwardSolverOptions* o) { o->anderson_lambda = -1e-4; }},
      {"anderson_beta", [](ForwardSolverOptions* o) { o->anderson_beta = 0.0; }},
      {"anderson_safeguard_factor",
       [](ForwardSolverOptions* o) { o->anderson_safeguard_factor = 0.5; }},
      {"broyden_memory", [](ForwardSolverOptions* o) { o->broyden_memory = 0; }},
      {"armijo_c", [](ForwardSolverOptions* o) { o->armijo_c = 0.5; }},
      {"line_search_max_backtracks",
       [](ForwardSolverOptions* o) { o->line_search_max_backtracks = -1; }},
      {"line_search_shrink", [](ForwardSolverOptions* o) { o->line_search_shrink = 1.0; }},
      {"gmres_restart", [](ForwardSolverOptions* o) { o->gmres_restart = 0; }},
      {"gmres_max_iterations", [](ForwardSolverOptions* o) { o->gmres_max_iterations = 0; }},
      {"newton_forcing", [](ForwardSolverOptions* o) { o->newton_forcing = 1.0; }},
      {"jvp_finite_difference_step",
       [](ForwardSolverOptions* o) { o->jvp_finite_difference_step = -1e-8; }},
      {"ceres_max_state_size", [](ForwardSolverOptions* o) { o->ceres_max_state_size = 0; }},
      {"fallback_residual_threshold",
       [](ForwardSolverOptions* o) { o->fallback_residual_threshold = -1; }},
      {"fallback_chain",
       [](ForwardSolverOptions* o) { o->fallback_chain = {ForwardSolverType::kAnderson}; }},
      {"fallback_chain",
       [](ForwardSolverOptions* o) {
         o->fallback_chain = {ForwardSolverType::kPicard, ForwardSolverType::kPicard};
       }},
      {"callbacks", [](ForwardSolverOptions* o) { o->callbacks.push_back(nullptr); }},
  };
  for (const InvalidCase& c : cases) {
    ForwardSolverOptions options;
    c.mutate(&options);
    std::string error;
    EXPECT_FALSE(options.IsValid(&error)) << c.field;
    EXPECT_NE(error.find(c.field), std::string::npos) << "message: " << error;
    EXPECT_NE(error.find("ForwardSolverOptions"), std::string::npos) << error;
    // Misuse through the factory throws with the same message.
    try {
      FixedPointSolver::Create(options);
      ADD_FAILURE() << "Create accepted invalid " << c.field;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.field), std::string::npos) << e.what();
    }
  }
}

TEST(ForwardSolverOptions, ZeroDisablesTheOptionalChecks) {
  ForwardSolverOptions options;
  options.stagnation_window = 0;
  options.divergence_factor = 0;
  options.anderson_safeguard_factor = 0;
  EXPECT_TRUE(options.IsValid(nullptr));
}

TEST(ForwardSolverOptions, FixedBudgetFollowsTheStopMode) {
  ForwardSolverOptions o;
  o.stop_mode = StopMode::kRelative;
  o.relative_tolerance = 0.0;
  EXPECT_TRUE(o.FixedBudget());
  o.stop_mode = StopMode::kAbsolute;
  EXPECT_FALSE(o.FixedBudget());  // absolute_tolerance is still 1e-6
  o.absolute_tolerance = 0.0;
  EXPECT_TRUE(o.FixedBudget());
  o.stop_mode = StopMode::kEither;
  o.relative_tolerance = 1e-3;
  EXPECT_FALSE(o.FixedBudget());
  o.relative_tolerance = 0.0;
  EXPECT_TRUE(o.FixedBudget());
}

TEST(ForwardSolverOptions, ToStringListsEveryConfigurableKey) {
  ForwardSolverOptions o;
  o.anderson_memory = 7;
  o.fallback_chain = {ForwardSolverType::kBroyden, ForwardSolverType::kPicard};
  const std::string text = o.ToString();
  for (const char* key :
       {"type: anderson", "max_iterations: 40", "stop_mode: relative", "anderson_memory: 7",
        "anderson_type: type_ii", "broyden_variant: good", "forcing_type: eisenstat_walker",
        "ceres_line_search_direction: lbfgs", "ceres_trust_region_strategy: levenberg_marquardt",
        "fallback_chain: [broyden, picard]", "fallback_residual_threshold", "stagnation_window",
        "divergence_factor", "picard_damping", "gmres_restart", "jvp_finite_difference_step"}) {
    EXPECT_NE(text.find(key), std::string::npos) << key << "\n" << text;
  }
}

// Round trip of ToString / StringTo for every value of an enum, plus case
// insensitivity and rejection of unknown names.
template <typename Enum>
void CheckRoundTrip(const std::vector<Enum>& values, bool (*parse)(const std::string&, Enum*)) {
  std::vector<std::string> names;
  for (Enum value : values) {
    const std::string name = ToString(value);
    EXPECT_EQ(std::find(names.begin(), names.end(), name), names.end()) << "duplicate " << name;
    names.push_back(name);
    Enum parsed = values.front() == value ? values.back() : values.front();
    EXPECT_TRUE(parse(name, &parsed)) << name;
    EXPECT_EQ(parsed, value) << name;
    std::string upper = name;
    for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    std::string lower = name;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    parsed = values.front() == value ? values.back() : values.front();
    EXPECT_TRUE(parse(upper, &parsed)) << upper;
    EXPECT_EQ(parsed, value);
    EXPECT_TRUE(parse(lower, &parsed)) << lower;
    EXPECT_EQ(parsed, value);
  }
  Enum untouched = values.back();
  EXPECT_FALSE(parse("no_such_value", &untouched));
  EXPECT_FALSE(parse("", &untouched));
  EXPECT_EQ(untouched, values.back());
}

TEST(SolverEnums, RoundTrip) {
  CheckRoundTrip(AllForwardSolverTypes(), &StringToForwardSolverType);
  CheckRoundTrip({StopMode::kAbsolute, StopMode::kRelative, StopMode::kEither}, &StringToStopMode);
  CheckRoundTrip(
      {TerminationType::kConverged, TerminationType::kInexact, TerminationType::kUserStop,
       TerminationType::kMaxIterations, TerminationType::kStagnated, TerminationType::kDiverged,
       TerminationType::kLinearAlgebraFailure, TerminationType::kNonFinite,
       TerminationType::kFailure},
      &StringToTerminationType);
  CheckRoundTrip({AndersonType::kTypeII, AndersonType::kTypeI}, &StringToAndersonType);
  CheckRoundTrip({BroydenVariant::kGood, BroydenVariant::kBad}, &StringToBroydenVariant);
  CheckRoundTrip({ForcingTermType::kConstant, ForcingTermType::kEisenstatWalker},
                 &StringToForcingTermType);
  CheckRoundTrip({CeresLineSearchDirection::kLbfgs, CeresLineSearchDirection::kNonlinearCg},
                 &StringToCeresLineSearchDirection);
  CheckRoundTrip({CeresTrustRegionStrategy::kLevenbergMarquardt, CeresTrustRegionStrategy::kDogleg},
                 &StringToCeresTrustRegionStrategy);
}

TEST(SolverEnums, SpellingsMatchTheDocumentation) {
  EXPECT_STREQ(ToString(ForwardSolverType::kNewtonKrylov), "newton_krylov");
  EXPECT_STREQ(ToString(ForwardSolverType::kCeresTrustRegion), "ceres_trust_region");
  EXPECT_STREQ(ToString(TerminationType::kNonFinite), "NON_FINITE");
  EXPECT_STREQ(ToString(TerminationType::kLinearAlgebraFailure), "LINEAR_ALGEBRA_FAILURE");
  EXPECT_STREQ(ToString(AndersonType::kTypeI), "type_i");
  EXPECT_EQ(AllForwardSolverTypes().size(), 6u);
}

TEST(SolverEnums, TerminationTypesAreOrderedBestToWorst) {
  EXPECT_LT(TerminationType::kConverged, TerminationType::kInexact);
  EXPECT_LT(TerminationType::kInexact, TerminationType::kUserStop);
  EXPECT_LT(TerminationType::kUserStop, TerminationType::kMaxIterations);
  EXPECT_LT(TerminationType::kMaxIterations, TerminationType::kStagnated);
  EXPECT_LT(TerminationType::kStagnated, TerminationType::kDiverged);
  EXPECT_LT(TerminationType::kDiverged, TerminationType::kLinearAlgebraFailure);
  EXPECT_LT(TerminationType::kLinearAlgebraFailure, TerminationType::kNonFinite);
  EXPECT_LT(TerminationType::kNonFinite, TerminationType::kFailure);
}

SolverSummary SyntheticSummary() {
  SolverSummary s;
  s.solver_type = ForwardSolverType::kAnderson;
  s.termination_type = TerminationType::kMaxIterations;
  s.message = "1/2 samples converged; 1 MAX_ITERATIONS (max_iterations 16);";
  s.batch_size = 2;
  s.state_size = 8;
  s.sample_iterations = {3, 16};
  s.sample_abs_residual = {1e-7, 2e-2};
  s.sample_rel_residual = {1e-8, 3e-3};
  s.sample_termination = {TerminationType::kConverged, TerminationType::kMaxIterations};
  s.sample_solver = {ForwardSolverType::kAnderson, ForwardSolverType::kBroyden};
  s.abs_residual_trace = {1.0, 0.5};
  s.rel_residual_trace = {0.9, 0.4};
  s.iterations = 16;
  s.function_evaluations = 21;
  s.history_bytes = 4096;
  s.wall_time_seconds = 2.5e-3;
  s.option_usage.push_back({"anderson_memory", "5", "3", "the solve ended early"});
  s.fallbacks.push_back({ForwardSolverType::kAnderson, ForwardSolverType::kBroyden, 1, 0});
  return s;
}

TEST(SolverSummary, ReportsSayWhatHappened) {
  const SolverSummary s = SyntheticSummary();
  EXPECT_FALSE(s.IsUsable());
  EXPECT_EQ(s.CountSamples(TerminationType::kConverged), 1);
  EXPECT_EQ(s.CountSamples(TerminationType::kMaxIterations), 1);
  EXPECT_DOUBLE_EQ(s.MaxAbsResidual(), 2e-2);
  EXPECT_DOUBLE_EQ(s.MaxRelResidual(), 3e-3);
  const std::string brief = s.BriefReport();
  for (const char* piece : {"anderson", "MAX_ITERATIONS", "1/2 converged", "16 iterations",
                            "21 evaluations", "2.50 ms"}) {
    EXPECT_NE(brief.find(piece), std::string::npos) << piece << " in " << brief;
  }
  EXPECT_EQ(brief.find('\n'), std::string::npos);
  const std::string full = s.FullReport();
  for (const char* piece : {"anderson_memory: 5 requested / 3 used (the solve ended early)",
                            "anderson -> broyden: 1 sample(s) tried, 0 recovered", "4.0 KiB",
                            "sample 1:", "(by broyden)", "CONVERGED 1 MAX_ITERATIONS 1",
                            "message: 1/2 samples converged"}) {
    EXPECT_NE(full.find(piece), std::string::npos) << piece << " in\n" << full;
  }
}

TEST(SolverSummary, UsableOnlyWhenEverySampleConverged) {
  SolverSummary s;
  EXPECT_FALSE(s.IsUsable());  // no samples: nothing was solved
  s.sample_termination = {TerminationType::kConverged, TerminationType::kConverged};
  EXPECT_TRUE(s.IsUsable());
  s.sample_termination.push_back(TerminationType::kUserStop);
  EXPECT_FALSE(s.IsUsable());
}

TEST(SolverSummary, UnusedOptionsAreReportedNotIgnored) {
  ForwardSolverOptions o;
  o.type = ForwardSolverType::kPicard;
  o.anderson_memory = 7;  // set, but Picard never reads it
  o.gmres_restart = 5;
  FixedPointProblem problem;
  problem.batch_size = 1;
  problem.state_size = 1;
  problem.map = [](const Tensor& z, const std::vector<int64_t>&, Tensor* out) {
    out->set(0, 0.5 * z.at(0));
    return true;
  };
  Tensor z = Tensor::Ones(Shape{1, 1}, DType::kFloat64);
  const SolverSummary s = SolveFixedPoint(o, problem, &z);
  int found = 0;
  for (const OptionUsage& usage : s.option_usage) {
    if (usage.name == "anderson_memory") {
      ++found;
      EXPECT_EQ(usage.requested, "7");
      EXPECT_EQ(usage.used, "unused");
      EXPECT_NE(usage.note.find("picard"), std::string::npos);
    }
    if (usage.name == "gmres_restart") ++found;
  }
  EXPECT_EQ(found, 2) << s.FullReport();
  EXPECT_NE(s.FullReport().find("anderson_memory: 7 given but unused"), std::string::npos)
      << s.FullReport();
}

}  // namespace
}  // namespace stillpoint::options_test
