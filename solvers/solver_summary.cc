#include "solvers/solver_summary.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "solvers/report_format.h"

namespace stillpoint {
namespace {

using report::FormatBytes;
using report::FormatDouble;
using report::FormatTime;

}  // namespace

bool SolverSummary::IsUsable() const {
  if (sample_termination.empty()) return false;
  return std::all_of(sample_termination.begin(), sample_termination.end(),
                     [](TerminationType t) { return t == TerminationType::kConverged; });
}

int64_t SolverSummary::CountSamples(TerminationType type) const {
  return std::count(sample_termination.begin(), sample_termination.end(), type);
}

double SolverSummary::MaxAbsResidual() const {
  double worst = 0.0;
  for (double r : sample_abs_residual) worst = std::max(worst, r);
  return worst;
}

double SolverSummary::MaxRelResidual() const {
  double worst = 0.0;
  for (double r : sample_rel_residual) worst = std::max(worst, r);
  return worst;
}

std::string SolverSummary::BriefReport() const {
  std::ostringstream out;
  out << ToString(solver_type) << ": " << ToString(termination_type) << ", "
      << CountSamples(TerminationType::kConverged) << "/" << batch_size << " converged, "
      << iterations << " iterations, " << function_evaluations << " evaluations, max abs residual "
      << FormatDouble("%.3g", MaxAbsResidual()) << ", max rel residual "
      << FormatDouble("%.3g", MaxRelResidual()) << ", " << FormatTime(wall_time_seconds);
  if (!fallbacks.empty()) out << ", " << fallbacks.size() << " fallback(s)";
  return out.str();
}

std::string SolverSummary::FullReport() const {
  report::ReportBody body;
  body.effort = std::to_string(iterations) + " iterations, " + std::to_string(map_calls) +
                " map calls, " + std::to_string(function_evaluations) + " row evaluations";
  if (jvp_evaluations > 0) body.effort += ", " + std::to_string(jvp_evaluations) + " jvp rows";
  if (energy_evaluations > 0) {
    body.effort += ", " + std::to_string(energy_evaluations) + " energy rows";
  }
  body.effort += ", " + std::to_string(restarts) + " restarts, " + std::to_string(rejected_steps) +
                 " rejected steps";
  body.history_bytes = history_bytes;
  body.wall_time_seconds = wall_time_seconds;
  body.option_usage = option_usage;
  if (!fallbacks.empty()) {
    body.extra_title = "fallbacks:";
    for (const FallbackRecord& record : fallbacks) {
      body.extra_lines.push_back(std::string(ToString(record.from)) + " -> " + ToString(record.to) +
                                 ": " + std::to_string(record.samples_tried) +
                                 " sample(s) tried, " + std::to_string(record.samples_recovered) +
                                 " recovered");
    }
  }
  body.trace_title = "trace (iteration: max abs / max rel residual over active samples):";
  body.trace_columns = {abs_residual_trace, rel_residual_trace};
  if (batch_size <= report::kMaxReportedSamples) {
    for (size_t b = 0; b < sample_termination.size(); ++b) {
      report::ReportSample& sample = body.samples.emplace_back();
      sample.termination = sample_termination[b];
      sample.iterations = b < sample_iterations.size() ? sample_iterations[b] : 0;
      // A forward solve measures every residual; a missing one prints as 0.
      sample.abs_residual = b < sample_abs_residual.size() ? sample_abs_residual[b] : 0.0;
      sample.rel_residual = b < sample_rel_residual.size() ? sample_rel_residual[b] : 0.0;
      if (b < sample_solver.size() && sample_solver[b] != solver_type) {
        sample.note = std::string(" (by ") + ToString(sample_solver[b]) + ")";
      }
    }
  }
  return report::FullReportOf(*this, body);
}

}  // namespace stillpoint
