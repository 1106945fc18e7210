// Warm start of an energy attention's inner solve across the iterations of
// the outer solve (EnergyAttentionOptions::warm_start): with every solve
// converged, the model's gradient is the one without warm start to a tight
// float64 tolerance while the inner forward iterations drop; warm starts
// happen only inside an outer solve's tape-off evaluations, and only from
// the kept solutions of the same samples.

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "framework/ops.h"
#include "layers/energy_attention.h"
#include "layers/models.h"
#include "solvers/solve_scope.h"
#include "tests/layers/energy_test_util.h"

namespace stillpoint::energy_attention_warm_start_test {
namespace {

using testing_energy::Randn;
using testing_energy::RandnVar;

// A float64 model over feature inputs with `attention` as its cell's
// attention, every solve tight (inner Anderson or Picard as given).
ModelOptions WarmStartModel(const std::string& attention,
                            ModelKind kind,
                            ForwardSolverType inner,
                            bool warm_start) {
  ModelOptions options;
  options.kind = kind;
  options.vocab_size = 3;
  options.feature_dim = 3;
  options.max_length = 4;
  options.dim = 16;
  options.num_layers = 2;
  options.cell_options.heads = 2;
  options.cell_options.hidden = 16;
  options.cell_options.attention = attention;
  options.cell_options.energy.memories = 5;
  options.cell_options.attention_warm_start = warm_start;
  options.dtype = DType::kFloat64;
  options.seed = 3;
  options.implicit = testing_energy::TightImplicitOptions();
  options.implicit.forward.absolute_tolerance = 1e-11;
  options.cell_options.attention_solver = testing_energy::TightImplicitOptions(inner);
  return options;
}

double RelativeDifference(const std::vector<double>& a, const std::vector<double>& reference) {
  double diff = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - reference[i]) * (a[i] - reference[i]);
    norm += reference[i] * reference[i];
  }
  return std::sqrt(diff / norm);
}

struct SolvedGradient {
  std::vector<double> gradient;
  EnergyAttention::InnerCounts counts;
  bool converged = true;
};

SolvedGradient GradientOf(const ModelOptions& options, const Var& features, const Tensor& probe) {
  SequenceModel model(options);
  const auto attentions = FindEnergyAttentions(model);
  EXPECT_EQ(attentions.size(), 1u);
  SolvedGradient run;
  run.gradient = testing_energy::ModelGradient(model, features, probe);
  const EnergyAttention& attention = *attentions.front().second;
  run.counts = attention.inner_counts();
  run.converged = model.implicit()->forward_summary().termination_type ==
                      TerminationType::kConverged &&
                  attention.implicit().forward_summary().termination_type ==
                      TerminationType::kConverged &&
                  attention.implicit().backward_summary() != nullptr &&
                  attention.implicit().backward_summary()->termination_type ==
                      TerminationType::kConverged;
  return run;
}

struct Case {
  std::string attention;
  ForwardSolverType inner;
};

class WarmStartGradientTest : public ::testing::TestWithParam<Case> {};

TEST_P(WarmStartGradientTest, SameGradientFewerInnerIterations) {
  const Case c = GetParam();
  Rng rng(7);
  const Var features = RandnVar({3, 4, 3}, rng);
  const Tensor probe = Randn({3, 4, 3}, rng);
  const SolvedGradient cold =
      GradientOf(WarmStartModel(c.attention, ModelKind::kImplicit, c.inner, false), features, probe);
  const SolvedGradient warm =
      GradientOf(WarmStartModel(c.attention, ModelKind::kImplicit, c.inner, true), features, probe);
  ASSERT_TRUE(cold.converged && warm.converged);
  ASSERT_EQ(cold.gradient.size(), warm.gradient.size());
  // Both inner solves stop at an absolute residual of 1e-13 and the outer
  // one at 1e-11: the two gradients agree far below finite-difference noise.
  EXPECT_LE(RelativeDifference(warm.gradient, cold.gradient), 1e-8);
  // One inner solve per outer evaluation; every evaluation of the outer
  // solve after its first starts warm, the one recorded at z* included.
  EXPECT_EQ(cold.counts.warm_starts, 0);
  EXPECT_EQ(warm.counts.solves, cold.counts.solves);
  EXPECT_GE(warm.counts.warm_starts, warm.counts.solves - 3);
  EXPECT_LT(warm.counts.forward_iterations, cold.counts.forward_iterations * 3 / 4)
      << "warm " << warm.counts.forward_iterations << ", cold " << cold.counts.forward_iterations;
}

