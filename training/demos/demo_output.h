// What every seed demo (training/demos/) writes into its output directory:
// a CSV table, SVG plots and summary.json, plus the small numerical helpers
// the demos share.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace stillpoint {

// A table with named columns of equal length, written as CSV (header line,
// then one row per index; numbers with 10 significant digits).
struct DemoTable {
  std::vector<std::string> columns;
  std::vector<std::vector<double>> values;  // one vector per column

  void Add(const std::string& name, std::vector<double> column);
  std::string ToCsv() const;
};

// summary.json: one flat object of named numbers (non-finite ones as null)
// and strings, in insertion order.
class DemoSummary {
 public:
  void Set(const std::string& name, double value);
  void SetText(const std::string& name, const std::string& value);
  std::string ToJson() const;

 private:
  std::vector<std::pair<std::string, std::string>> fields_;  // name, JSON text
};

// Creates dir (and parents); throws a ConfigError (bad input) naming it
// when it cannot, or when the output policy refuses it
// (CheckOutputDirectory, training/output_policy.h: not a directory, a run
// directory, or holding files without `overwrite`).
void PrepareDemoDirectory(const std::string& dir, bool overwrite);

// Least-squares slope and intercept of y against x.
struct LineFit {
  double slope = 0.0;
  double intercept = 0.0;
};
LineFit FitLine(const std::vector<double>& x, const std::vector<double>& y);

}  // namespace stillpoint
