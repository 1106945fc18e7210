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

const OptionFields<ScheduleOptions>& ScheduleOptions::Fields() {
  using O = ScheduleOptions;
  constexpr int64_t kBig = int64_t{1} << 40;
  static const auto* fields =
      &(new OptionFields<O>)
           ->Enum("type", &O::type,
                  {ScheduleType::kConstant, ScheduleType::kStep, ScheduleType::kCosine},
                  stillpoint::ToString, "Learning-rate schedule after warm-up")
           .Int("warmup_steps", &O::warmup_steps, 0, kBig, "Linear warm-up steps")
           .Int("step_size", &O::step_size, 1, kBig, "step: steps between decays")
           .Double("gamma", &O::gamma, 1e-12, 1.0, "step: decay factor")
           .Double("min_ratio", &O::min_ratio, 0.0, 1.0, "cosine: final lr / base lr")
           .Int("total_steps", &O::total_steps, 1, kBig, "cosine: steps of the whole run")
           .NotInConfig();
  return *fields;
}

bool ScheduleOptions::IsValid(std::string* error) const {
  const std::string problem = Fields().Check(*this);
  if (!problem.empty() && error != nullptr) *error = problem;
  return problem.empty();
}

std::string ScheduleOptions::ToString() const { return Fields().Describe(*this) + "\n"; }

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
