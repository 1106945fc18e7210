#include "training/svg_plot.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "framework/serialize.h"

namespace stillpoint {
namespace {

// A colour-blind-safe palette (Okabe-Ito).
const char* kColors[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                         "#E69F00", "#56B4E9", "#000000", "#F0E442"};

// Average advance of a character of the 12 px sans-serif legend text; the
// legend is sized from it so long names are not cut at the SVG's edge.
constexpr double kCharWidth = 7.0;
constexpr double kLegendRow = 18.0;

std::string Escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace

std::vector<double> LinearTicks(double low, double high) {
  std::vector<double> ticks;
  if (!(high > low) || !std::isfinite(low) || !std::isfinite(high)) return ticks;
  const double span = high - low;
  // The largest round step that still gives at least four ticks.
  double step = std::pow(10.0, std::floor(std::log10(span)));
  for (int guard = 0; guard < 8; ++guard) {
    const int64_t count =
        static_cast<int64_t>(std::floor(high / step + 1e-9) - std::ceil(low / step - 1e-9)) + 1;
    if (count >= 4) break;
    // 10 -> 5 -> 2 -> 1 times a power of ten.
    const double mantissa = step / std::pow(10.0, std::floor(std::log10(step) + 1e-9));
    step *= mantissa > 4.5 ? 0.4 : 0.5;
  }
  const int64_t first = static_cast<int64_t>(std::ceil(low / step - 1e-9));
  const int64_t last = static_cast<int64_t>(std::floor(high / step + 1e-9));
  for (int64_t i = first; i <= last; ++i) ticks.push_back(static_cast<double>(i) * step);
  return ticks;
}

std::vector<double> LogTicks(double low, double high) {
  std::vector<double> ticks;
  if (!(low > 0) || !(high > low)) return ticks;
  const int first = static_cast<int>(std::floor(std::log10(low) + 1e-9));
  const int last = static_cast<int>(std::ceil(std::log10(high) - 1e-9));
  const auto in_range = [&](double v) { return v >= low * (1 - 1e-9) && v <= high * (1 + 1e-9); };
  for (int k = first; k <= last; ++k) {
    if (in_range(std::pow(10.0, k))) ticks.push_back(std::pow(10.0, k));
  }
  if (ticks.size() < 3) {
    ticks.clear();
    for (int k = first; k <= last; ++k) {
      for (double m : {1.0, 2.0, 5.0}) {
        const double v = m * std::pow(10.0, k);
        if (in_range(v)) ticks.push_back(v);
      }
    }
  }
  if (ticks.size() < 3) ticks = LinearTicks(low, high);
  return ticks;
}

std::string TickLabel(double value) {
  // Ticks are integer multiples of a round spacing, computed in floating
  // point (3 * 0.1 = 0.30000000000000004): twelve significant digits remove
  // that error, and the shortest form of the result is the round value.
  char rounded[32];
  std::snprintf(rounded, sizeof(rounded), "%.12g", value);
  const double clean = std::strtod(rounded, nullptr);
  if (clean == 0) return "0";
  const double magnitude = std::abs(clean);
  const std::chars_format format = magnitude >= 1e-4 && magnitude < 1e9
                                       ? std::chars_format::fixed
                                       : std::chars_format::scientific;
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), clean, format);
  return std::string(buffer, result.ptr);
}

PlotSeries EvaluatedPoints(const std::string& name,
                           const std::vector<double>& x,
                           const std::vector<double>& y,
                           double scale,
                           bool markers) {
  PlotSeries series;
  series.name = name;
  series.markers = markers;
  for (std::size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
    if (!std::isfinite(x[i]) || !std::isfinite(y[i])) continue;
    series.x.push_back(x[i]);
    series.y.push_back(scale * y[i]);
  }
  return series;
}

namespace {

// A line plot's geometry: where the plot and its legend sit, and the axes'
// ranges (on the log10 scale for a log axis) that data maps onto.
struct PlotFrame {
  double left = 70, top = 40, bottom = 50;
  double plot_w = 0, plot_h = 0, total_w = 0, total_h = 0;
  bool legend_below = false;
  bool log_x = false, log_y = false;
  double x_min = 0, x_max = 1, y_min = 0, y_max = 1;
  bool empty = true;  // no finite data

