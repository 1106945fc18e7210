// The adjoint linear solvers on explicit per-sample matrices J_b, where the
// exact solution of w = g + J^T w is known from a dense LU.
#include "solvers/adjoint.h"

#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "framework/parallel.h"
#include "framework/random.h"

namespace stillpoint::adjoint_test {
namespace {

// Per-sample Jacobians and the VJP they define.
struct LinearAdjoint {
  std::vector<Eigen::MatrixXd> jacobians;
  int64_t vjp_calls = 0;

  int64_t batch() const { return static_cast<int64_t>(jacobians.size()); }
  int64_t n() const { return jacobians[0].rows(); }

  BatchedVjp Vjp() {
    return [this](const Tensor& v, Tensor* out) {
      ++vjp_calls;
      const int64_t n_ = n();
      for (int64_t b = 0; b < batch(); ++b) {
        Eigen::VectorXd vb(n_);
        for (int64_t i = 0; i < n_; ++i) vb(i) = v.at(b * n_ + i);
        const Eigen::VectorXd r = jacobians[b].transpose() * vb;
        for (int64_t i = 0; i < n_; ++i) out->set(b * n_ + i, r(i));
      }
    };
  }

  // (I - J_b^T)^{-1} g_b.
  Tensor Exact(const Tensor& g) const {
    Tensor w(g.shape(), g.dtype());
    const int64_t n_ = n();
    for (int64_t b = 0; b < batch(); ++b) {
      Eigen::MatrixXd a = Eigen::MatrixXd::Identity(n_, n_) - jacobians[b].transpose();
      Eigen::VectorXd gb(n_);
      for (int64_t i = 0; i < n_; ++i) gb(i) = g.at(b * n_ + i);
      const Eigen::VectorXd x = a.partialPivLu().solve(gb);
      for (int64_t i = 0; i < n_; ++i) w.set(b * n_ + i, x(i));
    }
    return w;
  }
};

// Random J_b with spectral norm `norm`; symmetric if asked.
LinearAdjoint MakeLinear(int64_t batch, int64_t n, double norm, bool symmetric, uint64_t seed) {
  Rng rng(seed);
  LinearAdjoint linear;
  for (int64_t b = 0; b < batch; ++b) {
    Eigen::MatrixXd m(n, n);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) m(i, j) = rng.Normal();
    }
    if (symmetric) m = 0.5 * (m + m.transpose()).eval();
    // Square: no QR preconditioner needed (and far less to compile).
    const double spectral =
        Eigen::JacobiSVD<Eigen::MatrixXd, Eigen::NoQRPreconditioner>(m).singularValues()(0);
    linear.jacobians.push_back(m * (norm / spectral));
  }
  return linear;
}

Tensor RandomRhs(int64_t batch, int64_t n, uint64_t seed, DType dtype = DType::kFloat64) {
  Rng rng(seed);
  return RandomNormal(Shape{batch, n}, 0.0, 1.0, dtype, rng);
}

double RelativeDiff(const Tensor& a, const Tensor& b) {
  double diff = 0.0, norm = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    diff += (a.at(i) - b.at(i)) * (a.at(i) - b.at(i));
    norm += b.at(i) * b.at(i);
  }
  return std::sqrt(diff / norm);
}

BackwardOptions Options(AdjointSolverType solver, double tolerance = 1e-10) {
  BackwardOptions options;
  options.solver = solver;
  options.tolerance = tolerance;
  options.max_iterations = 300;
  options.neumann_terms = 300;
  return options;
}

class AdjointSolverTest : public ::testing::TestWithParam<AdjointSolverType> {};

TEST_P(AdjointSolverTest, AgreesWithDenseOnSymmetricContraction) {
  // Symmetric J with ||J|| = 0.7: I - J is SPD, so every solver applies.
  LinearAdjoint linear = MakeLinear(3, 12, 0.7, true, 1);
  const Tensor g = RandomRhs(3, 12, 2);
  Tensor dense;
  const AdjointSummary dense_summary =
      SolveAdjoint(Options(AdjointSolverType::kDense), linear.Vjp(), g, &dense);
  ASSERT_TRUE(dense_summary.IsUsable()) << dense_summary.FullReport();
  EXPECT_LT(RelativeDiff(dense, linear.Exact(g)), 1e-12);

  Tensor w;
  const AdjointSummary summary = SolveAdjoint(Options(GetParam()), linear.Vjp(), g, &w);
  EXPECT_TRUE(summary.IsUsable()) << summary.FullReport();
  EXPECT_EQ(summary.solver, GetParam());
  EXPECT_LE(summary.MaxRelResidual(), 1e-10) << summary.FullReport();
  EXPECT_LT(RelativeDiff(w, dense), 1e-8) << summary.FullReport();
  EXPECT_EQ(summary.sample_iterations.size(), 3u);
  EXPECT_GT(summary.vjp_evaluations, 0);
}

TEST_P(AdjointSolverTest, FloatStatesWork) {
  LinearAdjoint linear = MakeLinear(2, 8, 0.5, true, 3);
  const Tensor g = RandomRhs(2, 8, 4, DType::kFloat32);
  Tensor w;
  const AdjointSummary summary = SolveAdjoint(Options(GetParam(), 1e-5), linear.Vjp(), g, &w);
  EXPECT_EQ(w.dtype(), DType::kFloat32);
  EXPECT_TRUE(summary.IsUsable()) << summary.FullReport();
  EXPECT_LT(RelativeDiff(w, linear.Exact(g.To(DType::kFloat64))), 1e-4);
}

