// The fallback chain: per-sample hand-over to the next solver, honest
// merging of the results.
#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "solvers/fixed_point_solver.h"
#include "tests/solvers/problems.h"

namespace stillpoint::fallback_test {
namespace {

ForwardSolverOptions Options(ForwardSolverType type) {
  ForwardSolverOptions o;
  o.type = type;
  o.stop_mode = StopMode::kAbsolute;
  o.absolute_tolerance = 1e-10;
  o.max_iterations = 60;
  return o;
}

// z = 1.5 R z + b with R a rotation by 1 radian in the (0, 1) and (2, 3)
// planes: a fixed point exists, but plain iteration runs away from it.
struct ExpansiveMap {
  FixedPointProblem problem;
  Tensor solution;
};

ExpansiveMap MakeExpansiveMap() {
  Eigen::Matrix4d a = Eigen::Matrix4d::Zero();
  const double c = 1.5 * std::cos(1.0);
  const double s = 1.5 * std::sin(1.0);
  a.block<2, 2>(0, 0) << c, -s, s, c;
  a.block<2, 2>(2, 2) << c, s, -s, c;
  const Eigen::Vector4d b(1.0, -0.5, 0.25, 2.0);
  ExpansiveMap m;
  m.problem.batch_size = 2;
  m.problem.state_size = 4;
  m.problem.map = [a, b](const Tensor& z, const std::vector<int64_t>& ids, Tensor* out) {
    for (size_t r = 0; r < ids.size(); ++r) {
      Eigen::Vector4d zr;
      for (int i = 0; i < 4; ++i) zr(i) = z.at(r * 4 + i);
      const Eigen::Vector4d f = a * zr + static_cast<double>(ids[r] + 1) * b;
      for (int i = 0; i < 4; ++i) out->set(r * 4 + i, f(i));
    }
    return true;
  };
  m.solution = Tensor(Shape{2, 4}, DType::kFloat64);
  for (int sample = 0; sample < 2; ++sample) {
    const Eigen::Vector4d x =
        (Eigen::Matrix4d::Identity() - a).partialPivLu().solve((sample + 1.0) * b);
    for (int i = 0; i < 4; ++i) m.solution.set(sample * 4 + i, x(i));
  }
  return m;
}

TEST(Fallback, RecoversDivergedSamplesWithTheNextSolver) {
  const ExpansiveMap m = MakeExpansiveMap();
  ForwardSolverOptions o = Options(ForwardSolverType::kPicard);
  o.stagnation_window = 0;  // let the protective break catch the growth
  Tensor alone = Tensor::Zeros(Shape{2, 4}, DType::kFloat64);
  const SolverSummary without = SolveFixedPoint(o, m.problem, &alone);
  ASSERT_EQ(without.termination_type, TerminationType::kDiverged) << without.FullReport();

  o.fallback_chain = {ForwardSolverType::kAnderson};
  Tensor z = Tensor::Zeros(Shape{2, 4}, DType::kFloat64);
  const SolverSummary s = SolveFixedPoint(o, m.problem, &z);
  EXPECT_TRUE(s.IsUsable()) << s.FullReport();
  EXPECT_LE(MaxAbsDiff(z, m.solution), 1e-8);
  ASSERT_EQ(s.fallbacks.size(), 1u);
  EXPECT_EQ(s.fallbacks[0].from, ForwardSolverType::kPicard);
  EXPECT_EQ(s.fallbacks[0].to, ForwardSolverType::kAnderson);
  EXPECT_EQ(s.fallbacks[0].samples_tried, 2);
  EXPECT_EQ(s.fallbacks[0].samples_recovered, 2);
  for (int64_t b = 0; b < 2; ++b) {
    EXPECT_EQ(s.sample_solver[b], ForwardSolverType::kAnderson);
    // Iterations add up over the chain.
    EXPECT_GT(s.sample_iterations[b], without.sample_iterations[b]);
  }
  EXPECT_GT(s.function_evaluations, without.function_evaluations);
  EXPECT_NE(s.message.find("picard -> anderson"), std::string::npos) << s.message;
  EXPECT_NE(s.FullReport().find("(by anderson)"), std::string::npos);
}

TEST(Fallback, OnlySamplesThatNeedItAreHandedOver) {
  zoo::ZooProblem p = zoo::MakeMixedBatchProblem();
  p.log->log_calls = true;
  ForwardSolverOptions o = Options(ForwardSolverType::kPicard);
  o.max_iterations = 8;
  o.fallback_residual_threshold = 0.0;  // every unconverged sample
  o.fallback_chain = {ForwardSolverType::kNewtonKrylov, ForwardSolverType::kAnderson};
  Tensor z = p.InitialPoint();
  const SolverSummary s = SolveFixedPoint(o, p.problem, &z);
  EXPECT_TRUE(s.IsUsable()) << s.FullReport();
  EXPECT_EQ(s.sample_solver[0], ForwardSolverType::kPicard);  // converged at z0
  EXPECT_EQ(s.sample_iterations[0], 0);
  ASSERT_EQ(s.fallbacks.size(), 1u) << "the chain stops once every sample is fine";
  EXPECT_EQ(s.fallbacks[0].samples_tried, 3);
  for (int64_t b = 1; b < 4; ++b) {
    EXPECT_EQ(s.sample_solver[b], ForwardSolverType::kNewtonKrylov);
    EXPECT_GT(s.sample_iterations[b], 8);
  }
  // The map of the fallback solve saw the original sample ids, never sample 0.
  int64_t calls_with_sample0 = 0;
  for (const auto& ids : p.log->map_calls) {
    calls_with_sample0 += std::count(ids.begin(), ids.end(), 0);
  }
  EXPECT_EQ(calls_with_sample0, 1);
  EXPECT_LE(MaxAbsDiff(z, p.Solution()), 1e-8);
}

TEST(Fallback, UnrecoverableSamplesStayHonest) {
  const zoo::ZooProblem p = zoo::MakeNanProblem();
  ForwardSolverOptions o = Options(ForwardSolverType::kBroyden);
  o.fallback_chain = {ForwardSolverType::kAnderson, ForwardSolverType::kPicard};
  Tensor z = p.InitialPoint();
  const SolverSummary s = SolveFixedPoint(o, p.problem, &z);
  EXPECT_EQ(s.termination_type, TerminationType::kNonFinite) << s.FullReport();
  ASSERT_EQ(s.fallbacks.size(), 2u);
  for (const FallbackRecord& record : s.fallbacks) EXPECT_EQ(record.samples_recovered, 0);
  EXPECT_FALSE(HasNonFinite(z));
  const std::vector<double> recomputed = zoo::ResidualNorms(p, z);
  for (int64_t b = 0; b < p.problem.batch_size; ++b) {
    EXPECT_NEAR(s.sample_abs_residual[b], recomputed[b], 1e-12);
  }
}

// Slow for Picard, fast for Anderson.
FixedPointProblem SlowMap() { return zoo::MakeSlowTridiagonalMap(60, 2, 0.2); }

TEST(Fallback, ResidualThresholdDecidesForMaxIterations) {
  const FixedPointProblem p = SlowMap();
  ForwardSolverOptions o = Options(ForwardSolverType::kPicard);
  o.absolute_tolerance = 1e-6;
  o.max_iterations = 100;
  o.fallback_chain = {ForwardSolverType::kAnderson};
  o.fallback_residual_threshold = 1e9;  // anything is good enough
  Tensor z = Tensor::Zeros(Shape{2, 60}, DType::kFloat64);
  const SolverSummary s = SolveFixedPoint(o, p, &z);
  EXPECT_EQ(s.termination_type, TerminationType::kMaxIterations) << s.FullReport();
  EXPECT_TRUE(s.fallbacks.empty());

  o.fallback_residual_threshold = 1e-4;  // both samples end above it
  z = Tensor::Zeros(Shape{2, 60}, DType::kFloat64);
  const SolverSummary again = SolveFixedPoint(o, p, &z);
  EXPECT_TRUE(again.IsUsable()) << again.FullReport();
  ASSERT_EQ(again.fallbacks.size(), 1u);
  EXPECT_EQ(again.fallbacks[0].samples_recovered, 2);
  EXPECT_NE(again.message.find("Status after fallbacks: 2/2 samples converged"), std::string::npos)
      << again.message;
}

TEST(Fallback, LinksThatCannotRunAreSkippedAndSaidSo) {
  const ExpansiveMap m = MakeExpansiveMap();  // no energy
  ForwardSolverOptions o = Options(ForwardSolverType::kPicard);
  o.fallback_chain = {ForwardSolverType::kCeresLbfgs, ForwardSolverType::kBroyden};
  Tensor z = Tensor::Zeros(Shape{2, 4}, DType::kFloat64);
  const SolverSummary s = SolveFixedPoint(o, m.problem, &z);
  EXPECT_NE(s.message.find("ceres_lbfgs skipped"), std::string::npos) << s.message;
  ASSERT_EQ(s.fallbacks.size(), 1u);
  EXPECT_EQ(s.fallbacks[0].to, ForwardSolverType::kBroyden);
  EXPECT_TRUE(s.IsUsable()) << s.FullReport();
}

}  // namespace
}  // namespace stillpoint::fallback_test
