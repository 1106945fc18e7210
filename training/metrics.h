// Metrics of a run, written as they happen to RUN_DIR/metrics.csv and/or
// RUN_DIR/metrics.jsonl (one JSON object per line). Every row has the same
// columns, declared when the writer is created; a value that does not apply
// to a row (e.g. test accuracy on a step without evaluation) is written as an
// empty CSV cell and as null in JSON. Rows are flushed as written, so a
// killed run keeps every completed row.
#pragma once

#include <cstdint>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace stillpoint {

// A figure that was not measured (or does not apply): an empty CSV cell, null
// in JSON, a dash in a report; never a 0.
inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

class MetricsWriter {
 public:
  // Creates (truncates) the files of the given formats ("csv", "jsonl"; at
  // least one), or appends when `append` is set (resumed runs); throws an
  // Error naming the file if it cannot, or naming an unknown format.
  MetricsWriter(const std::string& directory, std::vector<std::string> columns,
                bool append = false,
                const std::vector<std::string>& formats = {"csv", "jsonl"});

  // A writer that checks rows against `columns` and writes no file: the
  // ranks of a job other than rank 0, which writes the run directory
  // (training/distributed.h).
  static MetricsWriter Discard(std::vector<std::string> columns);

  // Writes one row. Keys must be declared columns (an Error names an unknown
  // one); missing columns are empty. Non-finite values are written as
  // "nan"/"inf" in CSV and as null in JSON, with a "<column>_nonfinite"
  // string field naming which.
  void Write(const std::map<std::string, double>& row);

  const std::vector<std::string>& columns() const { return columns_; }

 private:
  MetricsWriter() = default;
  std::vector<std::string> columns_;
  std::ofstream csv_;
  std::ofstream jsonl_;
  std::string csv_path_, jsonl_path_;
};

// Reads a metrics.csv back: one vector per column (NaN for empty cells).
// Errors name the file and line.
std::map<std::string, std::vector<double>> ReadMetricsCsv(const std::string& path);
// Reads a metrics.jsonl back the same way: one vector per key seen in any
// row (NaN where a row lacks it or holds null). Errors name the file and line.
std::map<std::string, std::vector<double>> ReadMetricsJsonl(const std::string& path);
// The metrics of a run directory from whichever file it has (CSV first).
std::map<std::string, std::vector<double>> ReadRunMetrics(const std::string& run_dir);

// Drops the rows of RUN_DIR/metrics.csv and metrics.jsonl whose step is
// after `step` (and a last line cut short by a crash), so a resumed run
// continuing from a checkpoint at `step` does not repeat rows. Files are
// rewritten atomically; missing files are skipped.
void DropMetricsAfterStep(const std::string& run_dir, int64_t step);

// A number as JSON text: shortest round-trip form, or null when not finite.
std::string JsonNumber(double value);
// JsonNumber(value) when it was measured, else null: a figure of a solve
// that never ran is not written as 0.
std::string JsonNumberIf(bool measured, double value);
// A string as a JSON string literal (quoted, escaped).
std::string JsonString(const std::string& text);
// Samples (or solves) per termination status as a JSON object,
// {"CONVERGED": 30, "MAX_ITERATIONS": 2}: the "status" of summary.json's
// solver statistics and solve counts, and of health's tallies.
std::string StatusCountsJson(const std::map<std::string, int64_t>& counts);

}  // namespace stillpoint
