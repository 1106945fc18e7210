// SolveTally: the counts of every solve, INEXACT apart from misses and
// failures told from a solve short of its tolerance; TallyingAdjoints adds
// every adjoint solve of a node, each backward pass through it, and keeps
// the node's own observer.
#include "solvers/solve_tally.h"

#include <gtest/gtest.h>

#include <cmath>

#include "framework/ops.h"

namespace stillpoint::solve_tally_test {
namespace {

using T = TerminationType;

TEST(SolveTally, CountsSolvesSamplesAndStatuses) {
  SolveTally tally;
  tally.Add({});  // no samples: no solve
  EXPECT_TRUE(tally.empty());
  tally.Add({T::kConverged, T::kConverged});
  tally.Add({T::kConverged, T::kMaxIterations});
  tally.Add({T::kInexact, T::kInexact});
  tally.Add({T::kNonFinite, T::kConverged});
  EXPECT_EQ(tally.solves, 4);
  EXPECT_EQ(tally.unconverged_solves, 2);
  EXPECT_EQ(tally.failed_solves, 1);
  EXPECT_EQ(tally.samples, 8);
  EXPECT_EQ(tally.converged_samples, 4);
  EXPECT_EQ(tally.inexact_samples, 2);
  EXPECT_EQ(tally.unconverged_samples(), 2);
  // INEXACT samples are not judged: 4 of 6.
  EXPECT_DOUBLE_EQ(tally.ConvergedFraction(), 4.0 / 6.0);
  EXPECT_EQ(tally.status_counts.at("MAX_ITERATIONS"), 1);
  EXPECT_EQ(tally.status_counts.at("NON_FINITE"), 1);

  SolveTally only_inexact;
  only_inexact.Add({T::kInexact});
  EXPECT_TRUE(std::isnan(only_inexact.ConvergedFraction()));
  tally.Merge(only_inexact);
  EXPECT_EQ(tally.solves, 5);
  EXPECT_EQ(tally.inexact_samples, 3);
}

TEST(SolveTally, DivergedAndNonFiniteAreFailuresMaxIterationsIsNot) {
  EXPECT_TRUE(IsFailedTermination(T::kDiverged));
  EXPECT_TRUE(IsFailedTermination(T::kNonFinite));
  EXPECT_TRUE(IsFailedTermination(T::kFailure));
  EXPECT_FALSE(IsFailedTermination(T::kMaxIterations));
  EXPECT_FALSE(IsFailedTermination(T::kStagnated));
}

// f(z) = z / 2 + u: every backward pass through the node solves one
// adjoint; two passes (retain_graph) are two solves, and the node's own
// observer still sees each.
TEST(SolveTally, TallyingAdjointsCountsEveryBackwardPass) {
  const Var u(Tensor::FromVector(Shape{2, 2}, {1.0, 2.0, 3.0, 4.0}, DType::kFloat64), true);
  CellFn f = [u](const Var& z, const std::vector<int64_t>&) {
    return add(mul_scalar(z, 0.5), u);
  };
  ImplicitOptions options;
  options.backward.solver = AdjointSolverType::kGmres;
  options.backward.tolerance = 1e-10;
  int own_calls = 0;
  options.adjoint_observer = [&own_calls](const AdjointSummary&) { ++own_calls; };
  auto tally = std::make_shared<ImplicitTally>();
  const ImplicitResult result = SolveImplicit(f, Tensor::Zeros(Shape{2, 2}, DType::kFloat64),
                                              TallyingAdjoints(options, tally), nullptr, {u});
  const Var loss = sum(result.z_star);
  grad({loss}, {u}, {}, {.retain_graph = true});
  grad({loss}, {u}, {}, {.retain_graph = true});
  EXPECT_EQ(tally->backward.solves, 2);
  EXPECT_EQ(tally->backward.samples, 4);
  EXPECT_EQ(tally->backward.converged_samples, 4);
  EXPECT_EQ(own_calls, 2);
}

}  // namespace
}  // namespace stillpoint::solve_tally_test
