#include "training/report/compare_heat_map.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "training/svg_plot.h"

namespace stillpoint {
namespace {

// The sorted distinct values of one coordinate of a variant's grid.
std::vector<double> Distinct(const std::vector<ScaleDepthResult>& grid,
                             double ScaleDepthResult::*coordinate) {
  std::vector<double> values;
  for (const ScaleDepthResult& g : grid) values.push_back(g.*coordinate);
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  return values;
}

HeatMapPanel PanelOf(const VariantResult& v, double ScaleDepthResult::*value) {
  HeatMapPanel panel;
  panel.title = v.name;
  panel.rows = Distinct(v.scale_depth, &ScaleDepthResult::scale);
  panel.columns = Distinct(v.scale_depth, &ScaleDepthResult::depth);
  panel.values.assign(panel.rows.size() * panel.columns.size(),
                      std::numeric_limits<double>::quiet_NaN());
  for (const ScaleDepthResult& g : v.scale_depth) {
    const std::size_t r =
        std::lower_bound(panel.rows.begin(), panel.rows.end(), g.scale) - panel.rows.begin();
    const std::size_t c = std::lower_bound(panel.columns.begin(), panel.columns.end(), g.depth) -
                          panel.columns.begin();
    panel.values[r * panel.columns.size() + c] = g.*value;
  }
  return panel;
}

// A panel as a markdown table: a row per scale, a column per depth.
std::string PanelTable(const HeatMapPanel& panel, const std::string& scale) {
  std::ostringstream table;
  table << "| " << scale << " \\\\ iterations |";
  for (double c : panel.columns) table << " " << TickLabel(c) << " |";
  table << "\n|---|";
  for (std::size_t c = 0; c < panel.columns.size(); ++c) table << "---|";
  table << "\n";
  for (std::size_t r = 0; r < panel.rows.size(); ++r) {
    table << "| " << TickLabel(panel.rows[r]) << " |";
    for (std::size_t c = 0; c < panel.columns.size(); ++c) {
      const double v = panel.values[r * panel.columns.size() + c];
      char cell[32];
      std::snprintf(cell, sizeof(cell), "%.2f%%", 100.0 * v);
      table << " " << (std::isfinite(v) ? cell : "-") << " |";
    }
    table << "\n";
  }
  return table.str();
}

}  // namespace

HeatMapSection WriteHeatMapSection(const std::string& root,
                                   const std::vector<VariantResult>& variants) {
  HeatMapSection section;
  std::vector<const VariantResult*> measured;
  for (const VariantResult& v : variants) {
    // One panel per variant name (the first seed's run).
    const bool seen = std::any_of(measured.begin(), measured.end(),
                                  [&](const VariantResult* m) { return m->name == v.name; });
    if (!v.scale_depth.empty() && !seen) measured.push_back(&v);
  }
  if (measured.empty()) return section;
  const std::string scale = measured.front()->scale_name;
  std::vector<HeatMapPanel> accuracy, solved;
  for (const VariantResult* v : measured) {
    accuracy.push_back(PanelOf(*v, &ScaleDepthResult::accuracy));
    solved.push_back(PanelOf(*v, &ScaleDepthResult::solved_fraction));
  }
  const std::string title =
      "Extrapolation: held-out accuracy (%) by " + scale + " and test-time iterations";
  const std::string svg = HeatMapSvg(accuracy, {title, scale, "test-time iterations (tied: "
                                                              "unrolled steps; explicit: layers)"});
  WriteTextFile(root + "/heat_map.svg", svg);
  const std::string solved_title = "Inputs solved exactly (%) by " + scale +
                                   " and test-time iterations";
  const std::string solved_svg = HeatMapSvg(solved, {solved_title, scale, "test-time iterations"});
  WriteTextFile(root + "/solved_heat_map.svg", solved_svg);
  std::ostringstream md, html;
  const std::string explanation =
      "Each variant trained at one " + scale +
      " and was evaluated at every " + scale +
      " (rows) with every test-time budget (columns: the forward solver's iterations of an "
      "implicit model, the unrolled steps of a tied one; an explicit model has its one depth). "
      "An implicit model that extrapolates holds its accuracy down the rows when given more "
      "iterations; a fixed-depth model cannot use them.";
  md << "## " << title << "\n\n![" << title << "](heat_map.svg)\n\n" << explanation << "\n\n";
  html << "<h2>" << title << "</h2>\n" << svg << "<p>" << explanation << "</p>\n";
  for (std::size_t k = 0; k < measured.size(); ++k) {
    md << "**" << measured[k]->name << "**, accuracy per token:\n\n"
       << PanelTable(accuracy[k], scale) << "\nsolved exactly:\n\n"
       << PanelTable(solved[k], scale) << "\n";
  }
  md << "## " << solved_title << "\n\n![" << solved_title << "](solved_heat_map.svg)\n\n";
  html << "<h2>" << solved_title << "</h2>\n" << solved_svg;
  section.markdown = md.str();
  section.html = html.str();
  return section;
}

}  // namespace stillpoint