TEST_P(AdjointSolverTest, ZeroGradientSampleConvergesAtOnce) {
  LinearAdjoint linear = MakeLinear(2, 6, 0.5, true, 5);
  Tensor g = RandomRhs(2, 6, 6);
  for (int64_t i = 0; i < 6; ++i) g.set(6 + i, 0.0);  // sample 1: g = 0
  Tensor w;
  const AdjointSummary summary = SolveAdjoint(Options(GetParam()), linear.Vjp(), g, &w);
  EXPECT_TRUE(summary.IsUsable()) << summary.FullReport();
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(w.at(6 + i), 0.0);
}

// A warm start elsewhere than 0 for a sample whose g is 0 (an inner adjoint
// of a nested solve gets such rows): its solution is 0 exactly, and without
// starting that row there the sample could only approach it and end
// MAX_ITERATIONS (its tolerance is relative to |g| = 0). The caller's start
// is not modified.
TEST_P(AdjointSolverTest, ZeroGradientSampleConvergesAtOnceFromAWarmStart) {
  LinearAdjoint linear = MakeLinear(2, 6, 0.5, true, 5);
  Tensor g = RandomRhs(2, 6, 6);
  for (int64_t i = 0; i < 6; ++i) g.set(6 + i, 0.0);  // sample 1: g = 0
  const Tensor start = RandomRhs(2, 6, 9);
  Tensor w = start;
  const AdjointSummary summary =
      SolveAdjoint(Options(GetParam(), 1e-8), linear.Vjp(), g, &w);
  EXPECT_TRUE(summary.IsUsable()) << summary.FullReport();
  ASSERT_EQ(summary.sample_termination.size(), 2u);
  EXPECT_EQ(summary.sample_termination[1], TerminationType::kConverged) << summary.FullReport();
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(w.at(6 + i), 0.0);
  EXPECT_LT(RelativeDiff(w, linear.Exact(g)), 1e-6);
  EXPECT_NE(start.at(6), 0.0);  // the start given is unchanged
}

TEST_P(AdjointSolverTest, WarmStartAtTheSolutionNeedsNoIterations) {
  LinearAdjoint linear = MakeLinear(2, 6, 0.5, true, 7);
  const Tensor g = RandomRhs(2, 6, 8);
  Tensor w = linear.Exact(g);
  const AdjointSummary summary = SolveAdjoint(Options(GetParam(), 1e-8), linear.Vjp(), g, &w);
  EXPECT_TRUE(summary.IsUsable()) << summary.FullReport();
  if (GetParam() == AdjointSolverType::kDense) {
    // The dense solve is exact and ignores the start (n VJPs regardless).
    EXPECT_FALSE(summary.warm_started);
    EXPECT_EQ(summary.iterations, 6);
    return;
  }
  EXPECT_TRUE(summary.warm_started);
  EXPECT_EQ(summary.iterations, 0) << summary.FullReport();
}

INSTANTIATE_TEST_SUITE_P(AllAdjointSolvers,
                         AdjointSolverTest,
                         ::testing::ValuesIn(AllAdjointSolverTypes()),
                         [](const ::testing::TestParamInfo<AdjointSolverType>& info) {
                           return std::string(ToString(info.param));
                         });

TEST(AdjointSolver, NonSymmetricSolversAgreeWithDense) {
  LinearAdjoint linear = MakeLinear(3, 10, 0.8, false, 11);
  const Tensor g = RandomRhs(3, 10, 12);
  const Tensor exact = linear.Exact(g);
  for (AdjointSolverType solver :
       {AdjointSolverType::kFixedPoint, AdjointSolverType::kAnderson, AdjointSolverType::kBroyden,
        AdjointSolverType::kGmres, AdjointSolverType::kNeumann, AdjointSolverType::kDense}) {
    Tensor w;
    const AdjointSummary summary = SolveAdjoint(Options(solver), linear.Vjp(), g, &w);
    EXPECT_TRUE(summary.IsUsable()) << summary.FullReport();
    EXPECT_LT(RelativeDiff(w, exact), 1e-8) << ToString(solver);
  }
}

TEST(AdjointSolver, ResultsDoNotDependOnThreadCount) {
  LinearAdjoint linear = MakeLinear(5, 12, 0.8, true, 31);
  const Tensor g = RandomRhs(5, 12, 32);
  for (AdjointSolverType solver :
       {AdjointSolverType::kGmres, AdjointSolverType::kMinres,
        AdjointSolverType::kConjugateGradient, AdjointSolverType::kDense}) {
    Tensor one_thread, two_threads;
    {
      ScopedNumThreads threads(1);
      SolveAdjoint(Options(solver), linear.Vjp(), g, &one_thread);
    }
    {
      ScopedNumThreads threads(2);
      SolveAdjoint(Options(solver), linear.Vjp(), g, &two_threads);
    }
    EXPECT_EQ(MaxAbsDiff(one_thread, two_threads), 0.0) << ToString(solver);
  }
}

TEST(AdjointSolver, NeumannConvergesToDenseAsTermsGrow) {
  LinearAdjoint linear = MakeLinear(2, 8, 0.6, false, 13);
  const Tensor g = RandomRhs(2, 8, 14);
  const Tensor exact = linear.Exact(g);
  double previous = 1e300;
  for (int terms : {0, 2, 5, 10, 20, 40}) {
    BackwardOptions options = Options(AdjointSolverType::kNeumann, 0.0);
    options.neumann_terms = terms;
    Tensor w;
    const AdjointSummary summary = SolveAdjoint(options, linear.Vjp(), g, &w);
    const double error = RelativeDiff(w, exact);
    EXPECT_LT(error, previous) << terms << " terms";
    // The error of k terms is (J^T)^{k+1} (I - J^T)^{-1} g: at most
    // 0.6^(k+1) / 0.4 relative.
    EXPECT_LT(error, std::pow(0.6, terms + 1) / 0.4 * 1.01) << terms << " terms";
    EXPECT_EQ(summary.iterations, terms);
    previous = error;
  }
}

