// The rows the spectral-radius penalty is taken on when
// model.regularization.spectral_radius_rows is slowest.
#include "training/step_regularizers.h"

#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "framework/check.h"

namespace stillpoint::step_regularizers_test {
namespace {

SolverSummary SolveOf(const std::vector<int>& iterations, const std::vector<double>& residuals) {
  SolverSummary solve;
  solve.batch_size = static_cast<int64_t>(iterations.size());
  solve.sample_iterations = iterations;
  solve.sample_rel_residual = residuals;
  return solve;
}

TEST(SlowestSamplesTest, MostIterationsFirstThenLargerResidualThenLowerIndex) {
  // Samples 1 and 3 took 9 iterations (3 ended further from its fixed
  // point), 0 and 4 took 5 with equal residuals, 2 took 2.
  const SolverSummary solve = SolveOf({5, 9, 2, 9, 5}, {1e-4, 2e-4, 9e-4, 8e-4, 1e-4});
  EXPECT_EQ(SlowestSamples(solve, 5), (std::vector<int64_t>{3, 1, 0, 4, 2}));
  EXPECT_EQ(SlowestSamples(solve, 2), (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(SlowestSamples(solve, 0), (std::vector<int64_t>{}));
}

TEST(SlowestSamplesTest, AnUnconvergedSampleAtTheCapComesFirst) {
  // A solve stopped at its cap of 60 is the slowest even beside one that
  // converged at 59 with a larger residual history.
  const SolverSummary solve = SolveOf({12, 60, 59}, {1e-4, 3e-3, 9e-4});
  EXPECT_EQ(SlowestSamples(solve, 1), (std::vector<int64_t>{1}));
}

TEST(SlowestSamplesTest, ANonFiniteResidualCountsAsTheLargest) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const SolverSummary solve = SolveOf({7, 7, 7, 7}, {2e-3, nan, 5e-3, 1e-4});
  EXPECT_EQ(SlowestSamples(solve, 4), (std::vector<int64_t>{1, 2, 0, 3}));
}

TEST(SlowestSamplesTest, RefusesMoreSamplesThanTheSolveHadOrMismatchedCounts) {
  const SolverSummary solve = SolveOf({3, 4}, {1e-4, 1e-4});
  EXPECT_THROW(SlowestSamples(solve, 3), Error);
  EXPECT_THROW(SlowestSamples(solve, -1), Error);
  EXPECT_THROW(SlowestSamples(SolveOf({3, 4}, {1e-4}), 1), Error);
}

}  // namespace
}  // namespace stillpoint::step_regularizers_test
