#include "solvers/summary.h"
#include "solvers/report_format.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

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
  std::ostringstream out;
  report::WriteReportPreamble(*this, out);
  out << "effort: " << iterations << " iterations, " << map_calls << " map calls, "
      << function_evaluations << " row evaluations";
  if (jvp_evaluations > 0) out << ", " << jvp_evaluations << " jvp rows";
  if (energy_evaluations > 0) out << ", " << energy_evaluations << " energy rows";
  out << ", " << restarts << " restarts, " << rejected_steps << " rejected steps\n";
  out << "memory: " << FormatBytes(history_bytes) << " of solver buffers\n";
  out << "time: " << FormatTime(wall_time_seconds) << "\n";
  if (!option_usage.empty()) {
    out << "options given vs used:\n";
    for (const OptionUsage& usage : option_usage) {
      if (usage.used == "unused") {
        out << "  " << usage.name << ": " << usage.requested << " given but unused";
      } else {
        out << "  " << usage.name << ": " << usage.requested << " requested / " << usage.used
            << " used";
      }
      if (!usage.note.empty()) out << " (" << usage.note << ")";
      out << "\n";
    }
  }
  if (!fallbacks.empty()) {
    out << "fallbacks:\n";
    for (const FallbackRecord& record : fallbacks) {
      out << "  " << ToString(record.from) << " -> " << ToString(record.to) << ": "
          << record.samples_tried << " sample(s) tried, " << record.samples_recovered
          << " recovered\n";
    }
  }
  if (!abs_residual_trace.empty()) {
    out << "trace (iteration: max abs / max rel residual over active samples):\n";
    for (size_t k = 0; k < abs_residual_trace.size(); ++k) {
      out << "  " << k << ": " << FormatDouble("%.4e", abs_residual_trace[k]) << " / "
          << FormatDouble("%.4e", k < rel_residual_trace.size() ? rel_residual_trace[k] : 0.0)
          << "\n";
    }
  }
  if (batch_size <= 16) {
    for (size_t b = 0; b < sample_termination.size(); ++b) {
      out << "  sample " << b << ": " << ToString(sample_termination[b]) << " after "
          << (b < sample_iterations.size() ? sample_iterations[b] : 0) << " iterations, abs "
          << FormatDouble("%.3e", b < sample_abs_residual.size() ? sample_abs_residual[b] : 0.0)
          << ", rel "
          << FormatDouble("%.3e", b < sample_rel_residual.size() ? sample_rel_residual[b] : 0.0);
      if (b < sample_solver.size() && sample_solver[b] != solver_type) {
        out << " (by " << ToString(sample_solver[b]) << ")";
      }
      out << "\n";
    }
  }
  return out.str();
}

}  // namespace stillpoint
