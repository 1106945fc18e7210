// What one call of Train (training/trainer.h) sets up around its loop, so
// that Train itself reads as the loop:
//
//   TrainSettings        every option the run reads, read once from the
//                        config before anything is built
//   OpenedRunDirectory   the run directory locked, a stale writer's
//                        temporaries removed, and the checkpoint to resume
//                        from (if any) loaded and checked
//   TrainSession         the optimizer, the batcher and the generator, the
//                        step (shards, ranks), the metrics writer, the
//                        checkpoint writer and the hooks, restored from the
//                        checkpoint on resume; Step runs one step, Finish
//                        fills in the summary when the loop ends
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "framework/random.h"
#include "training/checkpoint.h"
#include "training/distributed_training.h"
#include "training/experiment.h"
#include "training/gradient_reducer.h"
#include "training/health.h"
#include "training/metrics.h"
#include "training/optimizer.h"
#include "training/progress.h"
#include "training/run_directory.h"
#include "training/schedule.h"
#include "training/train_hooks.h"
#include "training/train_step.h"
#include "training/trainer.h"
#include "training/trainer_options.h"

namespace stillpoint {

// Every option a training run reads (train.*, eval.*, log.*,
// model.regularization.*, train.optimizer.*, train.schedule.*, health.*,
// seed), read once.
struct TrainSettings {
  TrainerOptions trainer;
  EvalOptions eval;
  LogOptions log;
  RegularizationOptions regularization;
  OptimizerOptions optimizer;
  ScheduleOptions schedule;
  HealthOptions health;
  uint64_t seed = 0;

  static TrainSettings FromConfig(const Config& config);
};

// The run directory of one Train call, held until it returns.
class OpenedRunDirectory {
 public:
  // Locks summary->run_dir (rank 0) and loads its checkpoint when resuming;
  // a fresh run checks the directory and removes an earlier run's files.
  // When the checkpoint had already reached train.steps, sets
  // summary->already_complete (and its steps and parameter count).
  OpenedRunDirectory(const Experiment& experiment,
                     const TrainOptions& options,
                     const TrainSettings& settings,
                     TrainSummary* summary);
  OpenedRunDirectory(const OpenedRunDirectory&) = delete;
  OpenedRunDirectory& operator=(const OpenedRunDirectory&) = delete;

  const std::string& checkpoint_path() const { return checkpoint_path_; }
  bool resumed() const { return resumed_; }
  CheckpointState& resume_state() { return resume_state_; }

 private:
  std::optional<RunDirectoryLock> lock_;  // one writer per run directory
  std::string checkpoint_path_;
  bool resumed_ = false;
  CheckpointState resume_state_;
};

class TrainSession {
 public:
  // Builds the run's optimizer, data, step and hooks, restores them from
  // the checkpoint when the run resumes, and writes config.yaml and the
  // experiment's run files. task_loss_weight: StepRegularizers'.
  TrainSession(Experiment& experiment,
               const TrainSettings& settings,
               const TrainOptions& options,
               OpenedRunDirectory& run_directory,
               double task_loss_weight,
               TrainSummary* summary);
  TrainSession(const TrainSession&) = delete;
  TrainSession& operator=(const TrainSession&) = delete;
  ~TrainSession();

  // Whether another step runs: train.steps not reached, this call's
  // stop_after_steps not reached, no stop signal, no hook asked to stop.
  bool Continues() const;
  // The step's learning rate (schedule) and depth (pretraining).
  void SetLearningRateAndDepth();
  // Runs one step; false when a rank failed (every rank then stops).
  bool Step(const ExtraLoss& extra_loss);
  // The hooks, in order, and the state they see after a step.
  const std::vector<TrainHook*>& hooks() const { return hooks_; }
  TrainLoopState& state() { return state_; }
  // Steps completed (resumed ones included), and the generator of the
  // steps' extra losses.
  int64_t step() const { return step_; }
  Rng& rng() { return rng_; }

  // After the loop: the final checkpoint, the stop signal, the summary's
  // figures, the final evaluation and the equilibrium verdict; on rank 0
  // the plots and the confusion matrix.
  void Finish();

 private:
  void RestoreFromCheckpoint();
  void BuildStep(double task_loss_weight);
  void RestoreShardState();
  void WriteRunFiles();
  void BuildHooks();
  bool SaveCheckpoint();

  using Clock = std::chrono::steady_clock;

  Experiment& e_;
  const TrainSettings& settings_;
  const TrainOptions& options_;
  OpenedRunDirectory& run_directory_;
  TrainSummary& summary_;
  SequenceModel& model_;
  const RankShards rank_shards_;
  const bool ranks_;   // a job of several ranks (mpirun)
  const bool writes_;  // rank 0 alone writes the run directory
  const bool implicit_;
  const NamedVars parameters_;
  std::unique_ptr<Optimizer> optimizer_;
  Batcher batcher_;
  Rng rng_;
  int64_t step_ = 0;
  std::optional<MetricsWriter> metrics_;
  std::unique_ptr<GradientReducer> reducer_;
  std::unique_ptr<TrainStep> train_step_;
  std::optional<Progress> progress_;
  std::optional<SolveCountHook> solve_count_hook_;
  std::optional<NonFiniteHook> nonfinite_hook_;
  std::optional<UnconvergedHook> unconverged_hook_;
  std::optional<SummaryHook> summary_hook_;
  std::optional<LogHook> log_hook_;
  std::optional<CheckpointHook> checkpoint_hook_;
  std::vector<TrainHook*> hooks_;
  TrainLoopState state_;
  int64_t steps_this_call_ = 0;
  Clock::time_point loop_start_;
};

}  // namespace stillpoint
