// The solver statistics a training step, an evaluation and the run's
// summary report: iterations, the worst residual beside its tolerance and the
// samples per termination status, of the model's implicit layer and of its
// energy attentions' inner solves.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <string>

#include "layers/models.h"

namespace stillpoint {

// Forward-solver statistics of the last Forward of an implicit model (all
// zero, and Ran() false, for explicit and tied models).
struct SolverStats {
  double iterations_mean = 0;
  double iterations_max = 0;
  // Relative residual, max over samples; NaN when none was measured (the
  // inexact backward modes jfb, phantom and unrolled).
  double residual_max = 0;
  // The relative tolerance the residual had to meet (the forward solver's
  // relative_tolerance in stop_mode relative, the adjoint's tolerance); 0
  // when there was none (a fixed budget, an inexact mode, or a forward solve
  // judged by its absolute tolerance).
  double tolerance = 0;
  int64_t converged = 0;      // samples
  int64_t not_converged = 0;  // samples that missed their tolerance or failed
  int64_t inexact = 0;        // samples ended INEXACT: an approximation by design
  // Samples per termination status ("CONVERGED", "MAX_ITERATIONS", ...),
  // only the statuses that occurred.
  std::map<std::string, int64_t> status_counts;
  std::string brief;  // the summary's BriefReport()

  // Whether any sample was solved (false for a model without this family of
  // solve, e.g. the forward solve of an explicit or tied model): its figures
  // were never measured and are written as null, not 0.
  bool Ran() const { return converged + not_converged + inexact > 0; }
  // Whether residual_max was measured.
  bool HasResidual() const { return !std::isnan(residual_max); }
  // Whether a tolerance was set and the worst residual is above it.
  bool ToleranceMissed() const {
    return tolerance > 0 && HasResidual() && residual_max > tolerance;
  }
  // Adds another batch's (or shard's) statistics: sums the counts, takes
  // maxima of the maxima (a measured residual wins over an unmeasured one)
  // and weighs the means by sample count; keeps this brief unless empty.
  void Merge(const SolverStats& other);
};
SolverStats ForwardStats(const SequenceModel& model);
SolverStats BackwardStats(const SequenceModel& model);
// The inner solves of the model's energy attentions (energy_attention.h),
// each as its last Forward left it, combined (mean of the iteration means,
// worst maxima and residuals, sample counts added); empty without them.
SolverStats AttentionForwardStats(const SequenceModel& model);
SolverStats AttentionBackwardStats(const SequenceModel& model);

// The worst residual beside its tolerance, for tables and summaries:
// "3.10e-09 <= 1e-05", "5.80e-03 > 1e-05 NOT MET", "5.80e-03" (no
// tolerance), "n/a" (not measured: an inexact mode), "-" (no solve).
std::string ResidualCell(const SolverStats& stats);
// Samples per status: "CONVERGED 30, MAX_ITERATIONS 2"; "-" (no solve).
std::string StatusCell(const SolverStats& stats);

}  // namespace stillpoint
