// What a training run reports when it ends (Train, training/trainer.h):
// its figures, the solver statistics of its last step, the equilibrium
// verdict and its provenance. summary.json and summary.md are written from it
// (training/summary_json.h, training/summary_files.h); `stillpoint compare`
// reads one per variant.
#pragma once

#include <cstdint>
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
  int64_t steps = 0;           // steps completed (including resumed ones)
  int64_t skipped_steps = 0;   // steps skipped for non-finite values
  bool stopped_early = false;  // on_nonfinite: stop, or too many skips
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

}  // namespace stillpoint
