#include "solvers/adjoint/adjoint_summary.h"

#include <algorithm>
#include <sstream>

#include "solvers/report_format.h"

namespace stillpoint {

using report::FormatDouble;
using report::FormatTime;

bool AdjointSummary::IsUsable() const {
  if (sample_termination.empty()) return false;
  return std::all_of(sample_termination.begin(), sample_termination.end(),
                     [](TerminationType t) { return t == TerminationType::kConverged; });
}

double AdjointSummary::MaxRelResidual() const {
  double worst = 0.0;
  for (double r : sample_rel_residual) worst = std::max(worst, r);
  return worst;
}

int64_t AdjointSummary::CountSamples(TerminationType type) const {
  return std::count(sample_termination.begin(), sample_termination.end(), type);
}

std::string AdjointSummary::BriefReport() const {
  std::ostringstream out;
  out << ToString(mode);
  if (mode == BackwardMode::kIft) out << "/" << ToString(solver);
  out << ": " << ToString(termination_type) << ", " << CountSamples(TerminationType::kConverged)
      << "/" << batch_size << " converged, " << iterations << " iterations, " << vjp_evaluations
      << " VJPs, max rel residual "
      << (HasResiduals() ? FormatDouble("%.3g", MaxRelResidual()) : std::string("n/a"));
  if (tolerance > 0.0) {
    const bool met = HasResiduals() && MaxRelResidual() <= tolerance;
    out << " (tolerance " << FormatDouble("%.3g", tolerance) << (met ? ")" : " NOT MET)");
  }
  out << ", " << FormatTime(wall_time_seconds);
  if (warm_started) out << ", warm start";
  return out.str();
}

std::string AdjointSummary::FullReport() const {
  report::ReportBody body;
  body.effort = std::to_string(iterations) + " iterations, " + std::to_string(vjp_evaluations) +
                " batched VJPs";
  body.history_bytes = history_bytes;
  body.wall_time_seconds = wall_time_seconds;
  body.option_usage = option_usage;
  body.trace_title = "trace (max rel residual over active samples):";
  body.trace_columns = {rel_residual_trace};
  if (batch_size <= report::kMaxReportedSamples) {
    for (size_t b = 0; b < sample_termination.size(); ++b) {
      report::ReportSample& sample = body.samples.emplace_back();
      sample.termination = sample_termination[b];
      sample.iterations = b < sample_iterations.size() ? sample_iterations[b] : 0;
      // A residual that was never measured (the inexact modes) stays n/a.
      if (b < sample_abs_residual.size()) sample.abs_residual = sample_abs_residual[b];
      if (b < sample_rel_residual.size()) sample.rel_residual = sample_rel_residual[b];
    }
  }
  return report::FullReportOf(*this, body);
}

}  // namespace stillpoint
