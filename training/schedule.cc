#include "training/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace stillpoint {

const char* ToString(ScheduleType type) {
  switch (type) {
    case ScheduleType::kConstant:
      return "constant";
    case ScheduleType::kStep:
      return "step";
    case ScheduleType::kCosine:
      return "cosine";
  }
  return "unknown";
}

bool StringToScheduleType(const std::string& text, ScheduleType* type) {
  for (ScheduleType t : {ScheduleType::kConstant, ScheduleType::kStep, ScheduleType::kCosine}) {
    if (text == ToString(t)) {
      *type = t;
      return true;
    }
  }
  return false;
}

bool ScheduleOptions::IsValid(std::string* error) const {
  auto fail = [&](const std::string& message) {
    if (error) *error = message;
    return false;
  };
  if (warmup_steps < 0) return fail("warmup_steps must be >= 0");
  if (step_size < 1) return fail("step_size must be >= 1");
  if (!(gamma > 0 && gamma <= 1)) return fail("gamma must be in (0, 1]");
  if (total_steps < 1) return fail("total_steps must be >= 1");
  if (!(min_ratio >= 0 && min_ratio <= 1)) return fail("min_ratio must be in [0, 1]");
  return true;
}

double LearningRateAt(const ScheduleOptions& options, double base_lr, int64_t step) {
  double factor = 1.0;
  if (options.warmup_steps > 0) {
    factor = std::min(1.0, static_cast<double>(step + 1) / options.warmup_steps);
  }
  switch (options.type) {
    case ScheduleType::kConstant:
      break;
    case ScheduleType::kStep:
      factor *= std::pow(options.gamma, static_cast<double>(step / options.step_size));
      break;
    case ScheduleType::kCosine: {
      const double span = std::max<int64_t>(1, options.total_steps - options.warmup_steps);
      const double p =
          std::clamp(static_cast<double>(step - options.warmup_steps) / span, 0.0, 1.0);
      factor *= options.min_ratio +
                (1.0 - options.min_ratio) * 0.5 * (1.0 + std::cos(std::numbers::pi * p));
      break;
    }
  }
  return base_lr * factor;
}

}  // namespace stillpoint
