#include "training/metrics.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <sstream>

#include "framework/check.h"
#include "framework/serialize.h"

namespace stillpoint {
namespace {

std::string FormatDouble(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buffer[64];
  auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

}  // namespace

std::string JsonNumber(double value) { return std::isfinite(value) ? FormatDouble(value) : "null"; }

std::string JsonNumberIf(bool measured, double value) {
  return measured ? JsonNumber(value) : "null";
}

std::string StatusCountsJson(const std::map<std::string, int64_t>& counts) {
  std::string out = "{";
  for (const auto& [status, count] : counts) {
    if (out.size() > 1) out += ", ";
    out += JsonString(status) + ": " + std::to_string(count);
  }
  return out + "}";
}

std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buffer[8];
          std::snprintf(buffer, sizeof(buffer), "\\u%04x", c);
          out += buffer;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

MetricsWriter::MetricsWriter(const std::string& directory,
                             std::vector<std::string> columns,
                             bool append,
                             const std::vector<std::string>& formats)
    : columns_(std::move(columns)) {
  SP_CHECK(!formats.empty(), "metrics: no file format given (log.formats: csv, jsonl)");
  for (const std::string& format : formats) {
    SP_CHECK(format == "csv" || format == "jsonl", "metrics: unknown file format '", format,
             "' (known: csv, jsonl)");
  }
  auto wanted = [&](const char* format) {
    return std::find(formats.begin(), formats.end(), format) != formats.end();
  };
  std::filesystem::create_directories(directory);
  csv_path_ = (std::filesystem::path(directory) / "metrics.csv").string();
  jsonl_path_ = (std::filesystem::path(directory) / "metrics.jsonl").string();
  const bool write_header =
      !append || !std::filesystem::exists(csv_path_) || std::filesystem::file_size(csv_path_) == 0;
  const auto mode = append ? std::ios::app : std::ios::trunc;
  if (wanted("jsonl")) {
    jsonl_.open(jsonl_path_, std::ios::out | mode);
    SP_CHECK(jsonl_.good(), "cannot write metrics file '", jsonl_path_, "'");
  }
  if (!wanted("csv")) return;
  csv_.open(csv_path_, std::ios::out | mode);
  SP_CHECK(csv_.good(), "cannot write metrics file '", csv_path_, "'");
  if (write_header) {
    for (std::size_t i = 0; i < columns_.size(); ++i) csv_ << (i ? "," : "") << columns_[i];
    csv_ << "\n" << std::flush;
  }
}

MetricsWriter MetricsWriter::Discard(std::vector<std::string> columns) {
  MetricsWriter writer;
  writer.columns_ = std::move(columns);
  return writer;
}

void MetricsWriter::Write(const std::map<std::string, double>& row) {
  for (const auto& [key, value] : row) {
    SP_CHECK(std::find(columns_.begin(), columns_.end(), key) != columns_.end(), "MetricsWriter: '",
             key, "' is not a declared column");
  }
  std::string csv_line, json = "{";
  bool first_json = true;
  for (std::size_t i = 0; i < columns_.size(); ++i) {
    auto it = row.find(columns_[i]);
    if (i) csv_line += ",";
    if (it == row.end()) continue;
    csv_line += FormatDouble(it->second);
    // Appended piece by piece (also sidesteps a false -Wrestrict of g++ 12
    // at -O3 on "literal" + std::string temporaries).
    if (!first_json) json += ',';
    json += JsonString(columns_[i]);
    json += ':';
    json += JsonNumber(it->second);
    if (!std::isfinite(it->second)) {
      json += ',';
      json += JsonString(columns_[i] + "_nonfinite");
      json += ':';
      json += JsonString(FormatDouble(it->second));
    }
    first_json = false;
  }
  if (csv_.is_open()) {
    csv_ << csv_line << "\n" << std::flush;
    SP_CHECK(csv_.good(), "MetricsWriter: writing '", csv_path_, "' failed");
  }
  if (jsonl_.is_open()) {
    jsonl_ << json << "}\n" << std::flush;
    SP_CHECK(jsonl_.good(), "MetricsWriter: writing '", jsonl_path_, "' failed");
  }
}

std::map<std::string, std::vector<double>> ReadMetricsCsv(const std::string& path) {
  std::ifstream in(path);
  SP_CHECK(in.good(), "cannot open metrics file '", path, "'");
  std::string line;
  SP_CHECK(static_cast<bool>(std::getline(in, line)), path, ": empty metrics file");
  std::vector<std::string> names;
  {
    std::stringstream header(line);
    std::string name;
    while (std::getline(header, name, ',')) names.push_back(name);
  }
  std::map<std::string, std::vector<double>> columns;
  int64_t line_number = 1;
  while (std::getline(in, line)) {
    ++line_number;
    std::vector<std::string> cells;
    std::string cell;
    std::stringstream stream(line);
    while (std::getline(stream, cell, ',')) cells.push_back(cell);
    if (!line.empty() && line.back() == ',') cells.push_back("");
    SP_CHECK(cells.size() == names.size(), path, ":", line_number, ": expected ", names.size(),
             " cells, got ", cells.size());
    for (std::size_t i = 0; i < names.size(); ++i) {
      double value = std::numeric_limits<double>::quiet_NaN();
      if (!cells[i].empty()) {
        try {
          std::size_t used = 0;
          value = std::stod(cells[i], &used);
          SP_CHECK(used == cells[i].size(), path, ":", line_number, ": bad number '", cells[i],
                   "'");
        } catch (const std::logic_error&) {
          SP_CHECK(false, path, ":", line_number, ": bad number '", cells[i], "'");
        }
      }
      columns[names[i]].push_back(value);
    }
  }
  return columns;
}

std::map<std::string, std::vector<double>> ReadMetricsJsonl(const std::string& path) {
  std::ifstream in(path);
  SP_CHECK(in.good(), "cannot open metrics file '", path, "'");
  std::map<std::string, std::vector<double>> columns;
  std::string line;
  int64_t rows = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    // A JSON object is a YAML flow mapping, so yaml-cpp reads it.
    YAML::Node row;
    try {
      row = YAML::Load(line);
    } catch (const YAML::Exception& error) {
      SP_CHECK(false, path, ":", rows + 1, ": malformed JSON line (", error.msg, ")");
    }
    SP_CHECK(row.IsMap(), path, ":", rows + 1, ": expected a JSON object");
    for (const auto& entry : row) {
      const std::string key = entry.first.as<std::string>();
      if (key.size() > 10 && key.compare(key.size() - 10, 10, "_nonfinite") == 0) continue;
      std::vector<double>& column = columns[key];
      column.resize(rows, std::numeric_limits<double>::quiet_NaN());
      double value = std::numeric_limits<double>::quiet_NaN();
      if (!entry.second.IsNull()) {
        try {
          value = entry.second.as<double>();
        } catch (const YAML::Exception&) {
          SP_CHECK(false, path, ":", rows + 1, ": '", key, "' is not a number");
        }
      }
      column.push_back(value);
    }
    ++rows;
    for (auto& [key, column] : columns) {
      column.resize(rows, std::numeric_limits<double>::quiet_NaN());
    }
  }
  return columns;
}

namespace {

// The complete lines of text (a last line without its newline was cut short).
std::vector<std::string> CompleteLines(const std::string& text) {
  std::vector<std::string> lines;
  std::size_t begin = 0;
  while (true) {
    const std::size_t end = text.find('\n', begin);
    if (end == std::string::npos) break;
    lines.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return lines;
}

// The step of a row, or -1 when it cannot be read (such rows are dropped).
double RowStep(const std::string& cell) {
  char* end = nullptr;
  const double value = std::strtod(cell.c_str(), &end);
  return end != cell.c_str() ? value : -1.0;
}

}  // namespace

void DropMetricsAfterStep(const std::string& run_dir, int64_t step) {
  const std::string csv = (std::filesystem::path(run_dir) / "metrics.csv").string();
  if (std::filesystem::exists(csv)) {
    const std::vector<std::string> lines = CompleteLines(ReadFileBytes(csv));
    std::string kept;
    std::size_t step_column = 0;
    for (std::size_t i = 0; i < lines.size(); ++i) {
      std::vector<std::string> cells;
      std::stringstream stream(lines[i]);
      std::string cell;
      while (std::getline(stream, cell, ',')) cells.push_back(cell);
      if (i == 0) {
        step_column = std::find(cells.begin(), cells.end(), "step") - cells.begin();
        kept += lines[i] + "\n";
        continue;
      }
      if (step_column < cells.size()) {
        const double row_step = RowStep(cells[step_column]);
        if (row_step >= 0 && row_step <= static_cast<double>(step)) kept += lines[i] + "\n";
      }
    }
    WriteFileAtomically(csv, kept);
  }
  const std::string jsonl = (std::filesystem::path(run_dir) / "metrics.jsonl").string();
  if (std::filesystem::exists(jsonl)) {
    std::string kept;
    for (const std::string& line : CompleteLines(ReadFileBytes(jsonl))) {
      const std::size_t at = line.find("\"step\":");
      if (at == std::string::npos) continue;
      const double row_step = RowStep(line.substr(at + 7));
      if (row_step >= 0 && row_step <= static_cast<double>(step)) kept += line + "\n";
    }
    WriteFileAtomically(jsonl, kept);
  }
}

std::map<std::string, std::vector<double>> ReadRunMetrics(const std::string& run_dir) {
  const std::string csv = (std::filesystem::path(run_dir) / "metrics.csv").string();
  if (std::filesystem::exists(csv)) return ReadMetricsCsv(csv);
  return ReadMetricsJsonl((std::filesystem::path(run_dir) / "metrics.jsonl").string());
}

}  // namespace stillpoint
