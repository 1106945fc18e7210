#include "solvers/report_format.h"

#include <ostream>

namespace stillpoint {

namespace report {

void WriteReportBody(int64_t batch_size, const ReportBody& body, std::ostream& out) {
  out << "effort: " << body.effort << "\n";
  out << "memory: " << FormatBytes(body.history_bytes) << " of solver buffers\n";
  out << "time: " << FormatTime(body.wall_time_seconds) << "\n";
  if (!body.option_usage.empty()) {
    out << "options given vs used:\n";
    for (const OptionUsage& usage : body.option_usage) {
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
  if (!body.extra_lines.empty()) {
    out << body.extra_title << "\n";
    for (const std::string& line : body.extra_lines) out << "  " << line << "\n";
  }
  if (!body.trace_columns.empty() && !body.trace_columns[0].empty()) {
    out << body.trace_title << "\n";
    for (size_t k = 0; k < body.trace_columns[0].size(); ++k) {
      out << "  " << k << ": ";
      for (size_t c = 0; c < body.trace_columns.size(); ++c) {
        const std::vector<double>& column = body.trace_columns[c];
        if (c > 0) out << " / ";
        out << FormatDouble("%.4e", k < column.size() ? column[k] : 0.0);
      }
      out << "\n";
    }
  }
  if (batch_size <= kMaxReportedSamples) {
    const auto residual = [](const std::optional<double>& value) {
      return value ? FormatDouble("%.3e", *value) : std::string("n/a");
    };
    for (size_t b = 0; b < body.samples.size(); ++b) {
      const ReportSample& sample = body.samples[b];
      out << "  sample " << b << ": " << ToString(sample.termination) << " after "
          << sample.iterations << " iterations, abs " << residual(sample.abs_residual) << ", rel "
          << residual(sample.rel_residual) << sample.note << "\n";
    }
  }
}

}  // namespace report

}  // namespace stillpoint