// Tolerance 0 asks for the truncated series of neumann_terms terms. A float32
// VJP of a strong contraction reaches its own fixed point (residual exactly 0
// in float32 arithmetic) after a few terms; the series still runs every term,
// and the samples end INEXACT (a truncation by design), not CONVERGED.
TEST(AdjointSolver, NeumannAtToleranceZeroCountsEveryTerm) {
  LinearAdjoint linear = MakeLinear(3, 6, 0.1, false, 15);
  const Tensor g = RandomRhs(3, 6, 16, DType::kFloat32);
  BackwardOptions options = Options(AdjointSolverType::kNeumann, 0.0);
  options.neumann_terms = 60;
  Tensor w;
  const AdjointSummary summary = SolveAdjoint(options, linear.Vjp(), g, &w);
  for (int64_t b = 0; b < 3; ++b) {
    EXPECT_EQ(summary.sample_iterations[b], 60) << summary.FullReport();
    EXPECT_EQ(summary.sample_termination[b], TerminationType::kInexact) << summary.FullReport();
  }
  EXPECT_EQ(summary.termination_type, TerminationType::kInexact);
  EXPECT_EQ(summary.vjp_evaluations, 61);  // 60 terms + the final residual
  EXPECT_TRUE(summary.HasResiduals());     // measured, unlike the inexact modes
  EXPECT_LT(RelativeDiff(w.To(DType::kFloat64), linear.Exact(g.To(DType::kFloat64))), 1e-6);
  EXPECT_NE(summary.message.find("fixed budget"), std::string::npos) << summary.message;
  // With a tolerance the series stops where it is met, and says CONVERGED.
  options.tolerance = 1e-5;
  const AdjointSummary early = SolveAdjoint(options, linear.Vjp(), g, &w);
  EXPECT_EQ(early.termination_type, TerminationType::kConverged) << early.FullReport();
  EXPECT_LT(early.iterations, 60);
}

TEST(AdjointSolver, GmresWithSmallRestartConverges) {
  LinearAdjoint linear = MakeLinear(2, 16, 0.9, false, 15);
  const Tensor g = RandomRhs(2, 16, 16);
  BackwardOptions options = Options(AdjointSolverType::kGmres);
  options.gmres_restart = 3;
  Tensor w;
  const AdjointSummary summary = SolveAdjoint(options, linear.Vjp(), g, &w);
  EXPECT_TRUE(summary.IsUsable()) << summary.FullReport();
  EXPECT_LT(RelativeDiff(w, linear.Exact(g)), 1e-8);
}

TEST(AdjointSolver, ExpansiveJacobianFixedPointReportsFailureGmresSolves) {
  // Symmetric J with eigenvalues in [1.2, 2]: I - J is negative definite.
  // The fixed-point iteration cannot converge and must say so; GMRES and
  // MINRES solve the system; CG detects that I - J is not positive definite.
  LinearAdjoint linear;
  Rng rng(17);
  for (int b = 0; b < 2; ++b) {
    Eigen::MatrixXd m(8, 8);
    for (int i = 0; i < 8; ++i) {
      for (int j = 0; j < 8; ++j) m(i, j) = rng.Normal();
    }
    const Eigen::HouseholderQR<Eigen::MatrixXd> qr(m);
    const Eigen::MatrixXd q = qr.householderQ();
    Eigen::VectorXd eigenvalues(8);
    for (int i = 0; i < 8; ++i) eigenvalues(i) = 1.2 + 0.8 * i / 7.0;
    linear.jacobians.push_back(q * eigenvalues.asDiagonal() * q.transpose());
  }
  const Tensor g = RandomRhs(2, 8, 18);
  const Tensor exact = linear.Exact(g);

  Tensor w;
  AdjointSummary summary =
      SolveAdjoint(Options(AdjointSolverType::kFixedPoint), linear.Vjp(), g, &w);
  EXPECT_FALSE(summary.IsUsable()) << summary.FullReport();
  EXPECT_NE(summary.termination_type, TerminationType::kConverged);

  for (AdjointSolverType solver :
       {AdjointSolverType::kGmres, AdjointSolverType::kMinres, AdjointSolverType::kDense}) {
    Tensor x;
    summary = SolveAdjoint(Options(solver), linear.Vjp(), g, &x);
    EXPECT_TRUE(summary.IsUsable()) << summary.FullReport();
    EXPECT_LT(RelativeDiff(x, exact), 1e-8) << ToString(solver);
  }

  Tensor cg;
  summary = SolveAdjoint(Options(AdjointSolverType::kConjugateGradient), linear.Vjp(), g, &cg);
  EXPECT_FALSE(summary.IsUsable());
  EXPECT_EQ(summary.CountSamples(TerminationType::kLinearAlgebraFailure), 2)
      << summary.FullReport();
}

TEST(AdjointSolver, NonFiniteVjpFallsBackToG) {
  LinearAdjoint linear = MakeLinear(2, 4, 0.5, true, 19);  // symmetric, for cg
  linear.jacobians[1](0, 0) = std::numeric_limits<double>::quiet_NaN();
  const Tensor g = RandomRhs(2, 4, 20);
  for (AdjointSolverType solver : {AdjointSolverType::kGmres, AdjointSolverType::kNeumann,
                                   AdjointSolverType::kConjugateGradient}) {
    Tensor w;
    const AdjointSummary summary = SolveAdjoint(Options(solver), linear.Vjp(), g, &w);
    EXPECT_EQ(summary.sample_termination[0], TerminationType::kConverged) << ToString(solver);
    EXPECT_EQ(summary.sample_termination[1], TerminationType::kNonFinite)
        << ToString(solver) << "\n"
        << summary.FullReport();
    EXPECT_EQ(summary.termination_type, TerminationType::kNonFinite);
    for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(w.at(4 + i), g.at(4 + i)) << ToString(solver);
  }
}

