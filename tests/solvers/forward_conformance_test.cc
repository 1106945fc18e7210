// The conformance suite every forward solver must pass, run on the problem
// zoo (tests/solvers/problems.h): convergence to the known fixed point,
// per-sample bookkeeping, a truthful summary, honest failures.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "framework/tensor.h"
#include "solvers/fixed_point_solver.h"
#include "solvers/forward_options.h"
#include "solvers/solver_summary.h"
#include "tests/solvers/problems.h"

namespace stillpoint::forward_conformance_test {
namespace {

// Tolerances of the suite: solves stop at abs residual 1e-9 (float64); every
// zoo map is at worst a 0.9-contraction near its fixed point, so the iterate
// is within ~1e-8 of it. Minimising an energy (the Ceres line-search
// backends) cannot resolve residuals much below sqrt(eps) * scale, because
// the line search compares energies: those cases ask for less.
struct Tolerances {
  double residual = 1e-9;
  double solution = 1e-6;
  double float32_relative = 1e-5;
  double float32_solution = 1e-4;
};

constexpr Tolerances kEnergyMinimisation{1e-7, 1e-5, 1e-3, 1e-2};

struct SolverCase {
  SolverCase(std::string case_name,
             ForwardSolverOptions case_options,
             Tolerances case_tolerances = Tolerances())
      : name(std::move(case_name)), options(std::move(case_options)), tolerances(case_tolerances) {}

