// What a forward solve did, per sample and overall. A solver fills this in
// completely on every return: it never throws on numerical trouble and never
// hands back an unconverged state without saying so here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "solvers/forward_options.h"

namespace stillpoint {

// "anderson memory: 5 requested / 3 used" and the like: where a solver used
// an option differently from what was asked, and why.
struct OptionUsage {
  std::string name;       // option field, e.g. "anderson_memory"
  std::string requested;  // the value given
  std::string used;       // the value that took effect (max over samples)
  std::string note;       // why they differ, may be empty
};

// One link of the fallback chain that ran.
struct FallbackRecord {
  ForwardSolverType from = ForwardSolverType::kAnderson;
  ForwardSolverType to = ForwardSolverType::kPicard;
  int64_t samples_tried = 0;      // samples handed to `to`
  int64_t samples_recovered = 0;  // of those, converged under `to`
};

struct SolverSummary {
  ForwardSolverType solver_type = ForwardSolverType::kAnderson;  // the primary solver
  TerminationType termination_type = TerminationType::kFailure;  // worst over samples
  // One line: what happened and why (for Ceres backends, Ceres' own brief
  // report of the last sample that ran is appended).
  std::string message;

  int64_t batch_size = 0;
  int64_t state_size = 0;

  // -- per sample (size batch_size), describing the state returned --
  // Solver steps taken on the sample (fallback solvers' steps included).
  std::vector<int> sample_iterations;
  // Residuals of the returned iterate: ||f(z) - z|| and the relative one.
  std::vector<double> sample_abs_residual;
  std::vector<double> sample_rel_residual;
  std::vector<TerminationType> sample_termination;
  // The solver whose iterate is returned (differs from solver_type when a
  // fallback took over).
  std::vector<ForwardSolverType> sample_solver;

  // -- traces (entry 0: at z0, entry k: after iteration k) --
  // Max over the samples still iterating at that point.
  std::vector<double> abs_residual_trace;
  std::vector<double> rel_residual_trace;

  // -- effort --
  int iterations = 0;                // steps of the primary solve (max over samples)
  int64_t map_calls = 0;             // calls of problem.map (each on a batch of rows)
  int64_t function_evaluations = 0;  // rows evaluated by problem.map, summed over calls
  int64_t jvp_evaluations = 0;       // rows evaluated by problem.jvp
  int64_t energy_evaluations = 0;    // rows evaluated by problem.energy
  int64_t restarts = 0;              // history restarts (Anderson safeguard, Broyden resets)
  int64_t rejected_steps = 0;        // accelerated steps rejected by a safeguard / line search
  // Bytes of solver-owned buffers (history, Krylov bases, workspaces) held
  // during the solve, fixed at Init; excludes the map's own memory.
  int64_t history_bytes = 0;
  double wall_time_seconds = 0.0;

  // -- options given vs used --
  std::vector<OptionUsage> option_usage;
  std::vector<FallbackRecord> fallbacks;

  // True when every sample converged.
  bool IsUsable() const;
  // Number of samples whose termination is `type`.
  int64_t CountSamples(TerminationType type) const;
  // Worst (max) per-sample residuals, for logs.
  double MaxAbsResidual() const;
  double MaxRelResidual() const;

  // One line: "anderson: CONVERGED, 32/32 converged, 11 iterations, 396
  // evaluations, max rel residual 8.1e-05, 1.2 ms".
  std::string BriefReport() const;
  // Multi-line: the brief line, message, per-status counts, effort, options
  // given vs used, fallbacks, the residual trace, and (for batches of up to
  // 16 samples) one line per sample.
  std::string FullReport() const;
};

}  // namespace stillpoint
