// The pieces of RUN_DIR/summary.json that are read back (by `stillpoint
// report`): solver statistics as JSON objects and the summary as a
// TrainSummary again.
#pragma once

#include <string>

#include "training/experiment.h"
#include "training/train_summary.h"

namespace stillpoint {

// {"iterations_mean": 3.5, "iterations_max": 6, "residual_max": 1e-06,
//  "tolerance": 1e-05, "converged": 32, "not_converged": 0, "inexact": 0,
//  "status": {"CONVERGED": 32}} (residual_max null when not measured).
std::string SolverStatsJson(const SolverStats& stats);

// RUN_DIR/summary.json: the run's figures, solver statistics and counts,
// gradient check and equilibrium verdict (docs/training.md lists the
// fields). Figures that were not measured are null, with the reason where
// one is needed (test_not_evaluated).
std::string SummaryJson(const TrainSummary& summary);

// Reads RUN_DIR/summary.json back into the fields the comparison report
// shows (steps, losses, accuracies, timings, memory, solver statistics,
// gradient check). ConfigError naming the file when it is missing or
// malformed.
TrainSummary ReadTrainSummary(const std::string& run_dir);

}  // namespace stillpoint
