// Data-parallel steps (training/data_parallel.h) and the per-thread grad mode
// they rely on:
//   - ShardRows cuts a batch into contiguous shards differing by at most one
//     row, and rejects impossible cuts;
//   - on a small explicit and a small implicit DEQ transformer in float64,
//     the loss and every parameter gradient of a sharded step (2 and 3
//     shards) match a plain backward() of the whole batch to rounding;
//   - in float32 a sharded step's gradients are bitwise the same on one
//     thread and on two;
//   - the model's gradients are the shards' summed in shard order (a sum
//     whose float32 result shows the order), added to those it held;
//   - replicas share the model's parameter storage; a replica of another
//     structure, a failing shard and a non-scalar loss are clear errors, and
//     a failing shard leaves the model's gradients as they were;
//   - `stillpoint bench` with --shards 2 trains the same trajectory as
//     without.
#include "training/data_parallel.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <stdexcept>
#include <vector>

#include "framework/ops.h"
#include "framework/parallel.h"
#include "training/cli/bench_command.h"
#include "tests/training/tiny_transformer.h"
#include "training/optimizer.h"

namespace stillpoint::data_parallel_test {
namespace {

TEST(ShardRowsTest, CutsContiguousShardsThatDifferByAtMostOneRow) {
  // 10 rows in 3 shards: 4, 3, 3.
  const ShardRange a = ShardRows(10, 3, 0), b = ShardRows(10, 3, 1), c = ShardRows(10, 3, 2);
  EXPECT_EQ(a.begin, 0);
  EXPECT_EQ(a.end, 4);
  EXPECT_EQ(b.begin, 4);
  EXPECT_EQ(b.end, 7);
  EXPECT_EQ(c.begin, 7);
  EXPECT_EQ(c.end, 10);
  EXPECT_EQ(ShardRows(8, 2, 1).begin, 4);
  EXPECT_EQ(ShardRows(5, 5, 4).size(), 1);
  EXPECT_EQ(ShardRows(7, 1, 0).size(), 7);
}

TEST(ShardRowsTest, RejectsImpossibleCuts) {
  EXPECT_THROW(ShardRows(4, 0, 0), Error);
  EXPECT_THROW(ShardRows(4, 5, 0), Error);
  EXPECT_THROW(ShardRows(4, 2, 2), Error);
  EXPECT_THROW(ShardRows(4, 2, -1), Error);
}

using testing_support::TinyOptions;
using testing_support::TinyShapes;

// The shard's share of the batch's mean cross-entropy.
DataParallel::ShardLoss TokenLoss(const TokenBatch& batch) {
  return [&batch](Module& replica, ShardRange rows) {
    auto& model = static_cast<SequenceModel&>(replica);
    const int64_t length = batch.shape.dim(1);
    const std::vector<int64_t> ids(batch.ids.begin() + rows.begin * length,
                                   batch.ids.begin() + rows.end * length);
    const std::vector<int64_t> targets(batch.targets.begin() + rows.begin * length,
                                       batch.targets.begin() + rows.end * length);
    const Var logits = model.Forward(ids, Shape{rows.size(), length});
    return mul_scalar(cross_entropy(logits, targets),
                      static_cast<double>(rows.size()) / static_cast<double>(batch.shape.dim(0)));
  };
}

struct StepResult {
  double loss = 0;
  std::vector<Tensor> grads;  // per parameter, in parameters() order
};

StepResult PlainStep(ModelKind kind, DType dtype) {
  auto model = std::make_shared<SequenceModel>(TinyOptions(kind, dtype));
  const TokenBatch batch = ReversalBatch(TinyShapes(), 5);
  const Var loss = cross_entropy(model->Forward(batch.ids, batch.shape), batch.targets);
  backward(loss);
  StepResult result{loss.item(), {}};
  for (const Var& p : model->parameters()) result.grads.push_back(p.grad().value());
  return result;
}

StepResult ShardedStep(ModelKind kind, DType dtype, int64_t shards) {
  const ModelOptions options = TinyOptions(kind, dtype);
  auto model = std::make_shared<SequenceModel>(options);
  DataParallel step(model, shards, [&] { return std::make_shared<SequenceModel>(options); });
  const TokenBatch batch = ReversalBatch(TinyShapes(), 5);
  StepResult result;
  result.loss = step.Backward(batch.shape.dim(0), TokenLoss(batch));
  for (const Var& p : model->parameters()) result.grads.push_back(p.grad().value());
  return result;
}

void ExpectGradientsClose(const StepResult& expected, const StepResult& actual, double tol) {
  EXPECT_NEAR(actual.loss, expected.loss, tol * std::abs(expected.loss));
  ASSERT_EQ(actual.grads.size(), expected.grads.size());
  // Relative to the largest gradient entry: some gradients are zero up to
  // rounding (a key bias, which softmax ignores).
  double scale = 0;
  for (const Tensor& g : expected.grads) {
    for (int64_t j = 0; j < g.numel(); ++j) scale = std::max(scale, std::abs(g.at(j)));
  }
  ASSERT_GT(scale, 0);
  for (std::size_t i = 0; i < expected.grads.size(); ++i) {
    ASSERT_TRUE(actual.grads[i].defined()) << "parameter " << i;
    for (int64_t j = 0; j < expected.grads[i].numel(); ++j) {
      ASSERT_NEAR(actual.grads[i].at(j), expected.grads[i].at(j), tol * scale)
          << "parameter " << i << ", entry " << j;
    }
  }
}

class DataParallelGradientTest : public ::testing::TestWithParam<ModelKind> {};

TEST_P(DataParallelGradientTest, ShardedGradientsMatchTheWholeBatchInFloat64) {
  ScopedNumThreads threads(2);
  const StepResult plain = PlainStep(GetParam(), DType::kFloat64);
  for (int64_t shards : {1, 2, 3}) {
    SCOPED_TRACE(shards);
    ExpectGradientsClose(plain, ShardedStep(GetParam(), DType::kFloat64, shards), 1e-11);
  }
}

TEST_P(DataParallelGradientTest, Float32GradientsAreBitwiseTheSameOnOneAndTwoThreads) {
  StepResult one, two;
  {
    ScopedNumThreads threads(1);
    one = ShardedStep(GetParam(), DType::kFloat32, 2);
  }
  {
    ScopedNumThreads threads(2);
    two = ShardedStep(GetParam(), DType::kFloat32, 2);
  }
  EXPECT_EQ(one.loss, two.loss);
  ASSERT_EQ(one.grads.size(), two.grads.size());
  for (std::size_t i = 0; i < one.grads.size(); ++i) {
    for (int64_t j = 0; j < one.grads[i].numel(); ++j) {
      ASSERT_EQ(one.grads[i].at(j), two.grads[i].at(j)) << "parameter " << i << ", entry " << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models,
                         DataParallelGradientTest,
                         ::testing::Values(ModelKind::kExplicit, ModelKind::kImplicit),
                         [](const auto& info) {
                           return info.param == ModelKind::kExplicit ? "Explicit" : "Implicit";
                         });

TEST(DataParallelTest, ReplicasShareTheModelsParameterStorage) {
  const ModelOptions options = TinyOptions(ModelKind::kExplicit, DType::kFloat64);
  auto model = std::make_shared<SequenceModel>(options);
  DataParallel step(model, 3, [&] { return std::make_shared<SequenceModel>(options); });
  EXPECT_EQ(&step.replica(0), model.get());
  const VarList own = model->parameters();
  for (int64_t shard = 1; shard < 3; ++shard) {
    const VarList copy = step.replica(shard).parameters();
    ASSERT_EQ(copy.size(), own.size());
    for (std::size_t i = 0; i < own.size(); ++i) {
      EXPECT_TRUE(copy[i].value().SameStorage(own[i].value())) << "shard " << shard << ", " << i;
    }
  }
  // An update of the model's values (what an optimizer does) is what the
  // replicas compute with next.
  Var first = own.front();
  first.mutable_value().set(0, 42.0);
  EXPECT_EQ(step.replica(2).parameters().front().value().at(0), 42.0);
  EXPECT_THROW(step.replica(3), Error);
}

TEST(DataParallelTest, AReplicaOfAnotherStructureIsAnErrorNamingTheParameter) {
  const ModelOptions options = TinyOptions(ModelKind::kExplicit, DType::kFloat64);
  ModelOptions wider = options;
  wider.dim = 10;
  auto model = std::make_shared<SequenceModel>(options);
  try {
    DataParallel step(model, 2, [&] { return std::make_shared<SequenceModel>(wider); });
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("replica for shard 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("parameter '"), std::string::npos) << e.what();
  }
  EXPECT_THROW(DataParallel(model, 0, nullptr), Error);
  EXPECT_THROW(DataParallel(model, 2, nullptr), Error);
  EXPECT_THROW(DataParallel(model, 2, [&] { return model; }), Error);
}

TEST(DataParallelTest, AFailingShardLeavesTheModelsGradientsAsTheyWere) {
  ScopedNumThreads threads(2);
  const ModelOptions options = TinyOptions(ModelKind::kExplicit, DType::kFloat64);
  auto model = std::make_shared<SequenceModel>(options);
  DataParallel step(model, 2, [&] { return std::make_shared<SequenceModel>(options); });
  const TokenBatch batch = ReversalBatch(TinyShapes(), 5);
  // Gradients from an earlier backward pass, to be kept.
  step.Backward(6, TokenLoss(batch));
  std::vector<Tensor> before;
  for (const Var& p : model->parameters()) before.push_back(p.grad().value().Clone());

  const DataParallel::ShardLoss good = TokenLoss(batch);
  const DataParallel::ShardLoss failing = [&](Module& replica, ShardRange rows) -> Var {
    if (rows.begin > 0) throw std::runtime_error("shard failed");
    return good(replica, rows);
  };
  EXPECT_THROW(step.Backward(6, failing), std::runtime_error);
  const VarList parameters = model->parameters();
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    for (int64_t j = 0; j < before[i].numel(); ++j) {
      ASSERT_EQ(parameters[i].grad().value().at(j), before[i].at(j)) << "parameter " << i;
    }
  }
  for (const Var& p : step.replica(1).parameters()) EXPECT_FALSE(p.has_grad());

  const DataParallel::ShardLoss not_scalar = [&](Module& replica, ShardRange rows) {
    auto& m = static_cast<SequenceModel&>(replica);
    return m.Embed(
        std::vector<int64_t>(batch.ids.begin() + rows.begin * 5, batch.ids.begin() + rows.end * 5),
        Shape{rows.size(), 5});
  };
  try {
    step.Backward(6, not_scalar);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must be a scalar"), std::string::npos) << e.what();
  }
  EXPECT_THROW(step.Backward(1, good), Error);  // 1 row, 2 shards
}

// Two float32 parameters: w, whose shard gradients are chosen so the order
// of their sum shows, (1e8 + -1e8) + 1 = 1 but 1e8 + (-1e8 + 1) = 0; and v,
// which only shard 1's loss uses. Long enough to span several tasks.
class OrderProbe : public Module {
 public:
  static constexpr int64_t kSize = 20000;
  OrderProbe() {
    w = RegisterParameter("w", Tensor::Zeros(Shape{kSize}, DType::kFloat32));
    v = RegisterParameter("v", Tensor::Zeros(Shape{3}, DType::kFloat32));
  }
  Var w, v;
};

TEST(DataParallelTest, GradientsAreTheShardsSumInShardOrderAddedToWhatTheModelHeld) {
  const std::vector<double> shard_gradient = {1e8, -1e8, 1};
  const DataParallel::ShardLoss loss = [&](Module& replica, ShardRange rows) {
    auto& probe = static_cast<OrderProbe&>(replica);
    // d/dw sum(w c) = c exactly.
    Var total =
        sum(mul(probe.w, constant(Tensor::Full(Shape{OrderProbe::kSize}, shard_gradient[rows.shard],
                                               DType::kFloat32))));
    if (rows.shard == 1) total = add(total, sum(mul_scalar(probe.v, 0.5)));
    return total;
  };
  for (int threads : {1, 2}) {
    ScopedNumThreads scoped(threads);
    auto model = std::make_shared<OrderProbe>();
    DataParallel step(model, 3, [] { return std::make_shared<OrderProbe>(); });
    step.Backward(3, loss);
    ASSERT_TRUE(model->w.has_grad() && model->v.has_grad());
    for (int64_t j = 0; j < OrderProbe::kSize; ++j) {
      ASSERT_EQ(model->w.grad().value().at(j), 1.0) << "w[" << j << "], " << threads << " threads";
    }
    for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(model->v.grad().value().at(j), 0.5);
    for (int64_t shard = 1; shard < 3; ++shard) {
      for (const Var& p : step.replica(shard).parameters()) EXPECT_FALSE(p.has_grad());
    }
    // As backward() does, a second step adds to the gradients held: shard 0
    // adds its own to them first, (1 + 1e8) - 1e8 + 1 = 1 in float32.
    step.Backward(3, loss);
    EXPECT_EQ(model->w.grad().value().at(0), 1.0);
    EXPECT_EQ(model->v.grad().value().at(0), 1.0);
  }
}

TEST(DataParallelTest, BenchWithTwoShardsTrainsTheSameTrajectory) {
  ScopedNumThreads threads(2);
  const TransformerShapes shapes = TinyShapes();
  for (ModelKind kind : {ModelKind::kExplicit, ModelKind::kImplicit}) {
    const ModelOptions options = BenchModelOptions(shapes, kind, 6, DType::kFloat64, 1);
    TransformerBench whole(options, ReversalBatch(shapes, 2));
    TransformerBench sharded(options, ReversalBatch(shapes, 2), {}, 2);
    for (int step = 0; step < 4; ++step) {
      const double expected = whole.Step();
      EXPECT_NEAR(sharded.Step(), expected, 1e-12 * std::abs(expected)) << "step " << step;
    }
  }
}

}  // namespace
}  // namespace stillpoint::data_parallel_test
