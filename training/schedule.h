// Learning-rate schedules: the learning rate as a function of the step.
//
//   lr(step) = base_lr * warmup(step) * decay(step)
//   warmup(step) = min(1, (step + 1) / warmup_steps)   (1 when warmup_steps = 0)
//   decay: constant  1
//          step      gamma ^ floor(step / step_size)
//          cosine    min_ratio + (1 - min_ratio) * (1 + cos(pi * p)) / 2,
//                    p = clamp((step - warmup_steps) / (total_steps - warmup_steps), 0, 1)
//
// Steps count from 0. Warm-up matters for implicit models: a DEQ trained at
// full learning rate from step 0 can stall at chance (DESIGN.md).
#pragma once

#include <cstdint>
#include <string>

#include "framework/option_fields.h"

namespace stillpoint {

enum class ScheduleType { kConstant, kStep, kCosine };
const char* ToString(ScheduleType type);
bool StringToScheduleType(const std::string& text, ScheduleType* type);

// train.schedule.* (framework/option_fields.h); total_steps is a setting
// for code only (a config's train.steps sets it).
struct ScheduleOptions {
  ScheduleType type = ScheduleType::kCosine;
  // Linear warm-up from base_lr / warmup_steps to base_lr (0: none).
  int64_t warmup_steps = 20;
  // kStep: multiply by gamma every step_size steps.
  int64_t step_size = 1000;
  double gamma = 0.1;
  // kCosine: decay to min_ratio * base_lr at total_steps.
  int64_t total_steps = 1000;
  double min_ratio = 0.1;

  static const OptionFields<ScheduleOptions>& Fields();
  bool IsValid(std::string* error) const;
  std::string ToString() const;
};

double LearningRateAt(const ScheduleOptions& options, double base_lr, int64_t step);

}  // namespace stillpoint
