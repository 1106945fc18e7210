// One training step, the same for `stillpoint train`, data-parallel shards,
// jobs of several ranks and `stillpoint bench`:
//
//   forward -> loss (+ the model's extra loss terms) -> zero grad ->
//   backward -> gradient norm -> [clip] -> optimizer update
//
//   TrainStep step(model, *optimizer, {.clip_norm = 1.0});
//   for (...) {
//     const StepResult result = step.Run(batcher.Next());
//     if (!result.updated) ...  // result.failure says why
//   }
//
// With shards > 1 (TrainStepOptions::shards) the batch is cut into shards of
// whole rows that run on replicas of the model at once (training/
// data_parallel.h); with EnableRanks the shards are this process's share of
// a job of several ranks (training/distributed.h) and the gradients are
// summed across ranks during the backward pass. One shard in one process is
// a plain forward and backward pass on the model itself.
//
// A step whose loss or gradient is not finite, or one of whose forward
// solves ended NON_FINITE, DIVERGED or FAILURE (the layer then hands on the
// solver's best iterate, not a fixed point), is not applied: the
// parameters and the optimizer's state are unchanged, the gradients are
// cleared and StepResult::failure says what failed. A step whose
// adjoint solve (of any implicit layer) left samples above their tolerance
// is held back (not applied) when TrainStepOptions::hold_unconverged is set
// (train.on_unconverged: stop).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "framework/random.h"
#include "layers/models.h"
#include "training/data_parallel.h"
#include "training/data/dataset.h"
#include "training/distributed_training.h"
#include "training/batch_loss.h"
#include "training/solver_stats.h"
#include "training/optimizer.h"
#include "training/solve_counts.h"

namespace stillpoint {

struct TrainStepOptions {
  // Data-parallel shards of each batch run by this process (train.shards).
  // 1: a plain step on the model.
  int64_t shards = 1;
  // Rescale the summed gradient to this norm when it is larger
  // (train.clip_norm); 0 leaves it as it is.
  double clip_norm = 0;
  // Whether a step whose adjoint solve left samples above their tolerance
  // is held back instead of applied (train.on_unconverged: stop).
  bool hold_unconverged = false;
  // The task loss's weight in the step's loss (1 - alpha of the progressive
  // loss, train.progressive_loss.weight; the extra loss adds the rest).
  double task_loss_weight = 1.0;
};

// A term added to a step's loss by the model (a regulariser of its
// implicit layer): its value on `rows` (the whole batch, or one shard's
// rows) scaled by `scale` (1 for the whole batch; the shard's share of the
// batch's rows for a shard), drawing whatever randomness it needs from
// `rng` (the caller's generator on a plain step; one seeded per shard from
// a single draw of it, so the result does not depend on which thread runs
// which shard).
using ExtraLoss =
    std::function<Var(SequenceModel& model, const Batch& rows, Rng& rng, double scale)>;

struct StepResult {
  // The batch loss (including the extra loss) before the update.
  double loss = 0;
  // Correct predictions and counted (not ignored) targets of the batch.
  int64_t correct = 0;
  int64_t counted = 0;
  // The norm of the summed gradient before clipping (0 when it was not
  // formed: a failed step).
  double grad_norm = 0;
  // The last solves of the model's implicit layer, over every shard (and
  // rank).
  SolverStats forward;
  SolverStats backward;
  // Every solve of every implicit layer in this step, over this process's
  // shards (training/solve_counts.h).
  SolveCounts solves;
  // "non-finite loss", "non-finite gradient", "non-finite loss on rank 1",
  // "the model forward solve ended DIVERGED 2 (...)"; empty when the
  // step's values were finite and every forward solve returned a state.
  std::string failure;
  // Whether an adjoint solve of any implicit layer left samples above their
  // tolerance.
  bool unconverged() const { return backward.not_converged > 0 || solves.AdjointUnconverged(); }
  // Whether the optimizer applied the step.
  bool updated = false;
};

class TrainStep {
 public:
  // Builds a replica of the model for shard `replica` (1 .. shards - 1 of
  // this process, counted among the job's shards under ranks): a module of
  // the same structure with dropout streams of its own.
  using ReplicaFactory = std::function<std::shared_ptr<SequenceModel>(int64_t replica)>;

  // make_replica is needed when options.shards > 1 or ranks are enabled.
  // The optimizer must update the model's parameters; both must outlive
  // the step.
  TrainStep(std::shared_ptr<SequenceModel> model, Optimizer& optimizer,
            const TrainStepOptions& options, const ReplicaFactory& make_replica = nullptr);
  ~TrainStep();

  // Makes the shards those of process `first_shard / shards` among
  // `total_shards` and sums the gradients through `reduction` (not owned;
  // training/gradient_reducer.h). `exchange` runs after every step's shards
  // (or a failure of one: its message) and returns the totals every rank
  // agrees on (training/distributed_training.h ExchangeStepTotals; throws
  // RankFailure when a rank failed).
  using Exchange = std::function<StepTotals(const std::string& failure,
                                            const std::vector<double>& shard_losses,
                                            std::pair<int64_t, int64_t> correct_counted,
                                            const SolverStats& forward,
                                            const SolverStats& backward)>;
  void EnableRanks(int64_t first_shard, int64_t total_shards, ShardGradientReduction* reduction,
                   const Exchange& exchange);

  // One step on `batch`. extra_loss (nullptr: none) is added to the loss;
  // rng feeds it. Throws what the model throws (the parameters are then
  // unchanged) and RankFailure when another rank failed.
  StepResult Run(const Batch& batch, const ExtraLoss& extra_loss = nullptr, Rng* rng = nullptr);

  // Sets the test-time depth of every replica's implicit layer
  // (SequenceModel::SetDepthOverride): the unrolled steps of pretraining.
  void SetDepthOverride(int64_t steps);

  // The model and the replicas of this process's shards, in shard order
  // (their solvers keep warm starts, their dropout streams their state).
  std::vector<SequenceModel*> models() const;
  SequenceModel& model() const { return *model_; }
  const TrainStepOptions& options() const { return options_; }

 private:
  StepResult RunPlain(const Batch& batch, const ExtraLoss& extra_loss, Rng* rng);
  StepResult RunShards(const Batch& batch, const ExtraLoss& extra_loss, Rng* rng);
  // The gradient norm, then clipping and the update, unless a failure or
  // hold_unconverged stops it.
  void Apply(StepResult& result);

  std::shared_ptr<SequenceModel> model_;
  Optimizer& optimizer_;
  TrainStepOptions options_;
  VarList parameters_;
  std::unique_ptr<DataParallel> data_parallel_;
  Exchange exchange_;
};

}  // namespace stillpoint