TEST(AdjointSolver, DenseRefusesLargeStates) {
  LinearAdjoint linear = MakeLinear(1, 6, 0.5, false, 21);
  const Tensor g = RandomRhs(1, 6, 22);
  BackwardOptions options = Options(AdjointSolverType::kDense);
  options.dense_max_state_size = 5;
  Tensor w;
  try {
    SolveAdjoint(options, linear.Vjp(), g, &w);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dense_max_state_size"), std::string::npos) << e.what();
  }
}

TEST(AdjointSolver, DenseReportsSingularSystem) {
  LinearAdjoint linear;
  linear.jacobians.push_back(Eigen::MatrixXd::Identity(3, 3));  // I - J = 0
  const Tensor g = RandomRhs(1, 3, 23);
  Tensor w;
  const AdjointSummary summary =
      SolveAdjoint(Options(AdjointSolverType::kDense), linear.Vjp(), g, &w);
  EXPECT_EQ(summary.termination_type, TerminationType::kLinearAlgebraFailure)
      << summary.FullReport();
}

// The dense solve is exact: at tolerance 0 (no tolerance to meet) its
// samples are CONVERGED, not MAX_ITERATIONS, and its solution is exact.
TEST(AdjointSolver, DenseAtToleranceZeroConverges) {
  LinearAdjoint linear = MakeLinear(3, 5, 0.7, /*symmetric=*/false, 31);
  const Tensor g = RandomRhs(3, 5, 32);
  Tensor w;
  const AdjointSummary summary =
      SolveAdjoint(Options(AdjointSolverType::kDense, 0.0), linear.Vjp(), g, &w);
  EXPECT_EQ(summary.termination_type, TerminationType::kConverged) << summary.FullReport();
  EXPECT_EQ(summary.CountSamples(TerminationType::kConverged), 3) << summary.FullReport();
  const Tensor exact = linear.Exact(g);
  for (int64_t i = 0; i < g.numel(); ++i) EXPECT_NEAR(w.at(i), exact.at(i), 1e-12);
}

TEST(AdjointSolver, MaxIterationsIsReported) {
  LinearAdjoint linear = MakeLinear(2, 20, 0.95, false, 25);
  const Tensor g = RandomRhs(2, 20, 26);
  BackwardOptions options = Options(AdjointSolverType::kGmres);
  options.max_iterations = 3;
  Tensor w;
  const AdjointSummary summary = SolveAdjoint(options, linear.Vjp(), g, &w);
  EXPECT_EQ(summary.termination_type, TerminationType::kMaxIterations) << summary.FullReport();
  EXPECT_EQ(summary.iterations, 3);
  EXPECT_GT(summary.MaxRelResidual(), options.tolerance);
}

// SolveAdjointFromStart: a start near the solution (the solution for a
// nearby right-hand side) saves VJPs; a start that makes the solve miss its
// tolerance within the budget and was worse than g is solved again from g,
// which meets it; one better than g is kept.
TEST(AdjointFromStart, ANearbySolutionSavesVjps) {
  LinearAdjoint linear = MakeLinear(3, 10, 0.8, false, 41);
  const Tensor g = RandomRhs(3, 10, 42);
  Tensor nearby_g = g.Clone();
  for (int64_t i = 0; i < nearby_g.numel(); ++i) nearby_g.set(i, g.at(i) * (1.0 + 1e-9 * i));
  Tensor start;
  ASSERT_TRUE(
      SolveAdjoint(Options(AdjointSolverType::kFixedPoint), linear.Vjp(), nearby_g, &start)
          .IsUsable());
  Tensor from_g;
  const AdjointSummary cold =
      SolveAdjoint(Options(AdjointSolverType::kFixedPoint), linear.Vjp(), g, &from_g);
  Tensor w = start;
  const AdjointSummary warm =
      SolveAdjointFromStart(Options(AdjointSolverType::kFixedPoint), linear.Vjp(), g, &w);
  EXPECT_TRUE(warm.IsUsable()) << warm.FullReport();
  EXPECT_TRUE(warm.warm_started);
  EXPECT_LT(warm.vjp_evaluations * 2, cold.vjp_evaluations)
      << "from the start " << warm.vjp_evaluations << ", from g " << cold.vjp_evaluations;
  EXPECT_LT(RelativeDiff(w, linear.Exact(g)), 1e-8);
  EXPECT_EQ(warm.message.find("solved again"), std::string::npos) << warm.message;
}

// J_b = 0.5 I (6 x 6) for two samples: from any start the fixed-point
// adjoint's relative residual halves with every iteration.
LinearAdjoint HalfIdentity() {
  LinearAdjoint linear;
  for (int b = 0; b < 2; ++b) linear.jacobians.push_back(0.5 * Eigen::MatrixXd::Identity(6, 6));
  return linear;
}

// The fixed-point adjoint to 1e-5 with `iterations` at most.
BackwardOptions FixedPointBudget(int iterations) {
  BackwardOptions options = Options(AdjointSolverType::kFixedPoint, 1e-5);
  options.max_iterations = iterations;
  return options;
}

