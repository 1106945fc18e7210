#include "training/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "framework/serialize.h"

namespace stillpoint {
namespace {

// A colour-blind-safe palette (Okabe-Ito).
const char* kColors[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                         "#E69F00", "#56B4E9", "#000000", "#F0E442"};

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

// "Nice" tick positions covering [low, high] (about `count` of them).
std::vector<double> Ticks(double low, double high, int count) {
  const double span = high - low;
  const double raw = span / std::max(1, count);
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * magnitude >= raw) {
      step = m * magnitude;
      break;
    }
  }
  std::vector<double> ticks;
  for (double t = std::ceil(low / step) * step; t <= high + 1e-9 * step; t += step) {
    ticks.push_back(std::abs(t) < 1e-12 * step ? 0.0 : t);
  }
  return ticks;
}

std::string FormatTick(double value) {
  std::ostringstream out;
  out.precision(4);
  out << value;
  return out.str();
}

}  // namespace

std::string LinePlotSvg(const std::vector<PlotSeries>& series, const PlotOptions& options) {
  const double left = 70, right = 160, top = 40, bottom = 50;
  const double plot_w = options.width - left - right, plot_h = options.height - top - bottom;
  auto ty = [&](double y) { return options.log_y ? std::log10(y) : y; };
  auto tx = [&](double x) { return options.log_x ? std::log10(x) : x; };
  auto usable = [&](double x, double y) {
    return std::isfinite(x) && std::isfinite(y) && (!options.log_y || y > 0) &&
           (!options.log_x || x > 0);
  };
  double x_min = std::numeric_limits<double>::infinity(), x_max = -x_min;
  double y_min = x_min, y_max = -x_min;
  for (const PlotSeries& s : series) {
    for (std::size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i) {
      if (!usable(s.x[i], s.y[i])) continue;
      x_min = std::min(x_min, tx(s.x[i]));
      x_max = std::max(x_max, tx(s.x[i]));
      y_min = std::min(y_min, ty(s.y[i]));
      y_max = std::max(y_max, ty(s.y[i]));
    }
  }
  const bool empty = !std::isfinite(x_min);
  if (empty) x_min = 0, x_max = 1, y_min = 0, y_max = 1;
  if (x_max == x_min) x_max = x_min + 1;
  if (y_max == y_min) {
    y_min -= 0.5;
    y_max += 0.5;
  }
  const double pad = 0.05 * (y_max - y_min);
  y_min -= pad;
  y_max += pad;
  auto px = [&](double x) { return left + (tx(x) - x_min) / (x_max - x_min) * plot_w; };
  // A tick position t is already on the (possibly log) axis.
  auto tick_x = [&](double t) { return left + (t - x_min) / (x_max - x_min) * plot_w; };
  auto py = [&](double y) { return top + (1 - (ty(y) - y_min) / (y_max - y_min)) * plot_h; };

  std::ostringstream svg;
  svg.precision(6);
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << options.width << "\" height=\""
      << options.height << "\" viewBox=\"0 0 " << options.width << " " << options.height
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text x=\"" << left + plot_w / 2 << "\" y=\"22\" text-anchor=\"middle\" "
      << "font-size=\"15\">" << Escape(options.title) << "</text>\n";
  // Grid and ticks.
  for (double t : Ticks(x_min, x_max, 6)) {
    const std::string label = options.log_x ? FormatTick(std::pow(10.0, t)) : FormatTick(t);
    svg << "<line x1=\"" << tick_x(t) << "\" y1=\"" << top << "\" x2=\"" << tick_x(t)
        << "\" y2=\"" << top + plot_h << "\" stroke=\"#e5e5e5\"/>\n<text x=\"" << tick_x(t)
        << "\" y=\"" << top + plot_h + 16 << "\" text-anchor=\"middle\">" << label << "</text>\n";
  }
  for (double t : Ticks(y_min, y_max, 5)) {
    const double y = top + (1 - (t - y_min) / (y_max - y_min)) * plot_h;
    const std::string label = options.log_y ? FormatTick(std::pow(10.0, t)) : FormatTick(t);
    svg << "<line x1=\"" << left << "\" y1=\"" << y << "\" x2=\"" << left + plot_w << "\" y2=\""
        << y << "\" stroke=\"#e5e5e5\"/>\n<text x=\"" << left - 6 << "\" y=\"" << y + 4
        << "\" text-anchor=\"end\">" << label << "</text>\n";
  }
  svg << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << plot_w << "\" height=\""
      << plot_h << "\" fill=\"none\" stroke=\"#333\"/>\n"
      << "<text x=\"" << left + plot_w / 2 << "\" y=\"" << options.height - 12
      << "\" text-anchor=\"middle\">" << Escape(options.x_label)
      << (options.log_x ? " (log scale)" : "") << "</text>\n"
      << "<text transform=\"translate(16," << top + plot_h / 2
      << ") rotate(-90)\" text-anchor=\"middle\">" << Escape(options.y_label)
      << (options.log_y ? " (log scale)" : "") << "</text>\n";
  if (empty) {
    svg << "<text x=\"" << left + plot_w / 2 << "\" y=\"" << top + plot_h / 2
        << "\" text-anchor=\"middle\" fill=\"#999\">no finite data</text>\n";
  }
  // Series: one polyline per unbroken run of usable points.
  for (std::size_t k = 0; k < series.size(); ++k) {
    const PlotSeries& s = series[k];
    const char* color = kColors[k % (sizeof(kColors) / sizeof(kColors[0]))];
    std::string points;
    auto flush = [&] {
      if (!points.empty()) {
        svg << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"1.8\" points=\""
            << points << "\"/>\n";
      }
      points.clear();
    };
    for (std::size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i) {
      if (!usable(s.x[i], s.y[i])) {
        flush();
        continue;
      }
      std::ostringstream p;
      p.precision(6);
      p << px(s.x[i]) << "," << py(s.y[i]) << " ";
      points += p.str();
      if (s.markers) {
        svg << "<circle cx=\"" << px(s.x[i]) << "\" cy=\"" << py(s.y[i]) << "\" r=\"3\" fill=\""
            << color << "\"/>\n";
      }
    }
    flush();
    const double ly = top + 14 + 18.0 * k;
    svg << "<line x1=\"" << left + plot_w + 12 << "\" y1=\"" << ly - 4 << "\" x2=\""
        << left + plot_w + 32 << "\" y2=\"" << ly - 4 << "\" stroke=\"" << color
        << "\" stroke-width=\"2.5\"/>\n<text x=\"" << left + plot_w + 38 << "\" y=\"" << ly
        << "\">" << Escape(s.name) << "</text>\n";
  }
  svg << "</svg>\n";
  return svg.str();
}

void WriteTextFile(const std::string& path, const std::string& text) {
  WriteFileAtomically(path, text);
}

}  // namespace stillpoint