  double tx(double x) const { return log_x ? std::log10(x) : x; }
  double ty(double y) const { return log_y ? std::log10(y) : y; }
  bool usable(double x, double y) const {
    return std::isfinite(x) && std::isfinite(y) && (!log_y || y > 0) && (!log_x || x > 0);
  }
  // x and y in data units (not log10 of them).
  double px(double x) const { return left + (tx(x) - x_min) / (x_max - x_min) * plot_w; }
  double py(double y) const { return top + (1 - (ty(y) - y_min) / (y_max - y_min)) * plot_h; }
};

PlotFrame MakeFrame(const std::vector<PlotSeries>& series, const PlotOptions& options) {
  PlotFrame f;
  f.log_x = options.log_x;
  f.log_y = options.log_y;
  std::size_t longest = 0;
  for (const PlotSeries& s : series) longest = std::max(longest, s.name.size());
  const double legend_w = 50 + kCharWidth * static_cast<double>(longest);
  f.plot_w = options.width - f.left - 20;
  f.plot_h = options.height - f.top - f.bottom;
  // Beside the plot when it fits in half the width, else below it.
  f.legend_below = legend_w > 0.5 * options.width;
  f.total_w = f.legend_below ? std::max<double>(options.width, f.left + legend_w)
                             : options.width + legend_w;
  f.total_h =
      options.height + (f.legend_below ? kLegendRow * static_cast<double>(series.size()) + 8 : 0);
  double x_min = std::numeric_limits<double>::infinity(), x_max = -x_min;
  double y_min = x_min, y_max = -x_min;
  auto include_y = [&](double y) {
    y_min = std::min(y_min, f.ty(y));
    y_max = std::max(y_max, f.ty(y));
  };
  for (const PlotSeries& s : series) {
    for (std::size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i) {
      if (!f.usable(s.x[i], s.y[i])) continue;
      x_min = std::min(x_min, f.tx(s.x[i]));
      x_max = std::max(x_max, f.tx(s.x[i]));
      include_y(s.y[i]);
      if (i < s.y_low.size() && i < s.y_high.size() && f.usable(s.x[i], s.y_low[i]) &&
          f.usable(s.x[i], s.y_high[i])) {
        include_y(s.y_low[i]);
        include_y(s.y_high[i]);
      }
    }
  }
  f.empty = !std::isfinite(x_min);
  if (f.empty) x_min = 0, x_max = 1, y_min = 0, y_max = 1;
  if (x_max == x_min) {
    x_min -= 0.5;
    x_max += 0.5;
  }
  if (y_max == y_min) {
    y_min -= 0.5;
    y_max += 0.5;
  }
  const double pad = 0.05 * (y_max - y_min);
  f.x_min = x_min;
  f.x_max = x_max;
  f.y_min = y_min - pad;
  f.y_max = y_max + pad;
  return f;
}

// The canvas, title, grid, ticks, frame and axis labels.
void WriteFrame(std::ostringstream& svg, const PlotFrame& f, const PlotOptions& options) {
  const double left = f.left, top = f.top, plot_w = f.plot_w, plot_h = f.plot_h;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << f.total_w << "\" height=\""
      << f.total_h << "\" viewBox=\"0 0 " << f.total_w << " " << f.total_h
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text x=\"" << left + plot_w / 2 << "\" y=\"22\" text-anchor=\"middle\" "
      << "font-size=\"15\">" << Escape(options.title) << "</text>\n";
  // Grid and ticks.
  const std::vector<double> x_ticks = options.log_x
                                          ? LogTicks(std::pow(10.0, f.x_min), std::pow(10.0, f.x_max))
                                          : LinearTicks(f.x_min, f.x_max);
  for (double t : x_ticks) {
    svg << "<line x1=\"" << f.px(t) << "\" y1=\"" << top << "\" x2=\"" << f.px(t) << "\" y2=\""
        << top + plot_h << "\" stroke=\"#e5e5e5\"/>\n<text x=\"" << f.px(t) << "\" y=\""
        << top + plot_h + 16 << "\" text-anchor=\"middle\">" << TickLabel(t)
        << "</text>\n";
  }
  const std::vector<double> y_ticks = options.log_y
                                          ? LogTicks(std::pow(10.0, f.y_min), std::pow(10.0, f.y_max))
                                          : LinearTicks(f.y_min, f.y_max);
  for (std::size_t i = 0; i < y_ticks.size(); ++i) {
    const double t = y_ticks[i];
    const double y = f.py(t);
    svg << "<line x1=\"" << left << "\" y1=\"" << y << "\" x2=\"" << left + plot_w << "\" y2=\""
        << y << "\" stroke=\"#e5e5e5\"/>\n<text x=\"" << left - 6 << "\" y=\"" << y + 4
        << "\" text-anchor=\"end\">" << TickLabel(t) << "</text>\n";
  }
  svg << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << plot_w << "\" height=\""
      << plot_h << "\" fill=\"none\" stroke=\"#333\"/>\n"
      << "<text x=\"" << left + plot_w / 2 << "\" y=\"" << options.height - 12
      << "\" text-anchor=\"middle\">" << Escape(options.x_label)
      << (options.log_x ? " (log scale)" : "") << "</text>\n"
      << "<text transform=\"translate(16," << top + plot_h / 2
      << ") rotate(-90)\" text-anchor=\"middle\">" << Escape(options.y_label)
      << (options.log_y ? " (log scale)" : "") << "</text>\n";
  if (f.empty) {
    svg << "<text x=\"" << left + plot_w / 2 << "\" y=\"" << top + plot_h / 2
        << "\" text-anchor=\"middle\" fill=\"#999\">no finite data</text>\n";
  }
}

// A series' band: one polygon per unbroken run of usable low/high pairs.
void WriteBand(std::ostringstream& svg, const PlotFrame& f, const PlotSeries& s,
               const char* color) {
  if (s.y_low.empty() || s.y_high.empty()) return;
  std::vector<std::size_t> run;
  auto flush_band = [&] {
    if (run.size() >= 2) {
      svg << "<polygon fill=\"" << color << "\" fill-opacity=\"0.18\" stroke=\"none\" "
          << "points=\"";
      for (std::size_t i : run) svg << f.px(s.x[i]) << "," << f.py(s.y_high[i]) << " ";
      for (auto it = run.rbegin(); it != run.rend(); ++it) {
        svg << f.px(s.x[*it]) << "," << f.py(s.y_low[*it]) << " ";
      }
      svg << "\"/>\n";
    }
    run.clear();
  };
  for (std::size_t i = 0; i < s.x.size(); ++i) {
    if (i < s.y_low.size() && i < s.y_high.size() && f.usable(s.x[i], s.y_low[i]) &&
        f.usable(s.x[i], s.y_high[i])) {
      run.push_back(i);
    } else {
      flush_band();
    }
  }
  flush_band();
}

// A series' line: one polyline per unbroken run of usable points (and its
// markers).
void WriteLine(std::ostringstream& svg, const PlotFrame& f, const PlotSeries& s,
               const char* color) {
  std::string points;
  auto flush = [&] {
    if (!points.empty()) {
      svg << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"1.8\" points=\""
          << points << "\"/>\n";
    }
    points.clear();
  };
  for (std::size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i) {
    if (!f.usable(s.x[i], s.y[i])) {
      flush();
      continue;
    }
    std::ostringstream p;
    p.precision(6);
    p << f.px(s.x[i]) << "," << f.py(s.y[i]) << " ";
    points += p.str();
    if (s.markers) {
      svg << "<circle cx=\"" << f.px(s.x[i]) << "\" cy=\"" << f.py(s.y[i]) << "\" r=\"3\" fill=\""
          << color << "\"/>\n";
    }
  }
  flush();
}

// The k-th series' legend entry.
void WriteLegendEntry(std::ostringstream& svg, const PlotFrame& f, const PlotOptions& options,
                      std::size_t k, const std::string& name, const char* color) {
  const double lx = f.legend_below ? f.left : f.left + f.plot_w + 12;
  const double ly = f.legend_below ? options.height + 8 + kLegendRow * static_cast<double>(k)
                                   : f.top + 14 + kLegendRow * static_cast<double>(k);
  svg << "<line x1=\"" << lx << "\" y1=\"" << ly - 4 << "\" x2=\"" << lx + 20 << "\" y2=\""
      << ly - 4 << "\" stroke=\"" << color << "\" stroke-width=\"2.5\"/>\n<text x=\"" << lx + 26
      << "\" y=\"" << ly << "\">" << Escape(name) << "</text>\n";
}

}  // namespace

