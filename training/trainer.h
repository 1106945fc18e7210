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

#include "training/experiment.h"
#include "training/train_summary.h"

namespace stillpoint {

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
