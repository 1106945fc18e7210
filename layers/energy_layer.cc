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

// ------------------------------------------------------------ EnergyContext

void EnergyContext::Put(const std::string& name, const Var& value, bool per_sample) {
  SP_CHECK(!name.empty(), "EnergyContext: an entry needs a name");
  SP_CHECK(value.defined(), "EnergyContext: entry '", name, "' is undefined");
  if (per_sample) {
    SP_CHECK(value.rank() >= 1, "EnergyContext: per-sample entry '", name,
             "' needs a sample axis, got shape ", value.shape());
    SP_CHECK(batch_size_ < 0 || value.dim(0) == batch_size_, "EnergyContext: per-sample entry '",
             name, "' has ", value.dim(0), " samples (shape ", value.shape(), ") but ", Describe(),
             " has ", batch_size_);
  }
  for (Entry& entry : entries_) {
    if (entry.name == name) {
      entry.value = value;
      entry.per_sample = per_sample;
      if (per_sample) batch_size_ = value.dim(0);
      return;
    }
  }
  entries_.push_back({name, value, per_sample});
  if (per_sample) batch_size_ = value.dim(0);
}

void EnergyContext::Set(const std::string& name, const Var& value) { Put(name, value, true); }

void EnergyContext::SetShared(const std::string& name, const Var& value) {
  Put(name, value, false);
}

bool EnergyContext::Has(const std::string& name) const {
  return std::any_of(entries_.begin(), entries_.end(),
                     [&](const Entry& entry) { return entry.name == name; });
}

const Var& EnergyContext::Get(const std::string& name) const {
  for (const Entry& entry : entries_) {
    if (entry.name == name) return entry.value;
  }
  SP_CHECK(false, "EnergyContext: no entry '", name, "'; the context has ", Describe());
  return entries_.front().value;  // unreachable
}

VarList EnergyContext::Values() const {
  VarList values;
  for (const Entry& e : entries_) values.push_back(e.value);
  return values;
}

EnergyContext EnergyContext::Select(const std::vector<int64_t>& sample_ids) const {
  bool identity = static_cast<int64_t>(sample_ids.size()) == batch_size_;
  for (std::size_t i = 0; identity && i < sample_ids.size(); ++i) {
    identity = sample_ids[i] == static_cast<int64_t>(i);
  }
  if (identity || batch_size_ < 0) return *this;
  for (int64_t id : sample_ids) {
    SP_CHECK(id >= 0 && id < batch_size_, "EnergyContext::Select: sample id ", id, " outside [0, ",
             batch_size_, ")");
  }
  EnergyContext selected;
  for (const Entry& entry : entries_) {
    if (entry.per_sample) {
      selected.Set(entry.name, gather(entry.value, 0, sample_ids));
    } else {
      selected.SetShared(entry.name, entry.value);
    }
  }
  selected.batch_size_ = static_cast<int64_t>(sample_ids.size());
  return selected;
}

std::string EnergyContext::Describe() const {
  if (entries_.empty()) return "no entries";
  std::string text;
  for (const Entry& entry : entries_) {
    if (!text.empty()) text += ", ";
    text += entry.name + (entry.per_sample ? " " : " (shared) ") + entry.value.shape().ToString();
  }
  return text;
}

// -------------------------------------------------------------- EnergyLayer

Var EnergyLayer::SampleEnergies(const Var& z, const EnergyContext& ctx) const {
  Var energy = Energy(z, ctx);
  SP_CHECK(energy.defined() && energy.shape() == Shape{z.dim(0)}, Name(),
           "::Energy returned shape ", energy.defined() ? energy.shape().ToString() : "(undefined)",
           " for a state ", z.shape(), "; it must return [", z.dim(0),
           "], one energy per sample");
  return energy;
}

Var AutodiffEnergyGrad(const EnergyLayer& layer, const Var& z, const EnergyContext& ctx) {
  if (GradModeEnabled() && z.requires_grad()) {
    // Differentiate through z itself, so the gradient stays a function of
    // whatever z was computed from.
    Var energy = sum(layer.SampleEnergies(z, ctx));
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
    Var energy = sum(layer.SampleEnergies(leaf, ctx));
    GradOptions options;
    options.create_graph = record;
    g = grad({energy}, {leaf}, {}, options)[0];
  }
  if (!g.defined()) return constant(Tensor::Zeros(z.shape(), z.dtype()));
  return record ? g : g.detach();
}

