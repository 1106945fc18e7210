// What `stillpoint train` does around each training step (training/
// train_step.h), as callbacks: the loop in Train runs a step, then each
// hook in order, until a hook asks it to stop.
//
//   SolveCountHook   every solve of the step into the run's counts
//   NonFiniteHook    a failed step: report it, count it, skip or stop
//   UnconvergedHook  an adjoint solve (of any implicit layer) above its
//                    tolerance: warn or stop
//   SummaryHook      the step's time, solver statistics and training loss
//                    into the run's summary
//   LogHook          the metrics row of every log_every-th step, with the
//                    evaluation, gradient check, attention diagnostics,
//                    plots and progress of every eval_every-th
//   CheckpointHook   a checkpoint every checkpoint_every steps
//
// A new per-step behaviour is a hook of its own, added to the list in
// TrainSession::BuildHooks (training/train_session.cc).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "training/experiment.h"
#include "training/metrics.h"
#include "training/progress.h"
#include "training/train_step.h"
#include "training/train_summary.h"
#include "training/trainer_options.h"

namespace stillpoint {

// The run as the hooks see it after a step.
struct TrainLoopState {
  int64_t step = 0;         // steps completed, this one included
  int64_t total_steps = 0;  // train.steps
  StepResult result;        // this step's
  double step_seconds = 0;  // its wall time (forward to update)
  // Wall time from the start of this training call's first step to the end
  // of this one, earlier evaluations and logging included.
  double elapsed_seconds = 0;
  // The wall time of this training call's steps alone (forward to update,
  // summed), without evaluations, logging and checkpoints: what reaching an
  // accuracy cost in training, whatever the evaluations measured besides.
  double train_seconds = 0;
  // Set by a hook: the run stops after this step (summary.stop_reason says
  // why).
  bool stop = false;
  TrainSummary* summary = nullptr;
};

class TrainHook {
 public:
  virtual ~TrainHook() = default;
  // After each step. Returning false skips the later hooks for this step
  // (a failed step is not logged as a trained one).
  virtual bool StepEnded(TrainLoopState& state) = 0;
};

// The step's solves, failed steps' too, into TrainSummary::solve_counts.
class SolveCountHook : public TrainHook {
 public:
  bool StepEnded(TrainLoopState& state) override;
};

// train.on_nonfinite and train.max_skipped_steps.
class NonFiniteHook : public TrainHook {
 public:
  NonFiniteHook(const TrainerOptions& options, Progress& progress, MetricsWriter& metrics);
  bool StepEnded(TrainLoopState& state) override;

 private:
  TrainerOptions options_;
  Progress& progress_;
  MetricsWriter& metrics_;
  int64_t consecutive_skips_ = 0;
};

// train.on_unconverged.
class UnconvergedHook : public TrainHook {
 public:
  UnconvergedHook(const TrainerOptions& options, Progress& progress);
  bool StepEnded(TrainLoopState& state) override;
  // warn: at an evaluation, the steps with unconverged samples since the
  // last report (none: nothing printed).
  void ReportSinceLast();

 private:
  TrainerOptions options_;
  Progress& progress_;
  bool reported_ = false;
  int64_t since_report_ = 0;
  std::string last_;
};

// The run summary's per-step parts (TrainSummary).
class SummaryHook : public TrainHook {
 public:
  explicit SummaryHook(const SequenceModel& model) : model_(model) {}
  bool StepEnded(TrainLoopState& state) override;
  // The median wall time of the steps so far (0 before the first).
  double MedianStepSeconds() const;

 private:
  const SequenceModel& model_;
  std::vector<double> step_seconds_;
};

// The metrics rows, evaluations and plots.
class LogHook : public TrainHook {
 public:
  struct Context {
    TrainerOptions trainer;
    EvalOptions eval;
    LogOptions log;
    SequenceModel* model = nullptr;
    const Dataset* test = nullptr;
    DType dtype = DType::kFloat32;
    // Language modelling: the held-out loss is also logged in bits per
    // symbol (column test_bpc).
    bool language_model = false;
    // eval.gradient_check_batch_size > 0 on a model with an implicit layer.
    Batch gradient_check_batch;
    std::string run_dir;
    // Before an evaluation: the step's depth override is cleared.
    std::function<void()> before_eval;
    // The optimizer's learning rate of the step.
    std::function<double()> learning_rate;
  };
  LogHook(Context context, Progress& progress, MetricsWriter& metrics,
          UnconvergedHook* unconverged);
  bool StepEnded(TrainLoopState& state) override;

  // The run's curves from its metrics file (loss.svg, accuracy.svg,
  // solver.svg in run_dir).
  static void WritePlots(const std::string& run_dir);

 private:
  // The held-out columns of an evaluation step.
  void Evaluate(TrainLoopState& state, std::map<std::string, double>& row);

  Context context_;
  Progress& progress_;
  MetricsWriter& metrics_;
  UnconvergedHook* unconverged_;
  bool implicit_ = false;
  std::set<std::string> collapse_warned_;  // energy attentions already warned about
  double window_loss_ = 0, window_correct_ = 0, window_count_ = 0, window_steps_ = 0;
};

// train.checkpoint_every.
class CheckpointHook : public TrainHook {
 public:
  CheckpointHook(int64_t every, std::function<bool()> save);
  bool StepEnded(TrainLoopState& state) override;

 private:
  int64_t every_;
  std::function<bool()> save_;
};

}  // namespace stillpoint
