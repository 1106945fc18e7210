// The confusion matrix of a classifier on a held-out set, its per-class
// accuracy, and the matrix drawn as an SVG heat map (rows: true class,
// columns: predicted class, each cell shaded by its share of the row).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace stillpoint {

struct ConfusionMatrix {
  // counts[true][predicted]
  std::vector<std::vector<int64_t>> counts;
  std::vector<std::string> names;  // one per class ("0", "1", ... when unnamed)

  int64_t classes() const { return static_cast<int64_t>(counts.size()); }
  // The share of class c's examples predicted as c (NaN for a class with
  // no examples).
  double ClassAccuracy(int64_t c) const;
  double Accuracy() const;
};

// The matrix of an evaluation's counts [target * classes + predicted]
// (EvalResult::confusion), with the class names (fewer names than classes:
// the rest are named by their number).
ConfusionMatrix MakeConfusion(const std::vector<int64_t>& counts,
                              const std::vector<std::string>& names);

std::string ConfusionSvg(const ConfusionMatrix& matrix, const std::string& title);
// A Markdown table: class, examples, accuracy.
std::string PerClassAccuracyMarkdown(const ConfusionMatrix& matrix);
// {"T-shirt/top": 0.83, ...}
std::string PerClassAccuracyJson(const ConfusionMatrix& matrix);

}  // namespace stillpoint