  std::string name;
  ForwardSolverOptions options;
  Tolerances tolerances;
};

ForwardSolverOptions BaseOptions(ForwardSolverType type, double tolerance = 1e-9) {
  ForwardSolverOptions options;
  options.type = type;
  options.stop_mode = StopMode::kAbsolute;
  options.absolute_tolerance = tolerance;
  options.max_iterations = 500;
  return options;
}

std::vector<SolverCase> AllSolverCases() {
  std::vector<SolverCase> cases;
  cases.push_back({"picard", BaseOptions(ForwardSolverType::kPicard)});
  cases.push_back({"anderson", BaseOptions(ForwardSolverType::kAnderson)});
  SolverCase type_one{"anderson_type_i", BaseOptions(ForwardSolverType::kAnderson)};
  type_one.options.anderson_type = AndersonType::kTypeI;
  cases.push_back(type_one);
  cases.push_back({"broyden_good", BaseOptions(ForwardSolverType::kBroyden)});
  SolverCase bad{"broyden_bad", BaseOptions(ForwardSolverType::kBroyden)};
  bad.options.broyden_variant = BroydenVariant::kBad;
  cases.push_back(bad);
  SolverCase searched{"broyden_line_search", BaseOptions(ForwardSolverType::kBroyden)};
  searched.options.broyden_line_search = true;
  cases.push_back(searched);
  cases.push_back({"newton_krylov", BaseOptions(ForwardSolverType::kNewtonKrylov)});
  const double energy_tolerance = kEnergyMinimisation.residual;
  cases.push_back({"ceres_lbfgs", BaseOptions(ForwardSolverType::kCeresLbfgs, energy_tolerance),
                   kEnergyMinimisation});
  SolverCase cg{"ceres_nonlinear_cg", BaseOptions(ForwardSolverType::kCeresLbfgs, energy_tolerance),
                kEnergyMinimisation};
  cg.options.ceres_line_search_direction = CeresLineSearchDirection::kNonlinearCg;
  cases.push_back(cg);
  cases.push_back({"ceres_levenberg_marquardt", BaseOptions(ForwardSolverType::kCeresTrustRegion)});
  SolverCase dogleg{"ceres_dogleg", BaseOptions(ForwardSolverType::kCeresTrustRegion)};
  dogleg.options.ceres_trust_region_strategy = CeresTrustRegionStrategy::kDogleg;
  cases.push_back(dogleg);
  return cases;
}

class ForwardConformanceTest : public ::testing::TestWithParam<SolverCase> {
 protected:
  const ForwardSolverOptions& options() const { return GetParam().options; }
  const Tolerances& tolerances() const { return GetParam().tolerances; }
  // The L-BFGS backend minimises an energy: it only applies to problems that have one.
  bool Applies(const zoo::ZooProblem& p) const {
    return options().type != ForwardSolverType::kCeresLbfgs || static_cast<bool>(p.problem.energy);
  }
};

// The convergent zoo, built once (its reference solutions take a moment).
const std::vector<zoo::ZooProblem>& ConvergentZoo() {
  static const std::vector<zoo::ZooProblem>* const problems =
      new std::vector<zoo::ZooProblem>(zoo::ConvergentZoo());
  return *problems;
}

double MaxAbsDifference(const Tensor& a, const Tensor& b) {
  return MaxAbsDiff(a.To(DType::kFloat64), b.To(DType::kFloat64));
}

// A one-sample problem that evaluates sample `sample` of `p`.
FixedPointProblem SingleSample(const zoo::ZooProblem& p, int64_t sample) {
  FixedPointProblem single = p.problem;
  single.batch_size = 1;
  const std::vector<int64_t> ids = {sample};
  const FixedPointProblem full = p.problem;
  single.map = [full, ids](const Tensor& z, const std::vector<int64_t>&, Tensor* out) {
    return full.map(z, ids, out);
  };
  if (full.jvp) {
    single.jvp = [full, ids](const Tensor& z, const Tensor& v, const std::vector<int64_t>&,
                             Tensor* out) { return full.jvp(z, v, ids, out); };
  }
  if (full.energy) {
    single.energy = [full, ids](const Tensor& z, const std::vector<int64_t>&, Tensor* e,
                                Tensor* g) { return full.energy(z, ids, e, g); };
  }
  return single;
}

TEST_P(ForwardConformanceTest, ConvergesToTheKnownFixedPoint) {
  for (const zoo::ZooProblem& p : ConvergentZoo()) {
    if (!Applies(p)) continue;
    SCOPED_TRACE(p.name);
    Tensor z = p.InitialPoint();
    const SolverSummary summary = SolveFixedPoint(options(), p.problem, &z);
    EXPECT_EQ(summary.termination_type, TerminationType::kConverged) << summary.FullReport();
    EXPECT_TRUE(summary.IsUsable());
    EXPECT_LE(summary.MaxAbsResidual(), tolerances().residual);
    EXPECT_LE(MaxAbsDifference(z, p.Solution()), tolerances().solution) << summary.BriefReport();
  }
}

TEST_P(ForwardConformanceTest, SummaryIsTruthful) {
  zoo::ZooProblem p =
      Applies(zoo::MakeTanhProblem()) ? zoo::MakeTanhProblem() : zoo::MakeMixedBatchProblem();
  const Tensor z0 = p.InitialPoint();
  const std::vector<double> initial = zoo::ResidualNorms(p, z0);
  p.log->map_rows = 0;
  Tensor z = z0.Clone();
  const SolverSummary s = SolveFixedPoint(options(), p.problem, &z);
  const int64_t batch = p.problem.batch_size;

  EXPECT_EQ(s.solver_type, options().type);
  EXPECT_EQ(s.batch_size, batch);
  EXPECT_EQ(s.state_size, p.problem.state_size);
  ASSERT_EQ(s.sample_iterations.size(), static_cast<size_t>(batch));
  ASSERT_EQ(s.sample_abs_residual.size(), static_cast<size_t>(batch));
  ASSERT_EQ(s.sample_rel_residual.size(), static_cast<size_t>(batch));
  ASSERT_EQ(s.sample_termination.size(), static_cast<size_t>(batch));
  // Effort counters agree with what the map saw.
  EXPECT_EQ(s.function_evaluations, p.log->map_rows);
  EXPECT_GT(s.map_calls, 0);
  EXPECT_EQ(s.iterations,
            *std::max_element(s.sample_iterations.begin(), s.sample_iterations.end()));
  EXPECT_GT(s.history_bytes, 0);
  EXPECT_GT(s.wall_time_seconds, 0.0);
  // Residuals are those of the returned state.
  const std::vector<double> recomputed = zoo::ResidualNorms(p, z);
  const Tensor fz = [&] {
    Tensor out(Shape{batch, p.problem.state_size}, DType::kFloat64);
    std::vector<int64_t> ids(batch);
    for (int64_t b = 0; b < batch; ++b) ids[b] = b;
    p.problem.map(z, ids, &out);
    return out;
  }();
  for (int64_t b = 0; b < batch; ++b) {
    EXPECT_NEAR(s.sample_abs_residual[b], recomputed[b], 1e-12 + 1e-9 * recomputed[b]);
    double map_norm = 0.0;
    for (int64_t i = 0; i < p.problem.state_size; ++i) {
      map_norm += fz.at(b * p.problem.state_size + i) * fz.at(b * p.problem.state_size + i);
    }
    const double rel = recomputed[b] / (std::sqrt(map_norm) + options().relative_epsilon);
    EXPECT_NEAR(s.sample_rel_residual[b], rel, 1e-12 + 1e-9 * rel);
    EXPECT_EQ(s.sample_termination[b], TerminationType::kConverged);
    EXPECT_LE(s.sample_abs_residual[b], tolerances().residual);
  }
  // The trace starts at z0 and ends at the last judged iterates.
  ASSERT_FALSE(s.abs_residual_trace.empty());
  EXPECT_NEAR(s.abs_residual_trace.front(), *std::max_element(initial.begin(), initial.end()),
              1e-12);
  EXPECT_EQ(s.abs_residual_trace.size(), s.rel_residual_trace.size());
  EXPECT_NE(s.BriefReport().find(ToString(options().type)), std::string::npos);
  EXPECT_NE(s.BriefReport().find("CONVERGED"), std::string::npos);
  EXPECT_NE(s.FullReport().find("trace"), std::string::npos);
}

TEST_P(ForwardConformanceTest, PerSampleIterationsDifferAndMatchSingleSampleSolves) {
  zoo::ZooProblem p = zoo::MakeMixedBatchProblem();
  p.log->log_calls = true;
  Tensor z = p.InitialPoint();
  const SolverSummary s = SolveFixedPoint(options(), p.problem, &z);
  ASSERT_TRUE(s.IsUsable()) << s.FullReport();
  // Sample 0 starts at its fixed point: judged at z0, never stepped, and
  // never evaluated again after Init.
  EXPECT_EQ(s.sample_iterations[0], 0);
  int64_t calls_with_sample0 = 0;
  for (const std::vector<int64_t>& ids : p.log->map_calls) {
    EXPECT_TRUE(std::is_sorted(ids.begin(), ids.end()));
    calls_with_sample0 += std::count(ids.begin(), ids.end(), 0);
  }
  EXPECT_LE(calls_with_sample0, 1);
  // The far sample needs more iterations than the close one.
  EXPECT_LT(s.sample_iterations[1], s.sample_iterations[2]) << s.FullReport();
  // Samples are independent: each count equals that of a solve of the sample alone.
  for (int64_t b = 0; b < p.problem.batch_size; ++b) {
    SCOPED_TRACE("sample " + std::to_string(b));
    Tensor single = p.InitialPoint().SliceRows(b, b + 1).Clone();
    const SolverSummary alone = SolveFixedPoint(options(), SingleSample(p, b), &single);
    EXPECT_EQ(alone.sample_iterations[0], s.sample_iterations[b]);
    EXPECT_EQ(alone.sample_termination[0], s.sample_termination[b]);
    EXPECT_LE(MaxAbsDifference(single, z.SliceRows(b, b + 1)), 1e-12);
  }
}

TEST_P(ForwardConformanceTest, PicardCountsMatchTheContractionRate) {
  if (options().type != ForwardSolverType::kPicard) GTEST_SKIP() << "Picard only";
  // On z = a z + c the residual shrinks by exactly |a| per Picard step.
  const std::vector<double> slope = {0.5, 0.8, 0.2};
  FixedPointProblem problem;
  problem.batch_size = 3;
  problem.state_size = 1;
  problem.map = [slope](const Tensor& z, const std::vector<int64_t>& ids, Tensor* out) {
    for (size_t i = 0; i < ids.size(); ++i) out->set(i, slope[ids[i]] * z.at(i) + 1.0);
    return true;
  };
  Tensor z = Tensor::Zeros(Shape{3, 1}, DType::kFloat64);
  const SolverSummary s = SolveFixedPoint(options(), problem, &z);
  ASSERT_TRUE(s.IsUsable());
  for (int b = 0; b < 3; ++b) {
    // Residual after k steps: a^k * 1 <= tol.
    const int expected =
        static_cast<int>(std::ceil(std::log(tolerances().residual) / std::log(slope[b])));
    EXPECT_NEAR(s.sample_iterations[b], expected, 1) << "sample " << b;
  }
  EXPECT_LT(s.sample_iterations[2], s.sample_iterations[0]);
  EXPECT_LT(s.sample_iterations[0], s.sample_iterations[1]);
}

TEST_P(ForwardConformanceTest, ReturnsTheBestIterate) {
  // Without a fixed point the iterates wander; the state returned must be
  // the best one seen (its residual no larger than the last iterate's or z0's).
  zoo::ZooProblem p = zoo::MakeNoFixedPointProblem();
  ForwardSolverOptions o = options();
  o.max_iterations = 12;
  auto solver = FixedPointSolver::Create(o);
  solver->Init(p.problem, p.InitialPoint());
  while (solver->Step()) {
  }
  const std::vector<double> current = zoo::ResidualNorms(p, solver->current_state());
  const std::vector<double> returned = zoo::ResidualNorms(p, solver->returned_state());
  const std::vector<double> initial = zoo::ResidualNorms(p, p.InitialPoint());
  Tensor z = p.InitialPoint();
  SolverSummary s;
  solver->Finish(&z, &s);
  EXPECT_LE(MaxAbsDifference(z, solver->returned_state()), 0.0);
  for (int64_t b = 0; b < p.problem.batch_size; ++b) {
    if (std::isfinite(current[b])) {
      EXPECT_LE(returned[b], current[b] * (1 + 1e-12));
    }
    EXPECT_LE(returned[b], initial[b] * (1 + 1e-12));
    EXPECT_NEAR(s.sample_abs_residual[b], returned[b], 1e-12 * (1 + returned[b]));
  }
}

TEST_P(ForwardConformanceTest, DoesNotMutateOrKeepTheInitialPoint) {
  zoo::ZooProblem p =
      Applies(zoo::MakeTanhProblem()) ? zoo::MakeTanhProblem() : zoo::MakeMixedBatchProblem();
  Tensor reference = p.InitialPoint();
  SolverSummary reference_summary;
  {
    auto solver = FixedPointSolver::Create(options());
    solver->Solve(p.problem, &reference, &reference_summary);
  }
  Tensor z0 = p.InitialPoint();
  const Tensor z0_copy = z0.Clone();
  auto solver = FixedPointSolver::Create(options());
  solver->Init(p.problem, z0);
  EXPECT_EQ(MaxAbsDiff(z0, z0_copy), 0.0);
  z0.Fill(123.0);  // the solver must have taken a copy
  while (solver->Step()) {
  }
  Tensor z;  // undefined: Finish allocates
  SolverSummary s;
  solver->Finish(&z, &s);
  EXPECT_EQ(MaxAbsDiff(z, reference), 0.0);
  EXPECT_EQ(s.sample_iterations, reference_summary.sample_iterations);
}

TEST_P(ForwardConformanceTest, ReportsNonFinite) {
  const zoo::ZooProblem p = zoo::MakeNanProblem();
  Tensor z = p.InitialPoint();
  const SolverSummary s = SolveFixedPoint(options(), p.problem, &z);
  EXPECT_EQ(s.termination_type, TerminationType::kNonFinite) << s.FullReport();
  EXPECT_FALSE(s.IsUsable());
  for (int64_t b = 0; b < p.problem.batch_size; ++b) {
    EXPECT_EQ(s.sample_termination[b], TerminationType::kNonFinite) << s.FullReport();
  }
  // The state returned is the best finite iterate, with its true residual.
  EXPECT_FALSE(HasNonFinite(z));
  const std::vector<double> recomputed = zoo::ResidualNorms(p, z);
  for (int64_t b = 0; b < p.problem.batch_size; ++b) {
    EXPECT_TRUE(std::isfinite(s.sample_abs_residual[b]));
    EXPECT_NEAR(s.sample_abs_residual[b], recomputed[b], 1e-12);
  }
}

TEST_P(ForwardConformanceTest, NeverReportsConvergenceWithoutAFixedPoint) {
  const zoo::ZooProblem p = zoo::MakeNoFixedPointProblem();
  Tensor z = p.InitialPoint();
  const SolverSummary s = SolveFixedPoint(options(), p.problem, &z);
  EXPECT_NE(s.termination_type, TerminationType::kConverged);
  EXPECT_FALSE(s.IsUsable());
  for (int64_t b = 0; b < p.problem.batch_size; ++b) {
    EXPECT_NE(s.sample_termination[b], TerminationType::kConverged) << s.FullReport();
    EXPECT_GE(s.sample_abs_residual[b], 0.5);  // f(z) - z >= 1/2 per entry
  }
  EXPECT_FALSE(s.message.empty());
}

TEST_P(ForwardConformanceTest, CallbackCanStopTheSolve) {
  const zoo::ZooProblem p = zoo::MakeMixedBatchProblem();
  ForwardSolverOptions o = options();
  int calls = 0;
  o.callbacks.push_back([&calls](const IterationSummary& s) {
    ++calls;
    return s.iteration >= 1 ? CallbackReturnType::kStop : CallbackReturnType::kContinue;
  });
  Tensor z = p.InitialPoint();
  const SolverSummary s = SolveFixedPoint(o, p.problem, &z);
  EXPECT_GE(calls, 2);
  EXPECT_EQ(s.termination_type, TerminationType::kUserStop) << s.FullReport();
  EXPECT_EQ(s.sample_termination[0], TerminationType::kConverged);  // converged at z0
  EXPECT_EQ(s.sample_termination[2], TerminationType::kUserStop);
  for (int it : s.sample_iterations) EXPECT_LE(it, 1);
  EXPECT_FALSE(s.IsUsable());
}

TEST_P(ForwardConformanceTest, WarmStartAtTheSolutionConvergesAtOnce) {
  for (const zoo::ZooProblem& p : ConvergentZoo()) {
    if (!Applies(p)) continue;
    SCOPED_TRACE(p.name);
    Tensor z = p.Solution();
    const SolverSummary s = SolveFixedPoint(options(), p.problem, &z);
    EXPECT_TRUE(s.IsUsable()) << s.FullReport();
    for (int it : s.sample_iterations) EXPECT_LE(it, 1);
    EXPECT_LE(MaxAbsDifference(z, p.Solution()), tolerances().solution);
  }
}

TEST_P(ForwardConformanceTest, SolvesInFloat32) {
  zoo::ZooProblem p =
      Applies(zoo::MakeTanhProblem()) ? zoo::MakeTanhProblem() : zoo::MakeMixedBatchProblem();
  ForwardSolverOptions o = options();
  o.stop_mode = StopMode::kRelative;
  o.relative_tolerance = tolerances().float32_relative;
  Tensor z = p.InitialPoint().To(DType::kFloat32);
  const SolverSummary s = SolveFixedPoint(o, p.problem, &z);
  EXPECT_TRUE(s.IsUsable()) << s.FullReport();
  EXPECT_EQ(z.dtype(), DType::kFloat32);
  EXPECT_LE(MaxAbsDifference(z, p.Solution()), tolerances().float32_solution);
}

TEST_P(ForwardConformanceTest, AMapThatRebindsItsOutputGivesTheSameSolve) {
  // BatchedMap may hand back the tensor it computed instead of writing into
  // *out. One map returns fresh tensors (the solver takes them over); the
  // other keeps a handle on each and scribbles NaN over all of them at its
  // next call (the solver must copy those, since they are not its alone).
  // Both give the solve of the map that writes into *out, bitwise; the
  // mixed batch ends its samples at different iterations, so calls on some
  // samples only are covered too.
  zoo::ZooProblem p = zoo::MakeMixedBatchProblem();
  Tensor reference = p.InitialPoint();
  const SolverSummary reference_summary = SolveFixedPoint(options(), p.problem, &reference);
  const BatchedMap writes = p.problem.map;
  for (bool keeps_handles : {false, true}) {
    SCOPED_TRACE(keeps_handles ? "keeps handles" : "fresh tensors");
    std::vector<Tensor> kept;
    FixedPointProblem rebinding = p.problem;
    rebinding.map = [&](const Tensor& z, const std::vector<int64_t>& ids, Tensor* out) {
      for (Tensor& earlier : kept) earlier.Fill(std::numeric_limits<double>::quiet_NaN());
      Tensor fresh(out->shape(), out->dtype());
      const bool ok = writes(z, ids, &fresh);
      if (keeps_handles) kept.push_back(fresh);
      *out = fresh;
      return ok;
    };
    Tensor z = p.InitialPoint();
    const SolverSummary s = SolveFixedPoint(options(), rebinding, &z);
    EXPECT_EQ(MaxAbsDiff(z, reference), 0.0) << s.FullReport();
    EXPECT_EQ(s.sample_iterations, reference_summary.sample_iterations);
    EXPECT_EQ(s.termination_type, reference_summary.termination_type);
  }
}

TEST_P(ForwardConformanceTest, RejectsWrongShapes) {
  const zoo::ZooProblem p = zoo::MakeCosProblem();
  Tensor wrong = Tensor::Zeros(Shape{2, 1}, DType::kFloat64);
  EXPECT_THROW(SolveFixedPoint(options(), p.problem, &wrong), Error);
  Tensor empty;
  EXPECT_THROW(SolveFixedPoint(options(), p.problem, &empty), Error);
}

INSTANTIATE_TEST_SUITE_P(AllForwardSolvers,
                         ForwardConformanceTest,
                         ::testing::ValuesIn(AllSolverCases()),
                         [](const ::testing::TestParamInfo<SolverCase>& info) {
                           return info.param.name;
                         });

TEST(ForwardConformance, EveryTypeIsCovered) {
  std::vector<ForwardSolverType> covered;
  for (const SolverCase& c : AllSolverCases()) covered.push_back(c.options.type);
  for (ForwardSolverType type : AllForwardSolverTypes()) {
    EXPECT_NE(std::find(covered.begin(), covered.end(), type), covered.end()) << ToString(type);
  }
}

TEST(ForwardSolverMapOutput, TakesOverAResultItAloneHoldsAndCopiesAShared) {
  const zoo::ZooProblem p = zoo::MakeAffineContraction();
  const BatchedMap writes = p.problem.map;
  Tensor expected(Shape{p.problem.batch_size, p.problem.state_size}, DType::kFloat64);
  std::vector<int64_t> every_sample(p.problem.batch_size);
  for (int64_t b = 0; b < p.problem.batch_size; ++b) every_sample[b] = b;
  ASSERT_TRUE(writes(p.InitialPoint(), every_sample, &expected));
  const ForwardSolverOptions options = BaseOptions(ForwardSolverType::kPicard);

  // A fresh tensor nothing else holds: its storage becomes the map value.
  const double* fresh_data = nullptr;
  FixedPointProblem fresh_problem = p.problem;
  fresh_problem.map = [&](const Tensor& z, const std::vector<int64_t>& ids, Tensor* out) {
    Tensor fresh(out->shape(), out->dtype());
    const bool ok = writes(z, ids, &fresh);
    fresh_data = fresh.data<double>();
    *out = fresh;
    return ok;
  };
  auto taker = FixedPointSolver::Create(options);
  taker->Init(fresh_problem, p.InitialPoint());
  EXPECT_EQ(taker->current_map_value().data<double>(), fresh_data);
  EXPECT_EQ(MaxAbsDiff(taker->current_map_value(), expected), 0.0);

  // A tensor the map keeps: copied, so changing it later leaves the solver's
  // map value alone.
  Tensor kept;
  FixedPointProblem kept_problem = p.problem;
  kept_problem.map = [&](const Tensor& z, const std::vector<int64_t>& ids, Tensor* out) {
    kept = Tensor(out->shape(), out->dtype());
    const bool ok = writes(z, ids, &kept);
    *out = kept;
    return ok;
  };
  auto copier = FixedPointSolver::Create(options);
  copier->Init(kept_problem, p.InitialPoint());
  EXPECT_NE(copier->current_map_value().data<double>(), kept.data<double>());
  kept.Fill(-7.0);
  EXPECT_EQ(MaxAbsDiff(copier->current_map_value(), expected), 0.0);
}

TEST(ForwardSolverMapOutput, AResultOfTheWrongShapeIsNamed) {
  const zoo::ZooProblem p = zoo::MakeAffineContraction();
  FixedPointProblem wrong = p.problem;
  wrong.map = [](const Tensor&, const std::vector<int64_t>& ids, Tensor* out) {
    *out = Tensor::Zeros(Shape{static_cast<int64_t>(ids.size()), 7}, out->dtype());
    return true;
  };
  Tensor z = p.InitialPoint();
  try {
    SolveFixedPoint(BaseOptions(ForwardSolverType::kAnderson), wrong, &z);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("map wrote"), std::string::npos) << what;
    EXPECT_NE(what.find("[3, 7]"), std::string::npos) << what;
    EXPECT_NE(what.find("[3, 200]"), std::string::npos) << what;
  }
}

TEST(ForwardConformance, LbfgsWithoutEnergyIsMisuse) {
  const zoo::ZooProblem p = zoo::MakeTanhProblem();  // no energy
  Tensor z = p.InitialPoint();
  EXPECT_THROW(SolveFixedPoint(BaseOptions(ForwardSolverType::kCeresLbfgs), p.problem, &z), Error);
}

}  // namespace
}  // namespace stillpoint::forward_conformance_test
