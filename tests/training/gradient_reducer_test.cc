// Data-parallel gradients summed across ranks (training/gradient_reducer.h,
// training/distributed.h). Runs in one process under ctest, and under
// `mpirun -np 2` and `-np 3` from scripts/mpi_test.sh: every test holds for
// any rank count.
//   - each rank runs its S shards of the job's P x S; after the reduction
//     every rank's gradients are bitwise those of one process running all
//     P x S shards (computed on each rank as the reference), with overlap on
//     and off, one bucket and many, explicit and implicit models;
//   - a backward sweep reports each leaf once, with its complete gradient;
//   - a DataParallel placed at shards 2..3 of 5 cuts the global rows;
//   - per-shard checkpoint state is renamed between global and local shard
//     indices; the checkpoint's config records the total shard count;
//   - a failure on one rank is thrown on every rank, naming that rank;
//     gathered strings come in rank order.
#include "training/gradient_reducer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "framework/leaf_gradient_observer.h"
#include "framework/ops.h"
#include "framework/parallel.h"
#include "training/cli/bench_command.h"
#include "training/config_schema.h"
#include "training/distributed.h"
#include "training/distributed_training.h"
#include "training/optimizer.h"

namespace stillpoint::gradient_reducer_test {
namespace {

// Starts MPI when the test runs under mpirun (a no-op otherwise).
class DistributedEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { InitializeDistributed(nullptr, nullptr); }
};
::testing::Environment* const kEnvironment =
    ::testing::AddGlobalTestEnvironment(new DistributedEnvironment);

// 6 sequences of 5 tokens: up to 6 shards (3 ranks x 2).
TransformerShapes TinyShapes() {
  TransformerShapes shapes;
  shapes.vocab_size = 7;
  shapes.batch = 6;
  shapes.length = 5;
  shapes.dim = 8;
  shapes.heads = 2;
  shapes.hidden = 12;
  shapes.num_layers = 2;
  return shapes;
}

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

std::vector<Tensor> Gradients(const SequenceModel& model) {
  std::vector<Tensor> grads;
  for (const Var& p : model.parameters()) grads.push_back(p.grad().value());
  return grads;
}

struct ReduceCase {
  ModelKind kind;
  bool overlap;
  int64_t bucket_bytes;
  int64_t shards_per_rank;
};

class GradientReducerTest : public ::testing::TestWithParam<ReduceCase> {};

TEST_P(GradientReducerTest, EveryRankGetsTheBitsOfOneProcessWithAllTheShards) {
  const ReduceCase c = GetParam();
  ScopedNumThreads threads(1);
  const ModelOptions options = BenchModelOptions(TinyShapes(), c.kind, 6, DType::kFloat32, 3);
  const TokenBatch batch = ReversalBatch(TinyShapes(), 5);
  const RankShards layout = RankShardsOf(c.shards_per_rank);
  ASSERT_LE(layout.total, 6) << "the test batch has 6 rows";
  const auto make = [&] { return std::make_shared<SequenceModel>(options); };

  // The reference: one process, every shard of the job.
  auto reference = make();
  DataParallel whole(reference, layout.total, make);
  const double whole_loss = whole.Backward(6, TokenLoss(batch));

  auto model = make();
  DataParallel mine(model, layout.count, make);
  mine.set_layout(layout.first, layout.total);
  GradientReducerOptions reducer_options;
  reducer_options.overlap = c.overlap;
  reducer_options.bucket_bytes = c.bucket_bytes;
  GradientReducer reducer(model->parameters(), layout.count, reducer_options);
  mine.set_reduction(&reducer);
  // Twice: the reducer starts each step afresh.
  for (int step = 0; step < 2; ++step) {
    for (const Var& p : model->parameters()) Var(p).zero_grad();
    const double local_loss = mine.Backward(6, TokenLoss(batch));
    EXPECT_TRUE(std::isfinite(local_loss));
    const std::vector<Tensor> expected = Gradients(*reference);
    const std::vector<Tensor> actual = Gradients(*model);
    ASSERT_EQ(actual.size(), expected.size());
    for (std::size_t i = 0; i < expected.size(); ++i) {
      ASSERT_TRUE(actual[i].defined()) << "parameter " << i;
      EXPECT_TRUE(BitwiseEqual(actual[i], expected[i]))
          << "parameter " << i << " on rank " << WorldRank() << " of " << WorldSize();
    }
  }
  EXPECT_GE(reducer.buckets(), 1);
  if (c.bucket_bytes < 64) {
    EXPECT_EQ(reducer.buckets(), static_cast<int64_t>(model->parameters().size()));
  }
  // This rank's shards computed what the reference's same shards did.
  ASSERT_EQ(static_cast<int64_t>(mine.shard_losses().size()), layout.count);
  for (int64_t s = 0; s < layout.count; ++s) {
    EXPECT_EQ(mine.shard_losses()[s], whole.shard_losses()[layout.first + s]) << "shard " << s;
  }
  EXPECT_TRUE(std::isfinite(whole_loss));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, GradientReducerTest,
    ::testing::Values(ReduceCase{ModelKind::kExplicit, true, 1 << 20, 1},
                      ReduceCase{ModelKind::kExplicit, true, 16, 2},
                      ReduceCase{ModelKind::kExplicit, false, 16, 1},
                      ReduceCase{ModelKind::kImplicit, true, 256, 1},
                      ReduceCase{ModelKind::kImplicit, false, 1 << 20, 2}),
    [](const auto& info) {
      const ReduceCase& c = info.param;
      return std::string(c.kind == ModelKind::kExplicit ? "Explicit" : "Implicit") +
             (c.overlap ? "Overlap" : "AfterBackward") + "Bucket" +
             std::to_string(c.bucket_bytes) + "Shards" + std::to_string(c.shards_per_rank);
    });

// With a shard's gradient of a parameter added twice in the chain, or one
// left out, the sums would differ from the reference: the test above would
// fail. This one checks the sweep's report that the reducer relies on.
TEST(LeafGradientObserverTest, ReportsEachLeafOnceWithItsCompleteGradient) {
  Var w(Tensor::FromVector(Shape{2}, {1.5, -2.0}, DType::kFloat64), true);
  Var b(Tensor::FromVector(Shape{2}, {0.25, 0.5}, DType::kFloat64), true);
  // w is used twice: its gradient is complete only after both uses.
  const Var y = sum(add(mul(w, w), add(w, b)));
  std::vector<std::pair<const void*, std::vector<double>>> seen;
  const ScopedLeafGradientObserver::Observer observer = [&](const Var& leaf) {
    seen.emplace_back(leaf.node(), leaf.grad().value().ToVector());
  };
  {
    const ScopedLeafGradientObserver scope(&observer);
    backward(y);
  }
  ASSERT_EQ(seen.size(), 2u);
  for (const auto& [node, grad] : seen) {
    const Var& leaf = node == w.node() ? w : b;
    ASSERT_TRUE(node == w.node() || node == b.node());
    EXPECT_EQ(grad, leaf.grad().value().ToVector());
  }
  EXPECT_EQ(w.grad().value().ToVector(), (std::vector<double>{4.0, -3.0}));  // 2w + 1
  // Outside the scope nothing is reported.
  backward(sum(mul(b, b)));
  EXPECT_EQ(seen.size(), 2u);
}

TEST(DataParallelLayoutTest, ShardsPlacedAmongTheJobsCutTheGlobalRows) {
  ScopedNumThreads threads(1);
  const ModelOptions options =
      BenchModelOptions(TinyShapes(), ModelKind::kExplicit, 6, DType::kFloat32, 3);
  const auto make = [&] { return std::make_shared<SequenceModel>(options); };
  DataParallel step(make(), 2, make);
  step.set_layout(2, 5);
  std::vector<ShardRange> seen(2);
  const TokenBatch batch = ReversalBatch(TinyShapes(), 5);
  const DataParallel::ShardLoss loss = TokenLoss(batch);
  step.Backward(6, [&](Module& replica, ShardRange rows) {
    seen[rows.shard - 2] = rows;
    return loss(replica, rows);
  });
  // 6 rows in 5 shards: 2, 1, 1, 1, 1; shards 2 and 3 are rows 3 and 4.
  EXPECT_EQ(seen[0].shard, 2);
  EXPECT_EQ(seen[0].begin, 3);
  EXPECT_EQ(seen[0].end, 4);
  EXPECT_EQ(seen[1].shard, 3);
  EXPECT_EQ(seen[1].begin, 4);
  EXPECT_EQ(seen[1].end, 5);
  EXPECT_THROW(step.set_layout(4, 5), Error);  // shards 4..5 of 5
}

TEST(ShardStateTest, PerShardStateIsRenamedBetweenGlobalAndLocalIndices) {
  NamedTensors solver = {{"adjoint_warm_start/0", Tensor::Ones(Shape{1}, DType::kFloat32)},
                         {"adjoint_warm_start/3", Tensor::Zeros(Shape{2}, DType::kFloat32)},
                         {"adjoint_warm_start/4", Tensor::Ones(Shape{3}, DType::kFloat32)}};
  std::map<std::string, std::string> streams = {
      {"0.cell.dropout", "a"}, {"3.cell.dropout", "b"}, {"4.head.dropout", "c"}};
  SelectShardState(solver, streams, 3, 2, &solver, &streams);
  ASSERT_EQ(solver.size(), 2u);
  EXPECT_EQ(solver[0].first, "adjoint_warm_start/0");
  EXPECT_EQ(solver[0].second.numel(), 2);
  EXPECT_EQ(solver[1].first, "adjoint_warm_start/1");
  EXPECT_EQ(solver[1].second.numel(), 3);
  EXPECT_EQ(streams, (std::map<std::string, std::string>{{"0.cell.dropout", "b"},
                                                          {"1.head.dropout", "c"}}));

  Config config = Config::FromYaml(StillpointSchema(), "train:\n  shards: 2\n", "test");
  RankShards layout;
  layout.count = 2;
  layout.total = 6;
  EXPECT_EQ(CheckpointConfig(config, layout).GetInt("train.shards"), 6);
  layout.total = 2;
  EXPECT_EQ(CheckpointConfig(config, layout).GetInt("train.shards"), 2);
}

TEST(DistributedTest, AFailureOnOneRankIsThrownOnEveryRankNamingIt) {
  const int last = WorldSize() - 1;
  try {
    AgreeOnFailure(WorldRank() == last ? "out of cheese" : "");
    FAIL() << "no failure was agreed on";
  } catch (const RankFailure& failure) {
    EXPECT_EQ(failure.rank(), last);
    EXPECT_EQ(failure.message(), "out of cheese");
    EXPECT_EQ(std::string(failure.what()), "rank " + std::to_string(last) + ": out of cheese");
  }
  EXPECT_NO_THROW(AgreeOnFailure(""));
}

TEST(DistributedTest, GatheredStringsComeInRankOrder) {
  const std::vector<std::string> all = AllGatherStrings(std::string(WorldRank() + 1, 'x'));
  ASSERT_EQ(static_cast<int>(all.size()), WorldSize());
  for (int rank = 0; rank < WorldSize(); ++rank) {
    EXPECT_EQ(all[rank], std::string(rank + 1, 'x'));
  }
  EXPECT_EQ(AgreeOnMax(WorldRank() * 10), (WorldSize() - 1) * 10);
}

}  // namespace
}  // namespace stillpoint::gradient_reducer_test
