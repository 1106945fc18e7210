// The report of `stillpoint bench scale`: table, JSON, CSV and plots of the
// measured rows (bench_scale.h).
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <map>
#include <ostream>
#include <sstream>

#include "framework/check.h"
#include "training/cli/bench_scale.h"
#include "training/metrics.h"
#include "training/svg_plot.h"

namespace stillpoint {
namespace {

// The row's resident growth: its peak over the resident set before its model
// was built.
double RssGrowth(const ScaleRow& r) { return r.rss_peak_mb - r.rss_base_mb; }
double PeerRssGrowth(const ScaleRow& r) { return r.peer_rss_peak_mb - r.peer_rss_base_mb; }

// The fields of a row, in the order of the JSON objects and the CSV columns.
struct Field {
  const char* name;
  double (*number)(const ScaleRow&);  // null: a text field
  std::string (*text)(const ScaleRow&);
};

const std::vector<Field>& Fields() {
  static const std::vector<Field> fields = {
      {"axis", nullptr, [](const ScaleRow& r) { return r.point.axis; }},
      {"model", nullptr, [](const ScaleRow& r) { return r.point.model; }},
      {"attention", nullptr, [](const ScaleRow& r) { return r.point.attention; }},
      {"length", [](const ScaleRow& r) { return double(r.point.length); }, nullptr},
      {"batch", [](const ScaleRow& r) { return double(r.point.batch); }, nullptr},
      {"depth", [](const ScaleRow& r) { return double(r.point.depth); }, nullptr},
      {"median_ms", [](const ScaleRow& r) { return r.median_ms; }, nullptr},
      {"p25_ms", [](const ScaleRow& r) { return r.p25_ms; }, nullptr},
      {"p75_ms", [](const ScaleRow& r) { return r.p75_ms; }, nullptr},
      {"cpu_median_ms", [](const ScaleRow& r) { return r.cpu_median_ms; }, nullptr},
      {"pool_peak_mb", [](const ScaleRow& r) { return r.pool_peak_mb; }, nullptr},
      {"forward_pool_peak_mb", [](const ScaleRow& r) { return r.forward_pool_peak_mb; }, nullptr},
      {"rss_peak_mb", [](const ScaleRow& r) { return r.rss_peak_mb; }, nullptr},
      {"rss_base_mb", [](const ScaleRow& r) { return r.rss_base_mb; }, nullptr},
      {"rss_isolated", [](const ScaleRow& r) { return r.rss_isolated ? 1.0 : 0.0; }, nullptr},
      {"loss_first", [](const ScaleRow& r) { return r.loss_first; }, nullptr},
      {"loss_last", [](const ScaleRow& r) { return r.loss_last; }, nullptr},
      {"error", nullptr, [](const ScaleRow& r) { return r.error; }},
      {"peer_median_ms", [](const ScaleRow& r) { return r.peer_median_ms; }, nullptr},
      {"peer_rss_peak_mb", [](const ScaleRow& r) { return r.peer_rss_peak_mb; }, nullptr},
      {"peer_rss_base_mb", [](const ScaleRow& r) { return r.peer_rss_base_mb; }, nullptr},
      {"peer_error", nullptr, [](const ScaleRow& r) { return r.peer_error; }},
  };
  return fields;
}

std::string CsvNumber(double value) {
  if (!std::isfinite(value)) return "";
  std::ostringstream text;
  text << std::setprecision(6) << value;
  return text.str();
}

std::string CsvText(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (const char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

// One series per (model, attention) of an axis: x and y of its rows, in
// order. Failed rows leave a gap (NaN).
std::vector<PlotSeries> SeriesOf(const std::vector<ScaleRow>& rows,
                                 const std::string& axis,
                                 double (*x)(const ScaleRow&),
                                 double (*y)(const ScaleRow&),
                                 const std::string& suffix = "") {
  std::vector<PlotSeries> series;
  std::map<std::string, size_t> index;
  for (const ScaleRow& r : rows) {
    if (r.point.axis != axis) continue;
    const std::string name = r.point.model + " " + r.point.attention + suffix;
    if (!index.count(name)) {
      index[name] = series.size();
      series.push_back({name, {}, {}, /*markers=*/true});
    }
    PlotSeries& s = series[index[name]];
    s.x.push_back(x(r));
    s.y.push_back(r.error.empty() ? y(r) : std::nan(""));
  }
  // A series with no finite point (the peer's, when it did not run) is left out.
  std::vector<PlotSeries> kept;
  for (PlotSeries& s : series) {
    for (const double v : s.y) {
      if (std::isfinite(v)) {
        kept.push_back(std::move(s));
        break;
      }
    }
  }
  return kept;
}

double Length(const ScaleRow& r) { return double(r.point.length); }
double Depth(const ScaleRow& r) { return double(r.point.depth); }

// Two plots side by side in one SVG (each keeps its own size).
std::string SideBySide(const std::string& left, const std::string& right) {
  const auto size = [](const std::string& svg, const char* attribute) {
    const size_t at = svg.find(std::string(attribute) + "=\"");
    return at == std::string::npos ? 0 : std::stoi(svg.substr(at + std::strlen(attribute) + 2));
  };
  const int left_w = size(left, "width");
  const int width = left_w + size(right, "width");
  const int height = std::max(size(left, "height"), size(right, "height"));
  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
      << "\" viewBox=\"0 0 " << width << " " << height << "\">\n"
      << "<g>\n" << left << "</g>\n<g transform=\"translate(" << left_w << ",0)\">\n" << right
      << "</g>\n</svg>\n";
  return svg.str();
}

}  // namespace

void PrintScaleTable(const std::vector<ScaleRow>& rows, std::ostream& out) {
  out << "axis    model    attention      T     B  depth  median ms  pool MiB  no-tape pool MiB"
         "  RSS MiB (+growth)  peer ms  peer RSS (+growth)  peer/stillpoint\n";
  for (const ScaleRow& r : rows) {
    const ScalePoint& p = r.point;
    out << std::left << std::setw(8) << p.axis << std::setw(9) << p.model << std::setw(13)
        << p.attention << std::right << std::setw(6) << p.length << std::setw(6) << p.batch
        << std::setw(7) << p.depth;
    if (!r.error.empty()) {
      out << "  failed: " << r.error << "\n";
      continue;
    }
    out << std::fixed << std::setprecision(2) << std::setw(11) << r.median_ms << std::setw(10)
        << r.pool_peak_mb << std::setw(18) << r.forward_pool_peak_mb << std::setw(9)
        << std::setprecision(1) << r.rss_peak_mb << " (+"
        << RssGrowth(r) << (r.rss_isolated ? ")" : ", not isolated)");
    if (std::isfinite(r.peer_median_ms)) {
      out << std::setprecision(2) << std::setw(9) << r.peer_median_ms << std::setprecision(1)
          << std::setw(10) << r.peer_rss_peak_mb << " (+" << PeerRssGrowth(r) << ")"
          << std::setprecision(2) << std::setw(9) << r.peer_median_ms / r.median_ms << "x";
    } else if (!r.peer_error.empty()) {
      out << "  peer failed: " << r.peer_error;
    }
    out << "\n";
    out.unsetf(std::ios_base::floatfield);
  }
}

std::string ScaleJson(const ScaleReportHeader& h, const std::vector<ScaleRow>& rows) {
  std::ostringstream json;
  json << "{\"framework\": \"stillpoint\", \"workload\": \"scale\", \"tokens_per_step\": "
       << h.tokens << ", \"repeats\": " << h.repeats << ", \"warmup\": " << h.warmup
       << ", \"threads\": " << h.threads << ", \"dtype\": " << JsonString(h.dtype)
       << ", \"isolation\": " << JsonString(h.isolated ? "process per point" : "one process")
       << ", \"rows\": [";
  for (size_t i = 0; i < rows.size(); ++i) {
    json << (i ? ",\n  {" : "\n  {");
    bool first = true;
    for (const Field& f : Fields()) {
      json << (first ? "" : ", ") << "\"" << f.name << "\": ";
      if (f.number) {
        const double v = f.number(rows[i]);
        json << (std::string(f.name) == "rss_isolated" ? (v != 0 ? "true" : "false")
                                                        : JsonNumber(v));
      } else {
        const std::string text = f.text(rows[i]);
        json << (text.empty() ? "null" : JsonString(text));
      }
      first = false;
    }
    json << "}";
  }
  json << "]}\n";
  return json.str();
}

std::string ScaleCsv(const std::vector<ScaleRow>& rows) {
  std::ostringstream csv;
  for (size_t i = 0; i < Fields().size(); ++i) csv << (i ? "," : "") << Fields()[i].name;
  csv << "\n";
  for (const ScaleRow& r : rows) {
    for (size_t i = 0; i < Fields().size(); ++i) {
      const Field& f = Fields()[i];
      csv << (i ? "," : "") << (f.number ? CsvNumber(f.number(r)) : CsvText(f.text(r)));
    }
    csv << "\n";
  }
  return csv.str();
}

std::string ScaleLengthSvg(const std::vector<ScaleRow>& rows) {
  std::vector<PlotSeries> time =
      SeriesOf(rows, "length", Length, [](const ScaleRow& r) { return r.median_ms; });
  // The peer's (its softmax rows; no series where it did not run).
  for (PlotSeries& s : SeriesOf(rows, "length", Length,
                                [](const ScaleRow& r) { return r.peer_median_ms; }, " (PyTorch)")) {
    time.push_back(std::move(s));
  }
  PlotOptions time_options;
  time_options.title = "Training step time against sequence length (tokens per step fixed)";
  time_options.x_label = "sequence length T";
  time_options.y_label = "median step time (ms)";
  time_options.log_x = true;
  time_options.log_y = true;
  std::vector<PlotSeries> memory =
      SeriesOf(rows, "length", Length, [](const ScaleRow& r) { return r.pool_peak_mb; });
  PlotOptions memory_options = time_options;
  memory_options.title = "Peak tensor memory against sequence length";
  memory_options.y_label = "tensor pool peak (MiB)";
  return SideBySide(LinePlotSvg(time, time_options), LinePlotSvg(memory, memory_options));
}

std::string ScaleDepthSvg(const std::vector<ScaleRow>& rows) {
  const std::vector<PlotSeries> memory =
      SeriesOf(rows, "depth", Depth, [](const ScaleRow& r) { return r.pool_peak_mb; });
  PlotOptions options;
  options.title = "Peak tensor memory against depth (explicit: cells; implicit: iterations)";
  options.x_label = "depth";
  options.y_label = "tensor pool peak (MiB)";
  return LinePlotSvg(memory, options);
}

std::vector<ScaleRow> ParseScaleJson(const std::string& text, const std::string& where) {
  std::vector<ScaleRow> rows;
  try {
    const YAML::Node root = YAML::Load(text);
    SP_CHECK(root.IsMap() && root["rows"] && root["rows"].IsSequence(), where,
             ": no \"rows\" list in its JSON");
    for (const YAML::Node& node : root["rows"]) {
      ScaleRow row;
      const auto number = [&](const char* key) {
        const YAML::Node value = node[key];
        return value && !value.IsNull() ? value.as<double>() : ScaleRow::kNone;
      };
      const auto text_of = [&](const char* key) {
        const YAML::Node value = node[key];
        return value && !value.IsNull() ? value.as<std::string>() : std::string();
      };
      row.point.axis = text_of("axis");
      row.point.model = text_of("model");
      row.point.attention = text_of("attention");
      row.point.length = static_cast<int64_t>(number("length"));
      row.point.batch = static_cast<int64_t>(number("batch"));
      row.point.depth = static_cast<int64_t>(number("depth"));
      row.median_ms = number("median_ms");
      row.p25_ms = number("p25_ms");
      row.p75_ms = number("p75_ms");
      row.cpu_median_ms = number("cpu_median_ms");
      row.pool_peak_mb = number("pool_peak_mb");
      row.forward_pool_peak_mb = number("forward_pool_peak_mb");
      row.rss_peak_mb = number("rss_peak_mb");
      row.rss_base_mb = number("rss_base_mb");
      row.rss_isolated = node["rss_isolated"] && node["rss_isolated"].as<bool>();
      row.loss_first = number("loss_first");
      row.loss_last = number("loss_last");
      row.error = text_of("error");
      rows.push_back(row);
    }
  } catch (const YAML::Exception& e) {
    SP_CHECK(false, where, ": malformed JSON: ", e.what());
  }
  return rows;
}

}  // namespace stillpoint
