#include "layers/energy_layer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "framework/ops.h"

namespace stillpoint {

const char* ToString(KeyGrad key_grad) {
  switch (key_grad) {
    case KeyGrad::kStop:
      return "stop";
    case KeyGrad::kFull:
      return "full";
  }
  return "unknown";
}

bool StringToKeyGrad(const std::string& text, KeyGrad* key_grad) {
  if (text == "stop") {
    *key_grad = KeyGrad::kStop;
  } else if (text == "full") {
    *key_grad = KeyGrad::kFull;
  } else {
    return false;
  }
  return true;
}

// -------------------------------------------------------------- EnergyLayer

void CheckSampleEnergies(const EnergyLayerBase& layer, const Var& z, const Var& energy) {
  SP_CHECK(energy.defined() && energy.shape() == Shape{z.dim(0)}, layer.Name(),
           "::Energy returned shape ", energy.defined() ? energy.shape().ToString() : "(undefined)",
           " for a state ", z.shape(), "; it must return [", z.dim(0), "], one energy per sample");
}

Var AutodiffStateGrad(const std::function<Var(const Var&)>& sample_energies, const Var& z) {
  if (GradModeEnabled() && z.requires_grad()) {
    // Differentiate through z itself, so the gradient stays a function of
    // whatever z was computed from.
    Var energy = sum(sample_energies(z));
    GradOptions options;
    options.create_graph = true;
    Var g = grad({energy}, {z}, {}, options)[0];
    return g.defined() ? g : zeros_like(z);
  }
  // z is a constant (or the tape is off): differentiate through a fresh
  // leaf. The result is still recorded with respect to the context and the
  // parameters when the caller records.
  const bool record = GradModeEnabled();
  Var leaf(z.value(), /*requires_grad=*/true);
  Var g;
  {
    GradModeGuard tape_on(true);
    Var energy = sum(sample_energies(leaf));
    GradOptions options;
    options.create_graph = record;
    g = grad({energy}, {leaf}, {}, options)[0];
  }
  if (!g.defined()) return constant(Tensor::Zeros(z.shape(), z.dtype()));
  return record ? g : g.detach();
}

void EnergyLayerBase::set_gradient_step(double step) {
  SP_CHECK(step > 0.0 && std::isfinite(step), Name(), ": gradient step must be > 0, got ", step);
  gradient_step_ = step;
}

// ---------------------------------------------------------- driving updates

namespace {

Shape WithBatch(int64_t batch, const Shape& state_shape) {
  std::vector<int64_t> dims = {batch};
  for (int64_t d : state_shape.dims()) dims.push_back(d);
  return Shape(dims);
}

void CheckStateShape(const char* what, const Var& z, const Shape& state_shape) {
  SP_CHECK(z.rank() >= 1 && z.numel() == z.dim(0) * state_shape.numel(), what, ": state ",
           z.shape(), " does not hold samples of shape ", state_shape);
}

}  // namespace

EnergyCellFn MakeUpdateCell(const BoundEnergyPtr& energy, const Shape& state_shape) {
  return [energy, state_shape](const Var& z, const std::vector<int64_t>& ids) {
    CheckStateShape("MakeUpdateCell", z, state_shape);
    Var state = reshape(z, WithBatch(z.dim(0), state_shape));
    return reshape(energy->Select(ids)->Update(state), z.shape());
  };
}

EnergyCellFn MakeUpdateCellFor(const BoundEnergyPtr& energy, const Tensor& states) {
  SP_CHECK(states.defined() && states.rank() >= 2, "MakeUpdateCellFor: states must be [B, ...]");
  const std::vector<int64_t> dims = states.shape().dims();
  return MakeUpdateCell(energy, Shape(std::vector<int64_t>(dims.begin() + 1, dims.end())));
}

EnergyCellFn MakeGradientStepCell(const BoundEnergyPtr& energy,
                                  const Shape& state_shape,
                                  double step) {
  SP_CHECK(step > 0.0, "MakeGradientStepCell: step must be > 0, got ", step);
  return [energy, state_shape, step](const Var& z, const std::vector<int64_t>& ids) {
    CheckStateShape("MakeGradientStepCell", z, state_shape);
    Var state = reshape(z, WithBatch(z.dim(0), state_shape));
    return reshape(energy->Select(ids)->GradientStep(state, step), z.shape());
  };
}

BatchedEnergy MakeBatchedEnergy(const BoundEnergyPtr& energy, const Shape& state_shape) {
  return [energy, state_shape](const Tensor& z, const std::vector<int64_t>& ids, Tensor* energies,
                               Tensor* gradient) {
    NoGrad no_grad;
    const BoundEnergyPtr selected = energy->Select(ids);
    Var state(z.Reshape(WithBatch(z.dim(0), state_shape)));
    if (energies != nullptr) energies->CopyFrom(selected->SampleEnergies(state).value());
    if (gradient != nullptr) gradient->CopyFrom(selected->EnergyGrad(state).value());
    return true;
  };
}

Var UnrollUpdates(const BoundEnergy& energy, const Var& z0, int steps) {
  SP_CHECK(steps >= 0, "UnrollUpdates: steps must be >= 0, got ", steps);
  Var z = z0;
  for (int t = 0; t < steps; ++t) z = energy.Update(z);
  return z;
}

const char* ToString(EnergySolveMode mode) {
  switch (mode) {
    case EnergySolveMode::kFixedSteps:
      return "fixed_steps";
    case EnergySolveMode::kFixedPoint:
      return "fixed_point";
  }
  return "unknown";
}

bool StringToEnergySolveMode(const std::string& text, EnergySolveMode* mode) {
  if (text == "fixed_steps") {
    *mode = EnergySolveMode::kFixedSteps;
  } else if (text == "fixed_point") {
    *mode = EnergySolveMode::kFixedPoint;
  } else {
    return false;
  }
  return true;
}

// ------------------------------------------------------------ attention masks

Var MakeAttentionMask(const AttentionMask& mask,
                      bool causal,
                      int64_t batch,
                      int64_t heads,
                      int64_t queries,
                      int64_t keys,
                      DType dtype) {
  if (!causal && !mask.key_mask.defined() && !mask.additive.defined()) return Var();
  int64_t mask_heads = 1;
  Tensor additive;
  if (mask.additive.defined()) {
    const Shape target{batch, heads, queries, keys};
    additive = mask.additive.To(DType::kFloat64);
    SP_CHECK(additive.rank() <= 4, "attention mask: additive mask ", additive.shape(),
             " does not broadcast to ", target);
    // Pad to rank 4 and check each extent against the scores'.
    std::vector<int64_t> dims(4 - additive.rank(), 1);
    for (int64_t d : additive.shape().dims()) dims.push_back(d);
    for (int i = 0; i < 4; ++i) {
      SP_CHECK(dims[i] == 1 || dims[i] == target[i], "attention mask: additive mask ",
               mask.additive.shape(), " does not broadcast to ", target);
    }
    additive = additive.Reshape(Shape(dims));
    mask_heads = dims[1];
  }
  if (mask.key_mask.defined()) {
    const Shape& km = mask.key_mask.shape();
    const bool fits =
        (km.rank() == 1 && km[0] == keys) || (km.rank() == 2 && km[0] == batch && km[1] == keys);
    SP_CHECK(fits, "attention mask: key_mask ", km, " must be [", batch, ", ", keys, "] or [", keys,
             "]");
  }
  const Shape shape{batch, mask_heads, queries, keys};
  std::vector<double> values(shape.numel(), 0.0);
  const std::vector<double> key_mask =
      mask.key_mask.defined() ? mask.key_mask.ToVector() : std::vector<double>();
  const std::vector<double> add_values =
      additive.defined() ? additive.ToVector() : std::vector<double>();
  const Shape add_shape = additive.defined() ? additive.shape() : Shape{1, 1, 1, 1};
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < mask_heads; ++h) {
      for (int64_t i = 0; i < queries; ++i) {
        for (int64_t j = 0; j < keys; ++j) {
          double v = 0.0;
          if (!add_values.empty()) {
            const int64_t ab = add_shape[0] == 1 ? 0 : b;
            const int64_t ah = add_shape[1] == 1 ? 0 : h;
            const int64_t ai = add_shape[2] == 1 ? 0 : i;
            const int64_t aj = add_shape[3] == 1 ? 0 : j;
            v = add_values[((ab * add_shape[1] + ah) * add_shape[2] + ai) * add_shape[3] + aj];
          }
          if (causal && j > i + (keys - queries)) v = -INFINITY;
          if (!key_mask.empty()) {
            const double hidden = key_mask.size() == static_cast<std::size_t>(keys)
                                      ? key_mask[j]
                                      : key_mask[b * keys + j];
            if (hidden != 0.0) v = -INFINITY;
          }
          values[((b * mask_heads + h) * queries + i) * keys + j] = v;
        }
      }
    }
  }
  return constant(Tensor::FromVector(shape, values, dtype));
}

