// Whole-run counts of the solves of one implicit layer: how many forward
// and adjoint solves ran, how many of their samples met the tolerance, and
// the samples per termination status.
//
// A layer's last summary (Implicit::forward_summary(), backward_summary())
// describes one solve; a training run needs every one of them: the outer
// solve of every step, the inner solve of an energy attention at every
// evaluation of the outer map, and the inner adjoint at every VJP of the
// outer adjoint solve. The layers that solve (layers/implicit_layer.h Implicit,
// the EnergyLayer readouts) keep a SolveTally pair and add each solve to
// it; the trainer takes them after each step (training/solve_counts.h).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "solvers/implicit_solve.h"
#include "solvers/forward_options.h"

namespace stillpoint {

struct SolveTally {
  int64_t solves = 0;
  // Solves with a sample that did not meet its tolerance (INEXACT, an
  // approximation by design, is not counted as a miss).
  int64_t unconverged_solves = 0;
  // Solves with a sample that ended NON_FINITE, DIVERGED or FAILURE: the
  // state handed on is the solver's best iterate, not a fixed point.
  int64_t failed_solves = 0;
  int64_t samples = 0;
  int64_t converged_samples = 0;
  int64_t inexact_samples = 0;
  // Samples per status name ("CONVERGED", "MAX_ITERATIONS", ...).
  std::map<std::string, int64_t> status_counts;

  // Adds one solve of the given per-sample terminations (no samples: not a
  // solve, nothing added).
  void Add(const std::vector<TerminationType>& sample_terminations);
  void Merge(const SolveTally& other);
  int64_t unconverged_samples() const { return samples - converged_samples - inexact_samples; }
  // Converged samples over the samples judged against a tolerance (INEXACT
  // ones left out); NaN when there were none.
  double ConvergedFraction() const;
  bool empty() const { return solves == 0; }
};

// The forward and adjoint solves of one layer (or one family of layers).
struct ImplicitTally {
  SolveTally forward;
  SolveTally backward;
  void Merge(const ImplicitTally& other) {
    forward.Merge(other.forward);
    backward.Merge(other.backward);
  }
};

// Whether a termination means the returned state is not a fixed point at
// all (NON_FINITE, DIVERGED, FAILURE), as opposed to one short of the
// tolerance.
bool IsFailedTermination(TerminationType type);

// `options` with an adjoint observer that adds every adjoint solve of the
// node to tally->backward before calling options' own observer (if any).
// The observer holds the tally, so it outlives the layer if the graph does.
ImplicitOptions TallyingAdjoints(const ImplicitOptions& options,
                                 const std::shared_ptr<ImplicitTally>& tally);

}  // namespace stillpoint