TEST(AdjointFromStart, AStartThatMissesTheToleranceIsSolvedAgainFromG) {
  // J = 0.5 I: from g the relative residual is 0.5^(k+1) after k
  // iterations (tolerance 1e-5 met at k = 16); from -10 w* it is 11 0.5^k
  // (met at k = 21). A budget of 18 separates the two.
  LinearAdjoint linear = HalfIdentity();
  const Tensor g = RandomRhs(2, 6, 43);
  const BackwardOptions options = FixedPointBudget(18);
  const Tensor exact = linear.Exact(g);
  Tensor bad_start(exact.shape(), DType::kFloat64);
  for (int64_t i = 0; i < exact.numel(); ++i) bad_start.set(i, -10.0 * exact.at(i));

  Tensor plain = bad_start.Clone();
  const AdjointSummary missed = SolveAdjoint(options, linear.Vjp(), g, &plain);
  ASSERT_NE(missed.termination_type, TerminationType::kConverged) << missed.FullReport();

  Tensor w = bad_start.Clone();
  linear.vjp_calls = 0;
  const AdjointSummary summary = SolveAdjointFromStart(options, linear.Vjp(), g, &w);
  EXPECT_EQ(summary.termination_type, TerminationType::kConverged) << summary.FullReport();
  EXPECT_LE(summary.MaxRelResidual(), 1e-5);
  EXPECT_LT(RelativeDiff(w, exact), 1e-4);
  EXPECT_EQ(summary.vjp_evaluations, linear.vjp_calls);
  EXPECT_GT(summary.vjp_evaluations, options.max_iterations);
  EXPECT_NE(summary.message.find("solved again from g, kept the solution from g"),
            std::string::npos)
      << summary.message;
}

TEST(AdjointFromStart, AStartBetterThanGIsKeptWhenBothMiss) {
  // J = 0.5 I, budget 10: from g (first relative residual 0.5) the solve
  // cannot reach 1e-5; from w* - 0.3 (w* - g) (first residual 0.15) neither,
  // but it ends closer, so it is kept without a second solve.
  LinearAdjoint linear = HalfIdentity();
  const Tensor g = RandomRhs(2, 6, 46);
  const BackwardOptions options = FixedPointBudget(10);
  const Tensor exact = linear.Exact(g);
  Tensor start(exact.shape(), DType::kFloat64);
  for (int64_t i = 0; i < exact.numel(); ++i) {
    start.set(i, exact.at(i) - 0.3 * (exact.at(i) - g.at(i)));
  }
  Tensor from_g;
  const AdjointSummary cold = SolveAdjoint(options, linear.Vjp(), g, &from_g);
  ASSERT_NE(cold.termination_type, TerminationType::kConverged) << cold.FullReport();

  Tensor w = start.Clone();
  linear.vjp_calls = 0;
  const AdjointSummary summary = SolveAdjointFromStart(options, linear.Vjp(), g, &w);
  EXPECT_NE(summary.termination_type, TerminationType::kConverged);
  EXPECT_LT(summary.MaxRelResidual(), cold.MaxRelResidual());
  // The solve from the start plus the one VJP that judged g; no second solve.
  EXPECT_EQ(summary.vjp_evaluations, linear.vjp_calls);
  EXPECT_LE(summary.vjp_evaluations, options.max_iterations + 2);
  EXPECT_NE(summary.message.find("kept it, as g was no better a start"), std::string::npos)
      << summary.message;
}

TEST(AdjointFromStart, NeedsAStart) {
  LinearAdjoint linear = MakeLinear(1, 3, 0.5, false, 44);
  Tensor w;
  EXPECT_THROW(SolveAdjointFromStart(Options(AdjointSolverType::kFixedPoint), linear.Vjp(),
                                     RandomRhs(1, 3, 45), &w),
               Error);
}

TEST(AdjointSolver, ShapeMismatchIsMisuse) {
  LinearAdjoint linear = MakeLinear(2, 4, 0.5, false, 27);
  const Tensor g = RandomRhs(2, 4, 28);
  Tensor w = Tensor::Zeros(Shape{2, 5}, DType::kFloat64);
  EXPECT_THROW(SolveAdjoint(Options(AdjointSolverType::kGmres), linear.Vjp(), g, &w), Error);
}

TEST(AdjointSolver, AVjpThatRebindsItsOutputToTheWrongShapeIsNamed) {
  // Both ways a solver reads the VJP: the fixed-point iteration on the
  // state's rows and GMRES on float64 rows.
  LinearAdjoint linear = MakeLinear(2, 4, 0.5, false, 30);
  const Tensor g = RandomRhs(2, 4, 31);
  const BatchedVjp wrong = [](const Tensor&, Tensor* out) {
    *out = Tensor::Zeros(Shape{2, 5}, out->dtype());
  };
  for (AdjointSolverType type : {AdjointSolverType::kFixedPoint, AdjointSolverType::kGmres}) {
    Tensor w;
    try {
      SolveAdjoint(Options(type), wrong, g, &w);
      FAIL() << "expected an error for " << ToString(type);
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("VJP"), std::string::npos) << what;
      EXPECT_NE(what.find("[2, 5]"), std::string::npos) << what;
      EXPECT_NE(what.find("[2, 4]"), std::string::npos) << what;
    }
  }
}

TEST(BackwardOptions, IsValidNamesTheField) {
  BackwardOptions options;
  std::string error;
  EXPECT_TRUE(options.IsValid(&error)) << error;
  options.phantom_tau = 1.5;
  EXPECT_FALSE(options.IsValid(&error));
  EXPECT_NE(error.find("phantom_tau"), std::string::npos) << error;
  options = BackwardOptions();
  options.gmres_restart = 0;
  EXPECT_FALSE(options.IsValid(&error));
  EXPECT_NE(error.find("gmres_restart"), std::string::npos) << error;
  options = BackwardOptions();
  options.tolerance = -1;
  EXPECT_FALSE(options.IsValid(&error));
  EXPECT_NE(error.find("tolerance"), std::string::npos) << error;
}