Var ApplyAttentionMask(const Var& scores, const Var& mask) {
  return mask.defined() ? add(scores, mask) : scores;
}

// -------------------------------------------------------------- EnergyTrace

int64_t EnergyTrace::CountIncreases(double slack) const {
  int64_t count = 0;
  for (std::size_t t = 0; t + 1 < energies.size(); ++t) {
    for (std::size_t b = 0; b < energies[t].size(); ++b) {
      if (energies[t + 1][b] > energies[t][b] + slack) ++count;
    }
  }
  return count;
}

double EnergyTrace::MaxIncrease() const {
  double worst = -INFINITY;
  for (std::size_t t = 0; t + 1 < energies.size(); ++t) {
    for (std::size_t b = 0; b < energies[t].size(); ++b) {
      worst = std::max(worst, energies[t + 1][b] - energies[t][b]);
    }
  }
  return worst;
}

EnergyTrace TraceUpdates(const BoundEnergy& energy,
                         const Tensor& z0,
                         const EnergyTraceOptions& options) {
  std::string error;
  SP_CHECK(options.IsValid(&error), "TraceUpdates: ", error);
  NoGrad no_grad;
  const int64_t batch = z0.dim(0);
  const int64_t per_sample = z0.numel() / std::max<int64_t>(batch, 1);
  EnergyTrace trace;
  Var z(z0.Clone());
  trace.energies.push_back(energy.SampleEnergies(z).value().ToVector());
  for (int t = 0; t < options.max_steps; ++t) {
    Var next = energy.Update(z);
    std::vector<double> step(batch, 0.0);
    const std::vector<double> a = next.value().ToVector();
    const std::vector<double> b = z.value().ToVector();
    for (int64_t s = 0; s < batch; ++s) {
      double sum_sq = 0.0;
      for (int64_t i = s * per_sample; i < (s + 1) * per_sample; ++i) {
        sum_sq += (a[i] - b[i]) * (a[i] - b[i]);
      }
      step[s] = std::sqrt(sum_sq);
    }
    z = next;
    trace.energies.push_back(energy.SampleEnergies(z).value().ToVector());
    trace.step_norms.push_back(step);
    trace.steps = t + 1;
    if (options.tolerance > 0.0 &&
        *std::max_element(step.begin(), step.end()) <= options.tolerance) {
      trace.converged = true;
      break;
    }
  }
  trace.final_state = z.value();
  return trace;
}

