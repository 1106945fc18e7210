#include "training/demos/demo_output.h"

#include <cmath>
#include <filesystem>
#include <iomanip>
#include <sstream>
#include <system_error>

#include "framework/check.h"
#include "training/config/config.h"
#include "training/metrics.h"
#include "training/output_policy.h"

namespace stillpoint {

void DemoTable::Add(const std::string& name, std::vector<double> column) {
  SP_CHECK(values.empty() || column.size() == values.front().size(), "DemoTable: column '", name,
           "' has ", column.size(), " rows, the table ", values.front().size());
  columns.push_back(name);
  values.push_back(std::move(column));
}

std::string DemoTable::ToCsv() const {
  std::ostringstream out;
  for (std::size_t c = 0; c < columns.size(); ++c) out << (c ? "," : "") << columns[c];
  out << "\n" << std::setprecision(10);
  const std::size_t rows = values.empty() ? 0 : values.front().size();
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < columns.size(); ++c) out << (c ? "," : "") << values[c][r];
    out << "\n";
  }
  return out.str();
}

void DemoSummary::Set(const std::string& name, double value) {
  fields_.emplace_back(name, JsonNumber(value));
}

void DemoSummary::SetText(const std::string& name, const std::string& value) {
  fields_.emplace_back(name, JsonString(value));
}

std::string DemoSummary::ToJson() const {
  std::ostringstream out;
  out << "{\n";
  for (std::size_t i = 0; i < fields_.size(); ++i) {
    out << "  " << JsonString(fields_[i].first) << ": " << fields_[i].second
        << (i + 1 < fields_.size() ? ",\n" : "\n");
  }
  out << "}\n";
  return out.str();
}

void PrepareDemoDirectory(const std::string& dir, bool overwrite) {
  if (dir.empty()) throw ConfigError("--out must name a directory");
  CheckOutputDirectory(dir, overwrite);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir)) {
    throw ConfigError("--out: cannot create the output directory '" + dir + "'" +
                      (ec ? ": " + ec.message() : std::string()));
  }
}

LineFit FitLine(const std::vector<double>& x, const std::vector<double>& y) {
  SP_CHECK(x.size() == y.size() && x.size() >= 2, "FitLine: needs two or more (x, y) pairs");
  const double n = static_cast<double>(x.size());
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    sx += x[i];
    sy += y[i];
    sxx += x[i] * x[i];
    sxy += x[i] * y[i];
  }
  LineFit fit;
  fit.slope = (n * sxy - sx * sy) / (n * sxx - sx * sx);
  fit.intercept = (sy - fit.slope * sx) / n;
  return fit;
}

}  // namespace stillpoint
