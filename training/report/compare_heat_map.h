// The comparison report's extrapolation section: held-out accuracy by
// input scale (rows: eval.lengths or eval.sizes) and test-time iterations
// (columns: eval.iterations_sweep; an explicit model has its one depth),
// one heat map panel per variant side by side (heat_map.svg), with the
// numbers and the fraction of inputs solved exactly as tables.
#pragma once

#include <string>
#include <vector>

#include "training/report/compare.h"

namespace stillpoint {

struct HeatMapSection {
  std::string markdown;
  std::string html;
};

// Writes ROOT/heat_map.svg and ROOT/solved_heat_map.svg and returns the
// section's text; empty when no variant measured a grid.
HeatMapSection WriteHeatMapSection(const std::string& root,
                                   const std::vector<VariantResult>& variants);

}  // namespace stillpoint