INSTANTIATE_TEST_SUITE_P(Blocks,
                         WarmStartGradientTest,
                         ::testing::Values(Case{"probabilistic", ForwardSolverType::kPicard},
                                           Case{"probabilistic", ForwardSolverType::kAnderson},
                                           Case{"hopfield", ForwardSolverType::kAnderson},
                                           Case{"expfam", ForwardSolverType::kAnderson}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.attention + "_" + ToString(info.param.inner);
                         });

// Outside an outer solve (an explicit stack) there is nothing to warm-start
// from: every inner solve starts from the block's initial state.
TEST(WarmStartTest, NoWarmStartOutsideAnOuterSolve) {
  ModelOptions options =
      WarmStartModel("probabilistic", ModelKind::kExplicit, ForwardSolverType::kAnderson, true);
  SequenceModel model(options);
  Rng rng(8);
  NoGrad tape_off;
  model.ForwardFeatures(RandnVar({2, 4, 3}, rng));
  for (const auto& [name, attention] : FindEnergyAttentions(model)) {
    EXPECT_GT(attention->inner_counts().solves, 0) << name;
    EXPECT_EQ(attention->inner_counts().warm_starts, 0) << name;
  }
}

// Inside one outer solve a later evaluation on a subset of the samples
// starts from their kept rows (and ends where a cold solve ends), with the
// tape off or on (the evaluation recorded at z*); a sample whose solution
// was not kept, or a new outer solve, starts cold.
TEST(WarmStartTest, StartsOnlyFromTheSameSamplesOfTheSameSolve) {
  EnergyAttentionOptions options;
  options.block.dim = 8;
  options.block.heads = 2;
  options.block.dtype = DType::kFloat64;
  options.solver = testing_energy::TightImplicitOptions(ForwardSolverType::kPicard);
  Rng rng(9);
  EnergyAttention attention(options, rng);
  const Tensor x = Randn({3, 4, 8}, rng);
  auto rows = [&](std::vector<int64_t> ids) {
    std::vector<double> all = x.ToVector(), picked;
    const int64_t per_row = 4 * 8;
    for (int64_t id : ids) {
      picked.insert(picked.end(), all.begin() + id * per_row, all.begin() + (id + 1) * per_row);
    }
    return Var(Tensor::FromVector(Shape{static_cast<int64_t>(ids.size()), 4, 8}, picked,
                                  DType::kFloat64));
  };
  NoGrad tape_off;
  Tensor cold_rows;
  {
    // The reference: rows 0 and 2 solved cold, outside any outer solve.
    cold_rows = attention.Forward(rows({0, 2}), {0, 2}).value();
  }
  EXPECT_EQ(attention.inner_counts().warm_starts, 0);
  {
    ForwardSolveScope outer;
    attention.Forward(rows({0, 1, 2}), {0, 1, 2});
    const int64_t before = attention.inner_counts().forward_iterations;
    const Tensor warm_rows = attention.Forward(rows({0, 2}), {0, 2}).value();
    EXPECT_EQ(attention.inner_counts().warm_starts, 1);
    // Started at its own fixed point: converged in at most one iteration.
    EXPECT_LE(attention.inner_counts().forward_iterations - before, 1);
    const std::vector<double> a = warm_rows.ToVector(), b = cold_rows.ToVector();
    for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-11);
    // Sample 1 was dropped by the previous evaluation: not kept, so cold.
    attention.Forward(rows({1}), {1});
    EXPECT_EQ(attention.inner_counts().warm_starts, 1);
  }
  {
    ForwardSolveScope another;
    attention.Forward(rows({0, 1, 2}), {0, 1, 2});
    EXPECT_EQ(attention.inner_counts().warm_starts, 1);
    GradModeGuard tape_on(true);
    const Var recorded = attention.Forward(rows({0, 2}), {0, 2});
    EXPECT_EQ(attention.inner_counts().warm_starts, 2);
    const std::vector<double> a = recorded.value().ToVector(), b = cold_rows.ToVector();
    for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-11);
  }
}

}  // namespace
}  // namespace stillpoint::energy_attention_warm_start_test
