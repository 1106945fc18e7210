// What a backward pass did (AdjointSummary), reported like the forward
// SolverSummary (solvers/solver_summary.h) and with the same FullReport layout.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "solvers/adjoint/backward_options.h"
#include "solvers/forward_options.h"
#include "solvers/solver_summary.h"

namespace stillpoint {

// What a backward pass did, reported like the forward SolverSummary.
struct AdjointSummary {
  BackwardMode mode = BackwardMode::kIft;
  AdjointSolverType solver = AdjointSolverType::kFixedPoint;  // meaningful for kIft
  // Worst over samples (kConverged when every sample met the tolerance).
  // The inexact modes (kJfb, kPhantom, kUnrolled) solve no equation: they
  // report kInexact, their recorded steps as iterations, empty residual
  // vectors (no residual is computed; reports print "n/a") and a message
  // that says so. A fixed-budget solve (tolerance 0) ends kInexact too.
  TerminationType termination_type = TerminationType::kFailure;
  std::string message;
  // The relative tolerance the solve had to meet (BackwardOptions::tolerance
  // for kIft); 0 when there was none (a fixed budget, or an inexact mode).
  double tolerance = 0.0;

  int64_t batch_size = 0;
  int64_t state_size = 0;

  // -- per sample (size batch_size), describing the returned w --
  std::vector<int> sample_iterations;  // VJPs spent on the sample's solve
  // ||g + J^T w - w||_2 and the same divided by ||g||_2 (0 when g = 0).
  std::vector<double> sample_abs_residual;
  std::vector<double> sample_rel_residual;
  std::vector<TerminationType> sample_termination;

  // Max relative residual over the samples still iterating: entry 0 at the
  // start, entry k after iteration k (Krylov solvers report their estimate).
  std::vector<double> rel_residual_trace;

  int iterations = 0;           // max over samples
  int64_t vjp_evaluations = 0;  // batched VJP calls (each on all B rows)
  int64_t history_bytes = 0;    // solver-owned buffers (Krylov bases, LU, history)
  bool warm_started = false;    // started from a previous solution
  double wall_time_seconds = 0.0;
  std::vector<OptionUsage> option_usage;

  // True when every sample converged.
  bool IsUsable() const;
  // Whether residuals were measured (false for the inexact modes).
  bool HasResiduals() const { return !sample_rel_residual.empty(); }
  // Max over samples; only meaningful when HasResiduals().
  double MaxRelResidual() const;
  int64_t CountSamples(TerminationType type) const;
  // One line: "ift/gmres: CONVERGED, 4/4 converged, 9 iterations, 10 VJPs,
  // max rel residual 3.1e-09 (tolerance 1e-06), 0.4 ms"; the residual is
  // "n/a" when none was measured, and a tolerance not met is marked
  // "(tolerance 1e-05 NOT MET)".
  std::string BriefReport() const;
  // The brief line, message, per-status counts, effort, options given vs
  // used, the residual trace and (for up to 16 samples) one line per sample.
  std::string FullReport() const;
};

}  // namespace stillpoint