TEST(BackwardOptions, EnumsRoundTrip) {
  for (AdjointSolverType type : AllAdjointSolverTypes()) {
    AdjointSolverType parsed = AdjointSolverType::kDense;
    ASSERT_TRUE(StringToAdjointSolverType(ToString(type), &parsed)) << ToString(type);
    EXPECT_EQ(parsed, type);
  }
  for (BackwardMode mode :
       {BackwardMode::kIft, BackwardMode::kJfb, BackwardMode::kPhantom, BackwardMode::kUnrolled}) {
    BackwardMode parsed = BackwardMode::kUnrolled;
    ASSERT_TRUE(StringToBackwardMode(ToString(mode), &parsed)) << ToString(mode);
    EXPECT_EQ(parsed, mode);
  }
  BackwardMode mode = BackwardMode::kJfb;
  EXPECT_TRUE(StringToBackwardMode("IFT", &mode));
  EXPECT_EQ(mode, BackwardMode::kIft);
  EXPECT_FALSE(StringToBackwardMode("implicit", &mode));
  EXPECT_EQ(mode, BackwardMode::kIft);  // untouched on failure
  AdjointSolverType type = AdjointSolverType::kGmres;
  EXPECT_TRUE(StringToAdjointSolverType("CG", &type));
  EXPECT_EQ(type, AdjointSolverType::kConjugateGradient);
}

// What the fixed_point, anderson and broyden adjoints iterate: the normalised
// map f(u) = g_b / ||g_b|| + J^T u from u0 = w0_b / ||g_b||, and w_b =
// ||g_b|| u_b. Written out here, for Picard steps u <- f(u), in the
// arithmetic SolveAdjoint has to keep bitwise: ||g_b|| by Eigen on the rows of
// a float64 row-major matrix, float64 products rounded once to T, and f in T
// (J^T u + the rounded g_b / ||g_b||) while every sample is iterating, but
// in float64 from the unrounded g_b / ||g_b||, rounded once, for the calls
// after the first `whole_batch_calls` (when samples have finished).
// Sample b takes iterations[b] steps.
template <typename T>
Tensor NormalisedRecurrence(const BatchedVjp& vjp,
                            const Tensor& g,
                            const Tensor& w0,
                            const std::vector<int>& iterations,
                            int whole_batch_calls) {
  using RowMatrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const int64_t batch = g.dim(0);
  const int64_t n = g.dim(1);
  RowMatrix g64(batch, n);
  for (int64_t i = 0; i < batch * n; ++i) g64.data()[i] = g.at(i);
  std::vector<double> norm(batch), inverse(batch);
  RowMatrix unit64(batch, n);
  Tensor unit(g.shape(), g.dtype()), u(g.shape(), g.dtype()), jt_u(g.shape(), g.dtype());
  for (int64_t b = 0; b < batch; ++b) {
    norm[b] = g64.row(b).norm();
    inverse[b] = norm[b] > 0 ? 1.0 / norm[b] : 0.0;
    unit64.row(b) = g64.row(b) * inverse[b];
    for (int64_t i = b * n; i < (b + 1) * n; ++i) {
      unit.data<T>()[i] = static_cast<T>(unit64.data()[i]);
      u.data<T>()[i] = static_cast<T>(w0.at(i) * inverse[b]);
    }
  }
  const int steps = *std::max_element(iterations.begin(), iterations.end());
  for (int k = 0; k < steps; ++k) {
    vjp(u, &jt_u);  // rows are independent: the finished ones change nothing
    for (int64_t b = 0; b < batch; ++b) {
      if (k >= iterations[b]) continue;
      for (int64_t i = b * n; i < (b + 1) * n; ++i) {
        const T jt = jt_u.data<T>()[i];
        u.data<T>()[i] = k < whole_batch_calls
                             ? jt + unit.data<T>()[i]
                             : static_cast<T>(unit64.data()[i] + static_cast<double>(jt));
      }
    }
  }
  Tensor w(g.shape(), g.dtype());
  for (int64_t i = 0; i < batch * n; ++i) {
    w.data<T>()[i] = static_cast<T>(static_cast<double>(u.data<T>()[i]) * norm[i / n]);
  }
  return w;
}

Tensor NormalisedRecurrence(const BatchedVjp& vjp,
                            const Tensor& g,
                            const Tensor& w0,
                            const std::vector<int>& iterations,
                            int whole_batch_calls) {
  return DispatchDType(g.dtype(), [&](auto zero) {
    return NormalisedRecurrence<decltype(zero)>(vjp, g, w0, iterations, whole_batch_calls);
  });
}

// Equal to the last bit (so 0 and -0 differ).
void ExpectBitwiseEqual(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.dtype(), expected.dtype()) << what;
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  DispatchDType(expected.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* a = actual.data<T>();
    const T* e = expected.data<T>();
    for (int64_t i = 0; i < expected.numel(); ++i) {
      ASSERT_EQ(std::memcmp(a + i, e + i, sizeof(T)), 0)
          << what << ", element " << i << ": " << a[i] << " instead of " << e[i];
    }
  });
}

