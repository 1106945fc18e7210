// Formatting shared by the forward and adjoint solver reports (internal).
#pragma once

#include <cstdint>
#include <cstdio>
#include <ostream>
#include <string>

#include "solvers/options.h"

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

}  // namespace stillpoint::report
