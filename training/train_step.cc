#include "training/train_step.h"

#include <cmath>
#include <exception>
#include <utility>

#include "framework/check.h"
#include "framework/ops.h"

namespace stillpoint {
namespace {

// Solver statistics over the samples of every shard (each replica keeps
// those of its own last solve); the brief report is shard 0's.
SolverStats ShardedStats(const std::vector<SequenceModel*>& models,
                         SolverStats (*stats_of)(const SequenceModel&)) {
  SolverStats total;
  for (const SequenceModel* model : models) total.Merge(stats_of(*model));
  return total;
}

}  // namespace

TrainStep::TrainStep(std::shared_ptr<SequenceModel> model, Optimizer& optimizer,
                     const TrainStepOptions& options, const ReplicaFactory& make_replica)
    : model_(std::move(model)), optimizer_(optimizer), options_(options) {
  SP_CHECK(options_.shards >= 1, "TrainStep: shards must be >= 1, got ", options_.shards);
  SP_CHECK(options_.clip_norm >= 0, "TrainStep: clip_norm must be >= 0, got ",
           options_.clip_norm);
  for (const auto& [name, parameter] : model_->named_parameters()) {
    parameters_.push_back(parameter);
  }
  if (options_.shards > 1) {
    SP_CHECK(make_replica != nullptr, "TrainStep: ", options_.shards,
             " shards need a replica factory");
    data_parallel_ = std::make_unique<DataParallel>(
        model_, options_.shards, [make_replica, next = int64_t{1}]() mutable {
          return std::static_pointer_cast<Module>(make_replica(next++));
        });
  }
}

TrainStep::~TrainStep() = default;

void TrainStep::EnableRanks(int64_t first_shard, int64_t total_shards,
                            ShardGradientReduction* reduction, const Exchange& exchange) {
  SP_CHECK(exchange != nullptr, "TrainStep: ranks need an exchange of the step's totals");
  if (data_parallel_ == nullptr) {
    // One shard per rank still runs through DataParallel: its rows are the
    // rank's share of the batch and its gradients go to the reduction.
    data_parallel_ = std::make_unique<DataParallel>(model_, 1, [] {
      return std::shared_ptr<Module>();
    });
  }
  data_parallel_->set_layout(first_shard, total_shards);
  data_parallel_->set_reduction(reduction);
  exchange_ = exchange;
}

void TrainStep::SetDepthOverride(int64_t steps) {
  for (SequenceModel* model : models()) model->SetDepthOverride(steps);
}

std::vector<SequenceModel*> TrainStep::models() const {
  std::vector<SequenceModel*> models = {model_.get()};
  for (int64_t shard = 1; data_parallel_ && shard < data_parallel_->shards(); ++shard) {
    models.push_back(&static_cast<SequenceModel&>(data_parallel_->replica(shard)));
  }
  return models;
}

StepResult TrainStep::Run(const Batch& batch, const ExtraLoss& extra_loss, Rng* rng) {
  SP_CHECK(extra_loss == nullptr || rng != nullptr, "TrainStep: an extra loss needs a generator");
  StepResult result =
      data_parallel_ ? RunShards(batch, extra_loss, rng) : RunPlain(batch, extra_loss, rng);
  Apply(result);
  return result;
}

StepResult TrainStep::RunPlain(const Batch& batch, const ExtraLoss& extra_loss, Rng* rng) {
  StepResult result;
  SequenceModel& model = *model_;
  const Var logits = ForwardBatch(model, batch);
  Var loss = BatchLoss(logits, batch);
  if (options_.task_loss_weight != 1.0) loss = mul_scalar(loss, options_.task_loss_weight);
  if (extra_loss) loss = add(loss, extra_loss(model, batch, *rng, 1.0));
  result.loss = loss.item();
  result.forward = ForwardStats(model);
  std::tie(result.correct, result.counted) = CountCorrect(logits.value(), batch);
  if (!std::isfinite(result.loss)) {
    result.failure = "non-finite loss";
  } else {
    optimizer_.ZeroGrad();
    backward(loss);
  }
  result.backward = BackwardStats(model);
  return result;
}

StepResult TrainStep::RunShards(const Batch& batch, const ExtraLoss& extra_loss, Rng* rng) {
  StepResult result;
  DataParallel& data_parallel = *data_parallel_;
  optimizer_.ZeroGrad();
  int64_t counted = 0;
  for (int64_t target : batch.targets) counted += target != kIgnoreTarget;
  // Each shard's extra loss draws from a generator of its own, seeded from
  // one draw of the caller's.
  const uint64_t extra_seed = extra_loss ? rng->NextU64() : 0;
  std::vector<std::pair<int64_t, int64_t>> per_shard(data_parallel.shards());
  const auto shard_loss = [&](Module& replica, ShardRange rows) {
    const Batch part = SliceBatch(batch, rows.begin, rows.end);
    SequenceModel& model = static_cast<SequenceModel&>(replica);
    const Var logits = ForwardBatch(model, part);
    const int64_t local = rows.shard - data_parallel.first_shard();
    per_shard[local] = CountCorrect(logits.value(), part);
    const int64_t shard_counted = per_shard[local].second;
    // Each shard's mean over its counted targets, weighted by its share of
    // the batch's counted targets; one whose targets are all ignored adds
    // nothing to the task loss.
    Var loss = shard_counted == 0
                   ? mul_scalar(sum(logits), 0.0)
                   : mul_scalar(BatchLoss(logits, part), options_.task_loss_weight *
                                                             static_cast<double>(shard_counted) /
                                                             static_cast<double>(counted));
    if (extra_loss) {
      Rng shard_rng(extra_seed + static_cast<uint64_t>(rows.shard));
      const double share =
          static_cast<double>(part.batch_size) / static_cast<double>(batch.batch_size);
      loss = add(loss, extra_loss(model, part, shard_rng, share));
    }
    return loss;
  };
  const auto add_counts = [&] {
    result.correct = result.counted = 0;
    for (const auto& [correct, shard_counted] : per_shard) {
      result.correct += correct;
      result.counted += shard_counted;
    }
  };
  if (!exchange_) {
    result.loss = data_parallel.Backward(batch.batch_size, shard_loss);
    add_counts();
    result.forward = ShardedStats(models(), ForwardStats);
    result.backward = ShardedStats(models(), BackwardStats);
    if (!std::isfinite(result.loss)) result.failure = "non-finite loss";
    return result;
  }
  // Every rank learns of a failure on any rank, and stops with it.
  std::string error;
  try {
    data_parallel.Backward(batch.batch_size, shard_loss);
  } catch (const std::exception& ex) {
    error = ex.what();
  }
  add_counts();
  const StepTotals totals =
      exchange_(error, data_parallel.shard_losses(), {result.correct, result.counted},
                ShardedStats(models(), ForwardStats), ShardedStats(models(), BackwardStats));
  result.loss = totals.loss;
  result.correct = totals.correct;
  result.counted = totals.counted;
  result.forward = totals.forward;
  result.backward = totals.backward;
  if (totals.nonfinite_rank >= 0) {
    result.failure = "non-finite loss on rank " + std::to_string(totals.nonfinite_rank);
  } else if (!std::isfinite(result.loss)) {
    result.failure = "non-finite loss";
  }
  return result;
}

void TrainStep::Apply(StepResult& result) {
  if (result.failure.empty()) {
    result.grad_norm = GradNorm(parameters_);
    if (!std::isfinite(result.grad_norm)) result.failure = "non-finite gradient";
  }
  if (!result.failure.empty()) {
    optimizer_.ZeroGrad();
    return;
  }
  if (options_.hold_unconverged && result.unconverged()) return;
  if (options_.clip_norm > 0) ClipGradNorm(parameters_, options_.clip_norm);
  optimizer_.Step();
  result.updated = true;
}

}  // namespace stillpoint