TEST(AdjointSolver, AVjpThatRebindsItsOutputGivesTheSameSolve) {
  // BatchedVjp may hand back the tensor its computation made instead of
  // writing into *out. Each result here is also scribbled over with NaN at
  // the next call, through a handle the VJP keeps: the solvers must read it
  // before then and never keep it. Same solution and iterations, bitwise,
  // as the VJP that writes into *out: with every sample iterating (calls on
  // the whole batch) and with sample 1 at g = 0, which ends at once (the
  // fixed-point solvers' calls on some samples only).
  for (AdjointSolverType type : AllAdjointSolverTypes()) {
    for (DType dtype : {DType::kFloat64, DType::kFloat32}) {
      for (bool zero_sample : {false, true}) {
        SCOPED_TRACE(std::string(ToString(type)) + " " + ToString(dtype) +
                     (zero_sample ? ", sample 1 at g = 0" : ""));
        LinearAdjoint linear = MakeLinear(3, 10, 0.6, true, 11);
        Tensor g = RandomRhs(3, 10, 12, dtype);
        if (zero_sample) {
          for (int64_t i = 0; i < 10; ++i) g.set(10 + i, 0.0);
        }
        const BackwardOptions options = Options(type, dtype == DType::kFloat64 ? 1e-10 : 1e-5);
        Tensor reference;
        const AdjointSummary reference_summary = SolveAdjoint(options, linear.Vjp(), g, &reference);
        ASSERT_TRUE(reference_summary.IsUsable()) << reference_summary.FullReport();

        const BatchedVjp writes = linear.Vjp();
        std::vector<Tensor> returned;
        const BatchedVjp rebinds = [&](const Tensor& v, Tensor* out) {
          for (Tensor& earlier : returned) earlier.Fill(std::numeric_limits<double>::quiet_NaN());
          Tensor fresh(out->shape(), out->dtype());
          writes(v, &fresh);
          returned.push_back(fresh);
          *out = fresh;
        };
        Tensor w;
        const AdjointSummary summary = SolveAdjoint(options, rebinds, g, &w);
        ASSERT_TRUE(summary.IsUsable()) << summary.FullReport();
        EXPECT_GT(returned.size(), 1u);
        ExpectBitwiseEqual(w, reference, ToString(type));
        EXPECT_EQ(summary.sample_iterations, reference_summary.sample_iterations);
      }
    }
  }
}

// Sample b of w (n entries per sample) is w_K of the plain recurrence
// w_{k+1} = g + J_b^T w_k from w_0 = start, in float64, K = budget.
void ExpectPlainRecurrence(const Tensor& w,
                           const Tensor& g,
                           const Tensor& start,
                           const Eigen::MatrixXd& jacobian,
                           int64_t b,
                           int64_t n,
                           int budget,
                           double tolerance,
                           const std::string& what) {
  Eigen::VectorXd gb(n), wb(n);
  for (int64_t i = 0; i < n; ++i) {
    gb(i) = g.at(b * n + i);
    wb(i) = start.at(b * n + i);
  }
  for (int k = 0; k < budget; ++k) wb = gb + jacobian.transpose() * wb;
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(w.at(b * n + i), wb(i), tolerance * (1.0 + std::abs(wb(i))))
        << what << ", sample " << b;
  }
}

// A fixed budget of K plain iterations is exactly K VJPs, as
// w_{k+1} = g + J^T w_k from w_0 = g (or a warm start) makes, and returns
// w_K, bitwise as the normalised recurrence gives it (every call is on the
// whole batch), in float64 and float32.
TEST(AdjointFixedPoint, FixedBudgetMakesExactlyOneVjpPerIteration) {
  for (DType dtype : {DType::kFloat64, DType::kFloat32}) {
    for (bool warm : {false, true}) {
      for (int budget : {1, 2, 16}) {
        const std::string what = std::string(ToString(dtype)) + (warm ? ", warm" : ", cold") +
                                 ", budget " + std::to_string(budget);
        LinearAdjoint linear = MakeLinear(3, 7, 0.6, false, 40 + budget);
        const Tensor g = RandomRhs(3, 7, 50 + budget, dtype);
        const Tensor w0 = warm ? RandomRhs(3, 7, 60 + budget, dtype) : g;
        BackwardOptions options = Options(AdjointSolverType::kFixedPoint, 0.0);
        options.max_iterations = budget;
        Tensor w = warm ? w0.Clone() : Tensor();
        const AdjointSummary summary = SolveAdjoint(options, linear.Vjp(), g, &w);
        EXPECT_EQ(summary.vjp_evaluations, budget) << what;
        EXPECT_EQ(linear.vjp_calls, budget) << what;
        const double tolerance = dtype == DType::kFloat64 ? 1e-12 : 1e-5;
        for (int64_t b = 0; b < 3; ++b) {
          ExpectPlainRecurrence(w, g, w0, linear.jacobians[b], b, 7, budget, tolerance, what);
          EXPECT_EQ(summary.sample_iterations[b], budget) << what << ", sample " << b;
          // Tolerance 0: the budget was asked for, so INEXACT, not MAX_ITERATIONS.
          EXPECT_EQ(summary.sample_termination[b], TerminationType::kInexact)
              << what << ", sample " << b;
        }
        ExpectBitwiseEqual(
            w, NormalisedRecurrence(linear.Vjp(), g, w0, summary.sample_iterations, budget), what);
        EXPECT_NE(summary.FullReport().find("fixed budget of " + std::to_string(budget)),
                  std::string::npos)
            << summary.FullReport();
      }
    }
  }
}

// A sample whose VJP is not finite ends at the first call and keeps g; the
// others still make the whole budget, now in calls on them alone, and return
// w_K with K iterations counted (not their (K-1)-th iterate).
TEST(AdjointFixedPoint, FixedBudgetWithANonFiniteSampleStillReturnsTheOthersLastIterate) {
  for (DType dtype : {DType::kFloat64, DType::kFloat32}) {
    for (int budget : {2, 5}) {
      const std::string what = std::string(ToString(dtype)) + ", budget " + std::to_string(budget);
      LinearAdjoint linear = MakeLinear(3, 6, 0.6, false, 80 + budget);
      linear.jacobians[1](0, 0) = std::numeric_limits<double>::quiet_NaN();
      const Tensor g = RandomRhs(3, 6, 90 + budget, dtype);
      BackwardOptions options = Options(AdjointSolverType::kFixedPoint, 0.0);
      options.max_iterations = budget;
      Tensor w;
      const AdjointSummary summary = SolveAdjoint(options, linear.Vjp(), g, &w);
      EXPECT_EQ(summary.vjp_evaluations, budget) << what;
      EXPECT_EQ(summary.sample_termination[1], TerminationType::kNonFinite) << what;
      // Sample 1 keeps its start, g / ||g||, scaled back by ||g||.
      const double tolerance = dtype == DType::kFloat64 ? 1e-12 : 1e-5;
      for (int64_t i = 0; i < 6; ++i) {
        EXPECT_NEAR(w.at(6 + i), g.at(6 + i), tolerance * (1.0 + std::abs(g.at(6 + i)))) << what;
      }
      for (int64_t b : {0, 2}) {
        ExpectPlainRecurrence(w, g, g, linear.jacobians[b], b, 6, budget, tolerance, what);
        EXPECT_EQ(summary.sample_iterations[b], budget) << what << ", sample " << b;
        EXPECT_EQ(summary.sample_termination[b], TerminationType::kInexact)
            << what << ", sample " << b;
      }
    }
  }
}

