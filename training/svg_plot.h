// Line charts as standalone SVG text: several named series on shared axes,
// with ticks at round values, grid, axis labels (with their units) and a
// legend sized to its longest entry. Used for the run directory's curves and
// the comparison report. Non-finite points are skipped (a gap in the line),
// so a diverged run still plots; a column that holds values only on some
// rows (held-out accuracy, written at evaluations) is passed through
// EvaluatedPoints first, so its points join into one line.
#pragma once

#include <string>
#include <vector>

namespace stillpoint {

struct PlotSeries {
  std::string name;
  std::vector<double> x;
  std::vector<double> y;
  bool markers = false;  // draw a dot at each point (for short series)
  // Optional band drawn shaded behind the line (e.g. mean +- standard
  // deviation over seeds): empty, or one low and one high value per x.
  std::vector<double> y_low = {};
  std::vector<double> y_high = {};
};

struct PlotOptions {
  std::string title;
  std::string x_label;  // with the unit, e.g. "step"
  std::string y_label;  // with the unit, e.g. "accuracy (%)"
  bool log_y = false;   // only positive y values are drawn
  // The plot area's size; the legend is added to the right of it, or below
  // it when it would take more than half the width.
  int width = 640;
  int height = 400;
  bool log_x = false;  // only positive x values are drawn
};

std::string LinePlotSvg(const std::vector<PlotSeries>& series, const PlotOptions& options);

// The points (x[i], scale * y[i]) whose y is finite: a column written only on
// some rows becomes one connected line instead of isolated points.
PlotSeries EvaluatedPoints(const std::string& name, const std::vector<double>& x,
                           const std::vector<double>& y, double scale = 1.0, bool markers = true);

// Tick positions at round values covering [low, high]: multiples of 1, 2 or
// 5 times a power of ten, the largest such spacing that gives at least 4
// of them (so at most 11).
std::vector<double> LinearTicks(double low, double high);
// Ticks of a log axis covering [low, high] (positive): powers of ten, with 2
// and 5 times them when fewer than three decades are covered, and linear
// round values when the span is within one decade.
std::vector<double> LogTicks(double low, double high);
// A tick label: a round value in its shortest form ("0.3", "25", "100000",
// "1e-06"), never "0.30000000000000004".
std::string TickLabel(double value);

// Heat maps: one panel per model, side by side, each a grid of cells
// coloured by a value in [0, 1] (e.g. held-out accuracy) and labelled with
// it in percent; rows and columns are the values of two settings (e.g. the
// input length and the test-time iterations). A panel's rows and columns
// may differ (an explicit model has one depth); NaN cells are drawn empty.
struct HeatMapPanel {
  std::string title;            // the model, e.g. "implicit"
  std::vector<double> rows;     // top to bottom
  std::vector<double> columns;  // left to right
  std::vector<double> values;   // rows x columns, row-major, in [0, 1]
};

struct HeatMapOptions {
  std::string title;
  std::string row_label;     // with the unit, e.g. "length (tokens)"
  std::string column_label;  // e.g. "test-time iterations"
};

std::string HeatMapSvg(const std::vector<HeatMapPanel>& panels, const HeatMapOptions& options);

// Writes text to path (atomically); throws an Error naming the path.
void WriteTextFile(const std::string& path, const std::string& text);

}  // namespace stillpoint