std::string LinePlotSvg(const std::vector<PlotSeries>& series, const PlotOptions& options) {
  const PlotFrame frame = MakeFrame(series, options);
  std::ostringstream svg;
  svg.precision(6);
  WriteFrame(svg, frame, options);
  for (std::size_t k = 0; k < series.size(); ++k) {
    const char* color = kColors[k % (sizeof(kColors) / sizeof(kColors[0]))];
    WriteBand(svg, frame, series[k], color);
    WriteLine(svg, frame, series[k], color);
    WriteLegendEntry(svg, frame, options, k, series[k].name, color);
  }
  svg << "</svg>\n";
  return svg.str();
}

namespace {

// A colour-blind-safe sequential map (viridis at five stops), linear between
// them: 0 dark purple, 1 yellow.
std::string HeatColor(double value) {
  static const double stops[5][3] = {
      {68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}};
  const double v = std::clamp(value, 0.0, 1.0) * 4.0;
  const int i = std::min(3, static_cast<int>(v));
  const double f = v - i;
  char color[8];
  std::snprintf(color, sizeof(color), "#%02x%02x%02x",
                static_cast<int>(std::lround(stops[i][0] + f * (stops[i + 1][0] - stops[i][0]))),
                static_cast<int>(std::lround(stops[i][1] + f * (stops[i + 1][1] - stops[i][1]))),
                static_cast<int>(std::lround(stops[i][2] + f * (stops[i + 1][2] - stops[i][2]))));
  return color;
}

}  // namespace

