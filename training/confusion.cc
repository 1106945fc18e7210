#include "training/confusion.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "framework/check.h"
#include "training/metrics.h"

namespace stillpoint {

double ConfusionMatrix::ClassAccuracy(int64_t c) const {
  int64_t total = 0;
  for (int64_t n : counts[c]) total += n;
  if (total == 0) return std::numeric_limits<double>::quiet_NaN();
  return static_cast<double>(counts[c][c]) / static_cast<double>(total);
}

double ConfusionMatrix::Accuracy() const {
  int64_t correct = 0, total = 0;
  for (int64_t c = 0; c < classes(); ++c) {
    correct += counts[c][c];
    for (int64_t n : counts[c]) total += n;
  }
  return total > 0 ? static_cast<double>(correct) / static_cast<double>(total) : 0.0;
}

ConfusionMatrix MakeConfusion(const std::vector<int64_t>& counts,
                              const std::vector<std::string>& names) {
  const auto classes = static_cast<int64_t>(std::lround(std::sqrt(counts.size())));
  SP_CHECK(classes * classes == static_cast<int64_t>(counts.size()),
           "MakeConfusion: ", counts.size(), " counts are not a square matrix");
  ConfusionMatrix matrix;
  for (int64_t t = 0; t < classes; ++t) {
    matrix.counts.emplace_back(counts.begin() + t * classes, counts.begin() + (t + 1) * classes);
    matrix.names.push_back(t < static_cast<int64_t>(names.size()) ? names[t] : std::to_string(t));
  }
  return matrix;
}

namespace {

std::string XmlEscape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace

std::string ConfusionSvg(const ConfusionMatrix& matrix, const std::string& title) {
  const int64_t n = matrix.classes();
  const int cell = 44, left = 110, top = 60, right = 80, bottom = 110;
  const int width = left + cell * static_cast<int>(n) + right;
  const int height = top + cell * static_cast<int>(n) + bottom;
  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\""
      << height << "\" font-family=\"sans-serif\" font-size=\"11\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text x=\"" << width / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">"
      << XmlEscape(title) << "</text>\n"
      << "<text x=\"" << left + cell * n / 2 << "\" y=\"" << height - 12
      << "\" text-anchor=\"middle\">predicted class</text>\n"
      << "<text x=\"14\" y=\"" << top + cell * n / 2 << "\" text-anchor=\"middle\" "
      << "transform=\"rotate(-90 14 " << top + cell * n / 2 << ")\">true class</text>\n";
  for (int64_t t = 0; t < n; ++t) {
    int64_t total = 0;
    for (int64_t v : matrix.counts[t]) total += v;
    const int y = top + static_cast<int>(t) * cell;
    svg << "<text x=\"" << left - 6 << "\" y=\"" << y + cell / 2 + 4
        << "\" text-anchor=\"end\">" << XmlEscape(matrix.names[t]) << "</text>\n";
    for (int64_t p = 0; p < n; ++p) {
      const double share =
          total > 0 ? static_cast<double>(matrix.counts[t][p]) / static_cast<double>(total) : 0.0;
      // White (0) to dark blue (1) by the share of the true class's row.
      const int shade = static_cast<int>(std::lround(255 * (1 - share)));
      char fill[32];
      std::snprintf(fill, sizeof(fill), "rgb(%d,%d,255)", shade, shade);
      const int x = left + static_cast<int>(p) * cell;
      svg << "<rect x=\"" << x << "\" y=\"" << y << "\" width=\"" << cell << "\" height=\""
          << cell << "\" fill=\"" << fill << "\" stroke=\"#ccc\"><title>"
          << XmlEscape(matrix.names[t]) << " predicted as " << XmlEscape(matrix.names[p]) << ": "
          << matrix.counts[t][p] << "</title></rect>\n"
          << "<text x=\"" << x + cell / 2 << "\" y=\"" << y + cell / 2 + 4
          << "\" text-anchor=\"middle\" fill=\"" << (share > 0.5 ? "white" : "black") << "\">"
          << matrix.counts[t][p] << "</text>\n";
    }
    char accuracy[32];
    std::snprintf(accuracy, sizeof(accuracy), "%.1f%%", 100.0 * matrix.ClassAccuracy(t));
    svg << "<text x=\"" << left + cell * n + 6 << "\" y=\"" << y + cell / 2 + 4 << "\">"
        << accuracy << "</text>\n";
  }
  for (int64_t p = 0; p < n; ++p) {
    const int x = left + static_cast<int>(p) * cell + cell / 2;
    const int y = top + cell * static_cast<int>(n) + 8;
    svg << "<text x=\"" << x << "\" y=\"" << y << "\" text-anchor=\"end\" transform=\"rotate(-50 "
        << x << " " << y << ")\">" << XmlEscape(matrix.names[p]) << "</text>\n";
  }
  svg << "</svg>\n";
  return svg.str();
}

std::string PerClassAccuracyMarkdown(const ConfusionMatrix& matrix) {
  std::ostringstream md;
  md << "| class | examples | accuracy |\n|---|---:|---:|\n";
  for (int64_t c = 0; c < matrix.classes(); ++c) {
    int64_t total = 0;
    for (int64_t v : matrix.counts[c]) total += v;
    char accuracy[32];
    std::snprintf(accuracy, sizeof(accuracy), "%.2f%%", 100.0 * matrix.ClassAccuracy(c));
    md << "| " << matrix.names[c] << " | " << total << " | " << accuracy << " |\n";
  }
  return md.str();
}

std::string PerClassAccuracyJson(const ConfusionMatrix& matrix) {
  std::string out = "{";
  for (int64_t c = 0; c < matrix.classes(); ++c) {
    if (c > 0) out += ", ";
    out += JsonString(matrix.names[c]) + ": " + JsonNumber(matrix.ClassAccuracy(c));
  }
  return out + "}";
}

}  // namespace stillpoint
