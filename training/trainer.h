// The training loop behind `stillpoint train`.
//
// One step: draw a batch, forward, loss (+ Jacobian regularisation), zero
// grad, backward, clip, optimizer step, log. Around it: warm-up and schedule,
// evaluation on the held-out set, metrics (CSV + JSON lines), atomic
// checkpoints, SVG plots and a summary, all in the run directory:
//
//   RUN_DIR/config.yaml        the resolved config (every default filled in)
//   RUN_DIR/metrics.csv        one row per logged step (and per evaluation)
//   RUN_DIR/metrics.jsonl      the same rows as JSON objects
//   RUN_DIR/checkpoint.ckpt    the latest good state (model, optimizer, data
//                              position, RNG, solver warm starts) — resume
//                              continues it exactly (not yet with dropout)
//   RUN_DIR/loss.svg, accuracy.svg, solver.svg
//   RUN_DIR/summary.md, summary.json
//   RUN_DIR/.lock              the writer's advisory lock (run_directory.h)
//
// Numerical failure (a non-finite loss or gradient, or a forward solve that
// ends NON_FINITE/DIVERGED) is reported with the step and the solver summary;
// train.on_nonfinite decides whether the step is skipped (parameters
// unchanged) or the run stops. An adjoint solve that leaves samples above
// its tolerance is reported (train.on_unconverged: warn, the first time and
// then once per evaluation) or stops the run before the update (stop). A
// checkpoint is only written from finite parameters, so the last good one is
// never replaced by a diverged state.
#pragma once

#include <functional>
#include <iosfwd>
#include <limits>
#include <string>

#include "training/confusion.h"
#include "training/experiment.h"
#include "training/gradient_check.h"
#include "training/health.h"
#include "training/provenance.h"
#include "training/solve_counts.h"

namespace stillpoint {

struct TrainSummary {
  std::string run_dir;
  int64_t steps = 0;          // steps completed (including resumed ones)
  int64_t skipped_steps = 0;  // steps skipped for non-finite values
  bool stopped_early = false; // on_nonfinite: stop, or too many skips
  std::string stop_reason;
  double final_train_loss = 0;
  double final_train_accuracy = 0;
  // The last evaluation on the held-out set; final_eval.examples == 0 when
  // none ran (summary.json then writes test_loss and test_accuracy null
  // with test_not_evaluated saying why).
  EvalResult final_eval;
  double seconds_per_step = 0;  // median wall time of a training step
  double peak_rss_mb = 0;       // peak resident memory of the process
  double pool_peak_mb = 0;      // peak bytes held by tensors during training
  SolverStats forward;          // last step's solver statistics
  SolverStats backward;
  // The inner solves of the model's energy attentions in the last step
  // (empty without them; experiment.h AttentionForwardStats).
  SolverStats attention_forward;
  SolverStats attention_backward;
  // Every solve of every implicit layer over the run's training steps, and
  // the steps in which each family's forward or adjoint solve left samples
  // unconverged (training/solve_counts.h).
  RunSolveCounts solve_counts;
  // What the evaluations measured for the equilibrium verdict, and the
  // verdict (training/health.h), set when the run ends.
  EquilibriumMonitor equilibrium_monitor;
  Equilibrium equilibrium;
  // The last evaluation's gradient check (eval.gradient_check_batch_size)
  // and its step: the one figure summary.json, the metrics and compare's
  // report show.
  GradientCheck gradient_check;
  int64_t gradient_check_step = 0;
  int64_t num_parameters = 0;
  int64_t checkpoints_written = 0;  // by this call (cadence and the final one)
  // --resume of a run that had already reached train.steps: nothing was
  // trained or written (its checkpoint, metrics and summary are unchanged).
  bool already_complete = false;
  // SIGINT or SIGTERM stopped the run after a step (training/signals.h); the
  // checkpoint and summary of the step reached were written. 0 otherwise.
  int stop_signal = 0;
  // Version, revision, command line, overrides, machine, start and end.
  Provenance provenance;
  // Language modelling (task.kind text): the held-out loss in bits per
  // symbol (NaN otherwise), and the held-out symbols outside the vocabulary.
  bool language_model = false;
  double test_bpc = std::numeric_limits<double>::quiet_NaN();
  int64_t test_unknown_symbols = 0;
  // Classification: the held-out confusion matrix after training (empty
  // otherwise, and under mpirun).
  ConfusionMatrix confusion;

  std::string BriefReport() const;
};

struct TrainOptions {
  // Continue from RUN_DIR/checkpoint.ckpt when it exists. Its stored config
  // must match the run's except in the keys MayChangeOnResume accepts
  // (training/resume.h), unless `force`.
  bool resume = false;
  bool force = false;
  // Replace the earlier run in a non-empty run directory (its checkpoint,
  // metrics, config, summary and plots are removed first). Without it, or
  // resume, a run directory holding files is refused (training/run_directory.h).
  bool overwrite = false;
  // Stop after this many steps even if train.steps is larger (0: no limit);
  // the state is checkpointed, so a later resume continues. For tests and
  // for splitting long runs.
  int64_t stop_after_steps = 0;
  // Where progress is printed (nullptr: nowhere).
  std::ostream* progress = nullptr;
};

// Trains the experiment's model. The run directory is log.dir, or
// runs/<config file stem> (created), locked for the run (a second writer is
// a ConfigError naming the holder). Throws ConfigError for bad input (also a
// non-empty run directory without resume or overwrite, and an unreadable or
// mismatched checkpoint on resume) and Error for runtime failures (e.g. an
// unwritable run directory). Stops after the step in flight when
// StopRequested() (training/signals.h) becomes non-zero.
TrainSummary Train(Experiment& experiment, const TrainOptions& options = {});

// The settings Train refuses (ConfigError naming the key) before it
// touches the run directory: checked by `stillpoint compare` for every
// variant before the first one trains.
void CheckTrainingConfig(const Config& config);
// Throws ConfigError naming the key when a key for some model kinds is set
// in a config of another kind: model.solver.init (implicit, energy),
// train.progressive_loss.weight (tied, implicit), model.input_injection
// (explicit, tied). `stillpoint train` checks it; a comparison's variants of
// other kinds ignore such keys.
void CheckModelKindKeys(const Config& config);

// The run directory a config resolves to.
std::string RunDirectory(const Config& config, const std::string& config_path);

// Peak resident set size of this process in MiB (VmHWM), 0 if unknown.
double PeakResidentMegabytes();

}  // namespace stillpoint
