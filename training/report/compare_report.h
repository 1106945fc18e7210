// The comparison report (report.md, report.html and the SVG figures) of
// several training runs, written by `stillpoint compare` after its variants
// have trained and by `stillpoint report RUN...` from existing run
// directories.
//
// Runs of the same variant name (e.g. one per seed of compare.seeds) are
// pooled: their table cells read "mean ± standard deviation" (sample
// standard deviation over the runs) and their curves are drawn as the mean
// with a shaded band of +- one standard deviation. Accuracies are in percent
// in every table and figure.
#pragma once

#include <string>
#include <vector>

#include "training/report/compare.h"

namespace stillpoint {

// What the report's opening lines say about where its runs came from.
struct ReportHeader {
  std::string description;  // markdown: "Config `x.yaml`; task `reverse`, ..."
  // The attention x kind grid (compare.attention, compare.kinds); empty: none.
  std::vector<std::string> grid_attentions;
  std::vector<std::string> grid_kinds;
};

// Writes ROOT/report.md, ROOT/report.html and the figures, and fills
// report->table, report->grid, report->markdown_path and report->html_path.
// Each variant's metrics are read from its run_dir.
void WriteComparisonReport(const std::string& root, const ReportHeader& header,
                           CompareReport* report);

// RUN_DIR/variant.json: what compare measures after a variant has trained
// (name, seed, overrides, gradient probe, accuracy against depth and
// length), so `stillpoint report` can rebuild the report later.
void SaveVariantResult(const VariantResult& variant);

// A run directory read back: summary.json (required), config.yaml and
// variant.json (when present; without it the name is `fallback_name`).
// Throws ConfigError naming the file when one is missing or malformed.
VariantResult LoadVariantResult(const std::string& run_dir, const std::string& fallback_name);

// The run directories under `path`: itself when it holds summary.json,
// else every directory below it that does (a comparison's variants), in
// sorted order. ConfigError when there is none.
std::vector<std::string> FindRunDirectories(const std::string& path);

}  // namespace stillpoint
