// Formatting shared by the forward and adjoint solver reports (internal).
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "solvers/forward_options.h"
#include "solvers/solver_summary.h"

namespace stillpoint::report {

inline std::string FormatDouble(const char* format, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), format, value);
  return buffer;
}

inline std::string FormatTime(double seconds) {
  if (seconds < 1e-3) return FormatDouble("%.1f us", seconds * 1e6);
  if (seconds < 1.0) return FormatDouble("%.2f ms", seconds * 1e3);
  return FormatDouble("%.3f s", seconds);
}

inline std::string FormatBytes(int64_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " B";
  if (bytes < 1024 * 1024) return FormatDouble("%.1f KiB", bytes / 1024.0);
  return FormatDouble("%.2f MiB", bytes / (1024.0 * 1024.0));
}

// Every termination type, in the order reports list them.
inline constexpr TerminationType kAllTerminations[] = {TerminationType::kConverged,
                                                       TerminationType::kInexact,
                                                       TerminationType::kUserStop,
                                                       TerminationType::kMaxIterations,
                                                       TerminationType::kStagnated,
                                                       TerminationType::kDiverged,
                                                       TerminationType::kLinearAlgebraFailure,
                                                       TerminationType::kNonFinite,
                                                       TerminationType::kFailure};

// The lines every FullReport starts with: the brief report, the message, the
// problem size and the sample count per termination type. Summary is a
// SolverSummary or an AdjointSummary.
template <typename Summary>
void WriteReportPreamble(const Summary& s, std::ostream& out) {
  out << s.BriefReport() << "\n";
  out << "message: " << s.message << "\n";
  out << "problem: batch " << s.batch_size << " x state " << s.state_size << "\n";
  out << "samples by termination:";
  for (TerminationType t : kAllTerminations) {
    const int64_t count = s.CountSamples(t);
    if (count > 0) out << " " << ToString(t) << " " << count;
  }
  out << "\n";
}

// One sample's line of a FullReport. A residual that was never measured is
// nullopt and prints as n/a.
struct ReportSample {
  TerminationType termination = TerminationType::kFailure;
  int iterations = 0;
  std::optional<double> abs_residual;
  std::optional<double> rel_residual;
  std::string note;  // appended after the residuals, e.g. " (by picard)"
};

// What follows the preamble of a FullReport, forward or adjoint alike; each
// summary fills in its own effort line, extra section and trace columns.
struct ReportBody {
  std::string effort;  // the text after "effort: "
  int64_t history_bytes = 0;
  double wall_time_seconds = 0.0;
  std::vector<OptionUsage> option_usage;
  // An optional section between the options and the trace (the forward
  // fallbacks): its title line and its lines, each printed indented.
  std::string extra_title;
  std::vector<std::string> extra_lines;
  // The trace: its title line, then entry k of every column on one line,
  // " / "-separated (the first column sets the length; a shorter column
  // prints 0 there).
  std::string trace_title;
  std::vector<std::vector<double>> trace_columns;
  // One line per sample, printed for batches of up to kMaxReportedSamples.
  std::vector<ReportSample> samples;
};

inline constexpr int64_t kMaxReportedSamples = 16;

// Writes everything after the preamble (report_format.cc).
void WriteReportBody(int64_t batch_size, const ReportBody& body, std::ostream& out);

// The FullReport of a SolverSummary or an AdjointSummary: the preamble, then
// the body.
template <typename Summary>
std::string FullReportOf(const Summary& s, const ReportBody& body) {
  std::ostringstream out;
  WriteReportPreamble(s, out);
  WriteReportBody(s.batch_size, body, out);
  return out.str();
}

}  // namespace stillpoint::report
