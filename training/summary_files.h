// The run's summary files, written once when Train ends (rank 0 only):
//
//   RUN_DIR/summary.json  the figures, solver statistics, counts and verdict
//                         (training/summary_json.h; read back by `report`)
//   RUN_DIR/summary.md    the same for a reader: the brief report, the last
//                         solves, the equilibrium verdict, the gradient
//                         check, held-out text figures and per-class accuracy
#pragma once

#include <string>

#include "training/train_summary.h"

namespace stillpoint {

// The text of RUN_DIR/summary.md; model_name is the model's Name().
std::string SummaryMarkdown(const TrainSummary& summary, const std::string& model_name);

// Writes summary.json and summary.md into summary.run_dir (atomically, as
// WriteTextFile does).
void WriteSummaryFiles(const TrainSummary& summary, const std::string& model_name);

}  // namespace stillpoint