// A VJP with a little noise in every call (as a map evaluated in low
// precision has): the residual stalls near 1e-4 of ||g||. With a stagnation
// window the samples end STAGNATED before the budget; with the window off
// (0) they use all of it.
TEST(AdjointFixedPoint, StagnationWindowEndsAStalledSolve) {
  LinearAdjoint linear = MakeLinear(2, 6, 0.5, false, 95);
  const Tensor g = RandomRhs(2, 6, 96);
  const BatchedVjp exact = linear.Vjp();
  int calls = 0;
  const BatchedVjp noisy = [&](const Tensor& v, Tensor* out) {
    exact(v, out);
    ++calls;
    for (int64_t i = 0; i < out->numel(); ++i) {
      out->set(i, out->at(i) + 1e-4 * std::sin(12.9898 * (i + 1) * calls));
    }
  };
  for (int window : {0, 3}) {
    BackwardOptions options = Options(AdjointSolverType::kFixedPoint, 1e-9);
    options.max_iterations = 200;
    options.stagnation_window = window;
    Tensor w;
    const AdjointSummary summary = SolveAdjoint(options, noisy, g, &w);
    for (int64_t b = 0; b < 2; ++b) {
      if (window == 0) {
        EXPECT_EQ(summary.sample_termination[b], TerminationType::kMaxIterations)
            << summary.FullReport();
        EXPECT_EQ(summary.sample_iterations[b], 200);
      } else {
        EXPECT_EQ(summary.sample_termination[b], TerminationType::kStagnated)
            << summary.FullReport();
        EXPECT_LT(summary.sample_iterations[b], 200);
      }
    }
  }
  BackwardOptions bad = Options(AdjointSolverType::kFixedPoint, 1e-6);
  bad.stagnation_window = -1;
  std::string error;
  EXPECT_FALSE(bad.IsValid(&error));
  EXPECT_NE(error.find("stagnation_window"), std::string::npos) << error;
}

// Once a sample has converged the map is called on the others only (the VJP
// still sees the whole batch, the finished rows zero): they iterate on, in
// the arithmetic of those calls, and the VJP count is the iterations of the
// slowest sample plus the one at u0.
TEST(AdjointFixedPoint, CallsOnSomeSamplesIterateTheRemainingOnes) {
  for (DType dtype : {DType::kFloat64, DType::kFloat32}) {
    LinearAdjoint linear = MakeLinear(4, 9, 0.6, false, 70);
    linear.jacobians[0].setZero();  // f(u0) = u0: sample 0 converges at once
    const Tensor g = RandomRhs(4, 9, 71, dtype);
    const BackwardOptions options =
        Options(AdjointSolverType::kFixedPoint, dtype == DType::kFloat64 ? 1e-10 : 1e-5);
    // Every call after the one at u0 leaves out sample 0, whose row is zero.
    int64_t calls = 0;
    bool finished_row_zero = true;
    const BatchedVjp vjp = linear.Vjp();
    const BatchedVjp checked_vjp = [&](const Tensor& v, Tensor* out) {
      for (int64_t i = 0; i < 9 && calls > 0; ++i) finished_row_zero &= v.at(i) == 0.0;
      ++calls;
      vjp(v, out);
    };
    Tensor w;
    const AdjointSummary summary = SolveAdjoint(options, checked_vjp, g, &w);
    ASSERT_TRUE(summary.IsUsable()) << summary.FullReport();
    EXPECT_TRUE(finished_row_zero);
    EXPECT_EQ(summary.sample_iterations[0], 0);
    for (int64_t b = 1; b < 4; ++b) EXPECT_GT(summary.sample_iterations[b], 2) << b;
    EXPECT_EQ(summary.vjp_evaluations, summary.iterations + 1);
    EXPECT_EQ(summary.vjp_evaluations, calls);
    EXPECT_LT(RelativeDiff(w, linear.Exact(g.To(DType::kFloat64)).To(dtype)),
              dtype == DType::kFloat64 ? 1e-9 : 1e-4);
    ExpectBitwiseEqual(w, NormalisedRecurrence(linear.Vjp(), g, g, summary.sample_iterations, 1),
                       ToString(dtype));
  }
}

TEST(AdjointSummary, ReportsSayWhatHappened) {
  LinearAdjoint linear = MakeLinear(2, 4, 0.5, false, 29);
  const Tensor g = RandomRhs(2, 4, 30);
  Tensor w;
  const AdjointSummary summary =
      SolveAdjoint(Options(AdjointSolverType::kGmres), linear.Vjp(), g, &w);
  const std::string brief = summary.BriefReport();
  EXPECT_NE(brief.find("ift/gmres: CONVERGED, 2/2 converged"), std::string::npos) << brief;
  const std::string full = summary.FullReport();
  EXPECT_NE(full.find("sample 1: CONVERGED"), std::string::npos) << full;
  EXPECT_EQ(summary.vjp_evaluations, linear.vjp_calls);
}

}  // namespace
}  // namespace stillpoint::adjoint_test