const OptionFields<EnergySolveOptions>& EnergySolveOptions::Fields() {
  using O = EnergySolveOptions;
  static const auto* fields =
      &(new OptionFields<O>)
           ->Enum("mode", &O::mode, {EnergySolveMode::kFixedSteps, EnergySolveMode::kFixedPoint},
                  stillpoint::ToString,
                  "fixed_steps: `steps` updates, backpropagated through; fixed_point: solved to "
                  "the fixed point with `implicit`")
           .Int("steps", &O::steps, 0, std::numeric_limits<int>::max(),
                "Updates in fixed_steps mode (0: the state is left as initialised)")
           .Bool("trace_energy", &O::trace_energy,
                 "Record the energy of every sample along the solve in the report");
  return *fields;
}

bool EnergySolveOptions::IsValid(std::string* error) const {
  const std::string problem = Fields().Check(*this);
  if (!problem.empty() && error != nullptr) *error = "EnergySolveOptions: " + problem;
  return problem.empty();
}

std::string EnergySolveOptions::ToString() const { return Fields().Describe(*this) + "\n"; }

const OptionFields<EnergyTraceOptions>& EnergyTraceOptions::Fields() {
  using O = EnergyTraceOptions;
  static const auto* fields =
      &(new OptionFields<O>)
           ->Int("max_steps", &O::max_steps, 0, std::numeric_limits<int>::max(),
                 "Updates to run at most")
           // +infinity stays accepted, as before: one update, then stop.
           .Double("tolerance", &O::tolerance, 0.0, std::numeric_limits<double>::infinity(),
                   "Stop when every sample's step ||z_{t+1} - z_t|| is <= tolerance (0: exactly "
                   "max_steps updates)");
  return *fields;
}

bool EnergyTraceOptions::IsValid(std::string* error) const {
  const std::string problem = Fields().Check(*this);
  if (!problem.empty() && error != nullptr) *error = "EnergyTraceOptions: " + problem;
  return problem.empty();
}

std::string EnergyTraceOptions::ToString() const { return Fields().Describe(*this) + "\n"; }

}  // namespace stillpoint