Var EnergyLayer::EnergyGrad(const Var& z, const EnergyContext& ctx) const {
  return AutodiffEnergyGrad(*this, z, ctx);
}

Var EnergyLayer::GradientStep(const Var& z, const EnergyContext& ctx, double step) const {
  return sub(z, mul_scalar(EnergyGrad(z, ctx), step));
}

Var EnergyLayer::Update(const Var& z, const EnergyContext& ctx) const {
  return GradientStep(z, ctx, gradient_step_);
}

void EnergyLayer::set_gradient_step(double step) {
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

EnergyCellFn MakeUpdateCell(const EnergyLayer& layer,
                            const EnergyContext& ctx,
                            const Shape& state_shape) {
  const EnergyLayer* layer_ptr = &layer;
  return [layer_ptr, ctx, state_shape](const Var& z, const std::vector<int64_t>& ids) {
    CheckStateShape("MakeUpdateCell", z, state_shape);
    EnergyContext selected = ctx.Select(ids);
    Var state = reshape(z, WithBatch(z.dim(0), state_shape));
    return reshape(layer_ptr->Update(state, selected), z.shape());
  };
}

EnergyCellFn MakeGradientStepCell(const EnergyLayer& layer,
                                  const EnergyContext& ctx,
                                  const Shape& state_shape,
                                  double step) {
  SP_CHECK(step > 0.0, "MakeGradientStepCell: step must be > 0, got ", step);
  const EnergyLayer* layer_ptr = &layer;
  return [layer_ptr, ctx, state_shape, step](const Var& z, const std::vector<int64_t>& ids) {
    CheckStateShape("MakeGradientStepCell", z, state_shape);
    EnergyContext selected = ctx.Select(ids);
    Var state = reshape(z, WithBatch(z.dim(0), state_shape));
    return reshape(layer_ptr->GradientStep(state, selected, step), z.shape());
  };
}

BatchedEnergy MakeBatchedEnergy(const EnergyLayer& layer,
                                const EnergyContext& ctx,
                                const Shape& state_shape) {
  const EnergyLayer* layer_ptr = &layer;
  return [layer_ptr, ctx, state_shape](const Tensor& z, const std::vector<int64_t>& ids,
                                       Tensor* energy, Tensor* gradient) {
    NoGrad no_grad;
    EnergyContext selected = ctx.Select(ids);
    Var state(z.Reshape(WithBatch(z.dim(0), state_shape)));
    if (energy != nullptr) energy->CopyFrom(layer_ptr->SampleEnergies(state, selected).value());
    if (gradient != nullptr) {
      gradient->CopyFrom(layer_ptr->EnergyGrad(state, selected).value());
    }
    return true;
  };
}

Var UnrollUpdates(const EnergyLayer& layer, const Var& z0, const EnergyContext& ctx, int steps) {
  SP_CHECK(steps >= 0, "UnrollUpdates: steps must be >= 0, got ", steps);
  Var z = z0;
  for (int t = 0; t < steps; ++t) z = layer.Update(z, ctx);
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

void AddAttentionMask(const AttentionMask& mask,
                      bool causal,
                      int64_t batch,
                      int64_t heads,
                      int64_t queries,
                      int64_t keys,
                      DType dtype,
                      EnergyContext* ctx) {
  if (!causal && !mask.key_mask.defined() && !mask.additive.defined()) return;
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
  ctx->Set("mask", constant(Tensor::FromVector(shape, values, dtype)));
}

Var ApplyAttentionMask(const Var& scores, const EnergyContext& ctx) {
  if (!ctx.Has("mask")) return scores;
  return add(scores, ctx.Get("mask"));
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

EnergyTrace TraceUpdates(const EnergyLayer& layer,
                         const Tensor& z0,
                         const EnergyContext& ctx,
                         const EnergyTraceOptions& options) {
  std::string error;
  SP_CHECK(options.IsValid(&error), "TraceUpdates: ", error);
  NoGrad no_grad;
  const int64_t batch = z0.dim(0);
  const int64_t per_sample = z0.numel() / std::max<int64_t>(batch, 1);
  EnergyTrace trace;
  Var z(z0.Clone());
  trace.energies.push_back(layer.SampleEnergies(z, ctx).value().ToVector());
  for (int t = 0; t < options.max_steps; ++t) {
    Var next = layer.Update(z, ctx);
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
    trace.energies.push_back(layer.SampleEnergies(z, ctx).value().ToVector());
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
