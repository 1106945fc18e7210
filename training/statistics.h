// Summary statistics of measured values (step times, reduction times).
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace stillpoint {

// The median (the mean of the two middle values for an even count); 0 for
// no values.
inline double Median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

}  // namespace stillpoint