std::string HeatMapSvg(const std::vector<HeatMapPanel>& panels, const HeatMapOptions& options) {
  const double cell_w = 50, cell_h = 24, label_w = 60, gap = 30, top = 56, bottom = 44;
  std::size_t most_rows = 1;
  for (const HeatMapPanel& p : panels) most_rows = std::max(most_rows, p.rows.size());
  std::vector<double> panel_x;
  double x = 0;
  for (const HeatMapPanel& p : panels) {
    panel_x.push_back(x + label_w);
    const double cells = cell_w * static_cast<double>(std::max<std::size_t>(p.columns.size(), 1));
    x += label_w + std::max(cells, kCharWidth * static_cast<double>(p.title.size())) + gap;
  }
  const double width = std::max(x, 320.0);
  const double height = top + cell_h * static_cast<double>(most_rows) + bottom;
  std::ostringstream svg;
  svg.precision(6);
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\""
      << height << "\" viewBox=\"0 0 " << width << " " << height
      << "\" font-family=\"sans-serif\" font-size=\"11\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text x=\"" << width / 2 << "\" y=\"20\" text-anchor=\"middle\" font-size=\"15\">"
      << Escape(options.title) << "</text>\n"
      << "<text transform=\"translate(12," << top + cell_h * static_cast<double>(most_rows) / 2
      << ") rotate(-90)\" text-anchor=\"middle\">" << Escape(options.row_label) << "</text>\n"
      << "<text x=\"" << width / 2 << "\" y=\"" << height - 8 << "\" text-anchor=\"middle\">"
      << Escape(options.column_label) << "</text>\n";
  for (std::size_t k = 0; k < panels.size(); ++k) {
    const HeatMapPanel& p = panels[k];
    const double left = panel_x[k];
    svg << "<text x=\"" << left + cell_w * static_cast<double>(p.columns.size()) / 2 << "\" y=\""
        << top - 10 << "\" text-anchor=\"middle\" font-size=\"13\">" << Escape(p.title)
        << "</text>\n";
    for (std::size_t r = 0; r < p.rows.size(); ++r) {
      const double y = top + cell_h * static_cast<double>(r);
      svg << "<text x=\"" << left - 6 << "\" y=\"" << y + cell_h / 2 + 4
          << "\" text-anchor=\"end\">" << TickLabel(p.rows[r]) << "</text>\n";
      for (std::size_t c = 0; c < p.columns.size(); ++c) {
        const double cx = left + cell_w * static_cast<double>(c);
        const std::size_t i = r * p.columns.size() + c;
        const double v = i < p.values.size() ? p.values[i] : std::nan("");
        if (!std::isfinite(v)) {
          svg << "<rect x=\"" << cx << "\" y=\"" << y << "\" width=\"" << cell_w
              << "\" height=\"" << cell_h << "\" fill=\"none\" stroke=\"#ccc\"/>\n";
          continue;
        }
        char text[16];
        std::snprintf(text, sizeof(text), "%.1f", 100.0 * v);
        svg << "<rect x=\"" << cx << "\" y=\"" << y << "\" width=\"" << cell_w << "\" height=\""
            << cell_h << "\" fill=\"" << HeatColor(v) << "\" stroke=\"white\"/>\n<text x=\""
            << cx + cell_w / 2 << "\" y=\"" << y + cell_h / 2 + 4
            << "\" text-anchor=\"middle\" fill=\"" << (v > 0.55 ? "#000" : "#fff") << "\">"
            << text << "</text>\n";
      }
    }
    const double y = top + cell_h * static_cast<double>(p.rows.size());
    for (std::size_t c = 0; c < p.columns.size(); ++c) {
      svg << "<text x=\"" << left + cell_w * (static_cast<double>(c) + 0.5) << "\" y=\""
          << y + 14 << "\" text-anchor=\"middle\">" << TickLabel(p.columns[c]) << "</text>\n";
    }
  }
  svg << "</svg>\n";
  return svg.str();
}

void WriteTextFile(const std::string& path, const std::string& text) {
  WriteFileAtomically(path, text);
}

}  // namespace stillpoint
