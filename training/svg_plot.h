// Line charts as standalone SVG text: several named series on shared axes,
// with ticks, grid, axis labels and a legend. Used for the run directory's
// curves and the comparison report. Non-finite points are skipped (a gap in
// the line), so a diverged run still plots.
#pragma once

#include <string>
#include <vector>

namespace stillpoint {

struct PlotSeries {
  std::string name;
  std::vector<double> x;
  std::vector<double> y;
  bool markers = false;  // draw a dot at each point (for short series)
};

struct PlotOptions {
  std::string title;
  std::string x_label;
  std::string y_label;
  bool log_y = false;  // only positive y values are drawn
  int width = 640;
  int height = 400;
  bool log_x = false;  // only positive x values are drawn
};

std::string LinePlotSvg(const std::vector<PlotSeries>& series, const PlotOptions& options);

// Writes text to path (atomically); throws an Error naming the path.
void WriteTextFile(const std::string& path, const std::string& text);

}  // namespace stillpoint
