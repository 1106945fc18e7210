// The training step (training/train_step.h) that `stillpoint train` and
// `stillpoint bench` share:
//   - a plain step is bitwise forward, mean cross-entropy, backward, the
//     clipped gradient and the optimizer's update written out by hand, and
//     reports the loss, the correct predictions and the gradient norm;
//   - a step of 2 and 3 data-parallel shards (1 and 2 threads) is bitwise
//     DataParallel::Backward, clipping and the update;
//   - clip_norm rescales the summed gradient to that norm before the update
//     (SGD with learning rate 1 moves the parameters by exactly it);
//   - an extra loss is added with each shard's share of the rows;
//   - a non-finite loss or gradient leaves the parameters and the
//     optimizer's state unchanged, clears the gradients and says which;
//   - hold_unconverged holds back a step whose adjoint solve missed its
//     tolerance, and applies it otherwise.
#include "training/train_step.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "framework/ops.h"
#include "framework/parallel.h"
#include "training/cli/bench_command.h"
#include "tests/training/tiny_transformer.h"

namespace stillpoint::train_step_test {
namespace {

using testing_support::TinyOptions;
using testing_support::TinyShapes;

Batch TinyBatch() {
  const TokenBatch tokens = ReversalBatch(TinyShapes(), 5);
  Batch batch;
  batch.batch_size = tokens.shape.dim(0);
  batch.length = tokens.shape.dim(1);
  batch.tokens = tokens.ids;
  batch.targets = tokens.targets;
  return batch;
}

std::vector<Tensor> Values(const SequenceModel& model) {
  std::vector<Tensor> values;
  for (const Var& p : model.parameters()) values.push_back(p.value().Clone());
  return values;
}

void ExpectBitwiseEqual(const std::vector<Tensor>& actual, const std::vector<Tensor>& expected,
                        const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    ASSERT_EQ(actual[i].numel(), expected[i].numel()) << what;
    for (int64_t j = 0; j < actual[i].numel(); ++j) {
      ASSERT_EQ(actual[i].at(j), expected[i].at(j)) << what << ", parameter " << i << ", " << j;
    }
  }
}

TEST(TrainStepTest, APlainStepIsTheHandWrittenStepBitwise) {
  for (ModelKind kind : {ModelKind::kExplicit, ModelKind::kImplicit}) {
    const ModelOptions options = TinyOptions(kind, DType::kFloat32);
    const Batch batch = TinyBatch();
    auto reference = std::make_shared<SequenceModel>(options);
    auto reference_optimizer = Optimizer::Create(OptimizerOptions{}, reference->named_parameters());
    auto model = std::make_shared<SequenceModel>(options);
    auto optimizer = Optimizer::Create(OptimizerOptions{}, model->named_parameters());
    TrainStep step(model, *optimizer, {.shards = 1, .clip_norm = 0.5});
    for (int k = 0; k < 3; ++k) {
      const Var logits = ForwardBatch(*reference, batch);
      const Var loss = BatchLoss(logits, batch);
      reference_optimizer->ZeroGrad();
      backward(loss);
      const double norm = ClipGradNorm(reference->parameters(), 0.5);
      reference_optimizer->Step();
      const auto [correct, counted] = CountCorrect(logits.value(), batch);

      const StepResult result = step.Run(batch);
      EXPECT_TRUE(result.updated);
      EXPECT_TRUE(result.failure.empty()) << result.failure;
      EXPECT_EQ(result.loss, loss.item()) << "step " << k;
      EXPECT_EQ(result.grad_norm, norm) << "step " << k;
      EXPECT_EQ(result.correct, correct);
      EXPECT_EQ(result.counted, counted);
      EXPECT_EQ(counted, 30);
    }
    ExpectBitwiseEqual(Values(*model), Values(*reference), ToString(kind));
    if (kind == ModelKind::kImplicit) {
      // The forward and adjoint solves' statistics of the step.
      const StepResult result = step.Run(batch);
      EXPECT_GT(result.forward.iterations_mean, 0);
      EXPECT_GT(result.backward.iterations_mean, 0);
    }
  }
}

TEST(TrainStepTest, AShardedStepIsDataParallelBackwardClipAndUpdateBitwise) {
  const ModelOptions options = TinyOptions(ModelKind::kImplicit, DType::kFloat32);
  const Batch batch = TinyBatch();
  const auto make = [&](int64_t) { return std::make_shared<SequenceModel>(options); };
  for (int64_t shards : {2, 3}) {
    for (int threads : {1, 2}) {
      ScopedNumThreads scoped(threads);
      auto reference = std::make_shared<SequenceModel>(options);
      DataParallel reference_shards(reference, shards,
                                    [&] { return std::make_shared<SequenceModel>(options); });
      auto reference_optimizer =
          Optimizer::Create(OptimizerOptions{}, reference->named_parameters());
      auto model = std::make_shared<SequenceModel>(options);
      auto optimizer = Optimizer::Create(OptimizerOptions{}, model->named_parameters());
      TrainStep step(model, *optimizer, {.shards = shards, .clip_norm = 0.5}, make);
      ASSERT_EQ(step.models().size(), static_cast<std::size_t>(shards));
      for (int k = 0; k < 3; ++k) {
        reference_optimizer->ZeroGrad();
        const double loss = reference_shards.Backward(
            batch.batch_size, [&](Module& replica, ShardRange rows) {
              const Batch part = SliceBatch(batch, rows.begin, rows.end);
              const Var logits = ForwardBatch(static_cast<SequenceModel&>(replica), part);
              return mul_scalar(BatchLoss(logits, part), static_cast<double>(rows.size() * 5) /
                                                             static_cast<double>(30));
            });
        ClipGradNorm(reference->parameters(), 0.5);
        reference_optimizer->Step();
        const StepResult result = step.Run(batch);
        EXPECT_EQ(result.loss, loss) << shards << " shards, step " << k;
        EXPECT_EQ(result.counted, 30);
        EXPECT_TRUE(result.updated);
      }
      ExpectBitwiseEqual(Values(*model), Values(*reference),
                         std::to_string(shards) + " shards, " + std::to_string(threads) +
                             " threads");
    }
  }
}

TEST(TrainStepTest, ClipNormRescalesTheGradientBeforeTheUpdate) {
  const ModelOptions options = TinyOptions(ModelKind::kExplicit, DType::kFloat64);
  auto model = std::make_shared<SequenceModel>(options);
  OptimizerOptions sgd;
  sgd.type = "sgd";
  sgd.learning_rate = 1.0;
  sgd.momentum = 0;
  sgd.weight_decay = 0;
  auto optimizer = Optimizer::Create(sgd, model->named_parameters());
  TrainStep step(model, *optimizer, {.shards = 1, .clip_norm = 1e-3});
  const std::vector<Tensor> before = Values(*model);
  const StepResult result = step.Run(TinyBatch());
  ASSERT_GT(result.grad_norm, 1e-2);  // so the clip is active
  double moved = 0;
  const std::vector<Tensor> after = Values(*model);
  for (std::size_t i = 0; i < after.size(); ++i) {
    for (int64_t j = 0; j < after[i].numel(); ++j) {
      const double d = after[i].at(j) - before[i].at(j);
      moved += d * d;
    }
  }
  EXPECT_NEAR(std::sqrt(moved), 1e-3, 1e-12);
}

TEST(TrainStepTest, AnExtraLossIsAddedWithEachShardsShareOfTheRows) {
  const ModelOptions options = TinyOptions(ModelKind::kExplicit, DType::kFloat64);
  const auto make = [&](int64_t) { return std::make_shared<SequenceModel>(options); };
  for (int64_t shards : {1, 2, 4}) {
    auto model = std::make_shared<SequenceModel>(options);
    auto optimizer = Optimizer::Create(OptimizerOptions{}, model->named_parameters());
    TrainStep step(model, *optimizer, {.shards = shards}, make);
    const Batch batch = TinyBatch();
    std::vector<double> scales;
    const ExtraLoss extra = [&](SequenceModel&, const Batch& rows, Rng&, double scale) {
      EXPECT_DOUBLE_EQ(scale, static_cast<double>(rows.batch_size) / 6.0);
      return constant(Tensor::Scalar(10.0 * scale, DType::kFloat64));
    };
    Rng rng(1);
    auto plain_model = std::make_shared<SequenceModel>(options);
    const double plain = BatchLoss(ForwardBatch(*plain_model, batch), batch).item();
    const StepResult result = step.Run(batch, extra, &rng);
    EXPECT_NEAR(result.loss, plain + 10.0, 1e-12) << shards << " shards";
  }
}

TEST(TrainStepTest, ANonFiniteLossOrGradientChangesNothing) {
  const ModelOptions options = TinyOptions(ModelKind::kExplicit, DType::kFloat64);
  const auto make = [&](int64_t) { return std::make_shared<SequenceModel>(options); };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const ExtraLoss nan_loss = [&](SequenceModel&, const Batch&, Rng&, double) {
    return constant(Tensor::Scalar(nan, DType::kFloat64));
  };
  // sqrt at 0 of a sum of parameters times 0: value 0, gradient inf * 0.
  const ExtraLoss nan_gradient = [&](SequenceModel& model, const Batch&, Rng&, double) {
    return sqrt(mul_scalar(sum(model.parameters().front()), 0.0));
  };
  for (int64_t shards : {1, 2}) {
    for (const auto& [extra, failure] :
         {std::pair{nan_loss, "non-finite loss"}, std::pair{nan_gradient, "non-finite gradient"}}) {
      auto model = std::make_shared<SequenceModel>(options);
      auto optimizer = Optimizer::Create(OptimizerOptions{}, model->named_parameters());
      TrainStep step(model, *optimizer, {.shards = shards}, make);
      const std::vector<Tensor> before = Values(*model);
      Rng rng(1);
      const StepResult result = step.Run(TinyBatch(), extra, &rng);
      EXPECT_EQ(result.failure, failure) << shards << " shards";
      EXPECT_FALSE(result.updated);
      EXPECT_EQ(optimizer->step_count(), 0);
      ExpectBitwiseEqual(Values(*model), before, failure);
      for (const Var& p : model->parameters()) EXPECT_FALSE(p.has_grad()) << failure;
    }
  }
}

TEST(TrainStepTest, HoldUnconvergedHoldsBackAStepWhoseAdjointMissedItsTolerance) {
  ModelOptions options = TinyOptions(ModelKind::kImplicit, DType::kFloat64);
  options.implicit.backward.max_iterations = 1;
  options.implicit.backward.tolerance = 1e-12;
  for (bool hold : {true, false}) {
    auto model = std::make_shared<SequenceModel>(options);
    auto optimizer = Optimizer::Create(OptimizerOptions{}, model->named_parameters());
    TrainStep step(model, *optimizer, {.shards = 1, .hold_unconverged = hold});
    const std::vector<Tensor> before = Values(*model);
    const StepResult result = step.Run(TinyBatch());
    ASSERT_TRUE(result.unconverged());
    EXPECT_TRUE(result.failure.empty());
    EXPECT_EQ(result.updated, !hold);
    EXPECT_EQ(optimizer->step_count(), hold ? 0 : 1);
    if (hold) ExpectBitwiseEqual(Values(*model), before, "held");
  }
}

}  // namespace
}  // namespace stillpoint::train_step_test
