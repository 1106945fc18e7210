// SequenceModel::FixedPointCorrectionLoss, the fixed-point correction loss
// of an implicit model (model.regularization.correction_*): taken on the
// forward iterates its last solve kept, its gradient with respect to every
// parameter matches central finite differences in float64 (the iterates are
// held fixed, as the loss treats them); a model without iterates or without
// an implicit layer is refused.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "framework/ops.h"
#include "layers/models.h"
#include "tests/layers/module_gradcheck.h"

namespace stillpoint::correction_loss_test {
namespace {

ModelOptions ImplicitOptions64(int sampled_iterates) {
  ModelOptions options;
  options.kind = ModelKind::kImplicit;
  options.vocab_size = 5;
  options.max_length = 4;
  options.dim = 8;
  options.cell_options.heads = 2;
  options.cell_options.hidden = 12;
  options.dtype = DType::kFloat64;
  options.implicit.forward.max_iterations = 12;
  options.implicit.forward.relative_tolerance = 0;  // a fixed budget: every iterate is kept
  options.implicit.sampled_iterates = sampled_iterates;
  options.seed = 5;
  return options;
}

const std::vector<int64_t> kIds = {1, 3, 0, 2, 4, 4, 1, 0};
const std::vector<int64_t> kTargets = {2, 0, 3, 1, 0, 1, 4, 4};
const Shape kShape{2, 4};

Var TaskLoss(const Var& logits) {
  return cross_entropy(reshape(logits, Shape{8, logits.dim(-1)}), kTargets);
}

TEST(FixedPointCorrectionLossTest, ItsGradientMatchesFiniteDifferencesInFloat64) {
  SequenceModel model(ImplicitOptions64(3));
  model.Forward(kIds, kShape);
  ASSERT_EQ(model.implicit()->last_result().sampled_iterates.size(), 3u);
  FixedPointCorrectionOptions correction;
  correction.steps = 2;
  correction.tau = 0.7;
  correction.gamma = 0.5;
  const auto loss = [&](const VarList&) {
    return model.FixedPointCorrectionLoss(model.Embed(kIds, kShape), TaskLoss, correction);
  };
  const double value = loss({}).item();
  EXPECT_GT(value, 0.0);
  // Weighting the earlier iterates more changes the loss: each iterate counts.
  FixedPointCorrectionOptions flat = correction;
  flat.gamma = 1.0;
  EXPECT_NE(model.FixedPointCorrectionLoss(model.Embed(kIds, kShape), TaskLoss, flat).item(),
            value);
  const GradCheckResult result = testing_support::CheckModuleGradients(model, loss, {});
  EXPECT_TRUE(result.ok) << result.log;
  EXPECT_GT(result.entries_checked, 100);
  EXPECT_FALSE(result.all_zero);
}

TEST(FixedPointCorrectionLossTest, NeedsAnImplicitModelWithKeptIterates) {
  SequenceModel without(ImplicitOptions64(0));
  without.Forward(kIds, kShape);
  EXPECT_THROW(without.FixedPointCorrectionLoss(without.Embed(kIds, kShape), TaskLoss, {}),
               Error);
  ModelOptions explicit_options = ImplicitOptions64(3);
  explicit_options.kind = ModelKind::kExplicit;
  SequenceModel stacked(explicit_options);
  stacked.Forward(kIds, kShape);
  EXPECT_THROW(stacked.FixedPointCorrectionLoss(stacked.Embed(kIds, kShape), TaskLoss, {}),
               Error);
}

}  // namespace
}  // namespace stillpoint::correction_loss_test
