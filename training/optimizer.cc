#include "training/optimizer.h"

#include <algorithm>
#include <cmath>

#include "framework/parallel.h"

namespace stillpoint {
namespace {

bool EndsWith(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

class Sgd : public Optimizer {
 public:
  Sgd(const OptimizerOptions& options, const NamedVars& parameters)
      : Optimizer(options, parameters) {
    if (options.momentum > 0) {
      for (Slot& slot : slots_) {
        slot.first_moment = Tensor::Zeros(slot.parameter.shape(), slot.parameter.dtype());
      }
    }
  }

 protected:
  void UpdateSegment(Slot& slot, const Tensor& grad, int64_t begin, int64_t end) override {
    DispatchDType(slot.parameter.dtype(), [&](auto zero) {
      using T = decltype(zero);
      T* w = slot.parameter.mutable_value().data<T>();
      const T* g = grad.data<T>();
      const T lr = static_cast<T>(options_.learning_rate);
      const T wd = slot.decay ? static_cast<T>(options_.weight_decay) : T(0);
      const T mu = static_cast<T>(options_.momentum);
      T* v = slot.first_moment.defined() ? slot.first_moment.data<T>() : nullptr;
      for (int64_t i = begin; i < end; ++i) {
        T d = g[i] + wd * w[i];
        if (v) {
          v[i] = mu * v[i] + d;
          d = options_.nesterov ? d + mu * v[i] : v[i];
        }
        w[i] -= lr * d;
      }
    });
  }
};

class Adam : public Optimizer {
 public:
  Adam(const OptimizerOptions& options, const NamedVars& parameters)
      : Optimizer(options, parameters) {
    for (Slot& slot : slots_) {
      slot.first_moment = Tensor::Zeros(slot.parameter.shape(), slot.parameter.dtype());
      slot.second_moment = Tensor::Zeros(slot.parameter.shape(), slot.parameter.dtype());
    }
  }

 protected:
  void UpdateSegment(Slot& slot, const Tensor& grad, int64_t begin, int64_t end) override {
    const bool decoupled = options_.type == OptimizerType::kAdamW;
    const double t = static_cast<double>(step_count_);
    // Bias corrections folded into the step size and epsilon (one multiply
    // per element instead of two divisions).
    const double correction1 = 1.0 - std::pow(options_.beta1, t);
    const double correction2 = 1.0 - std::pow(options_.beta2, t);
    DispatchDType(slot.parameter.dtype(), [&](auto zero) {
      using T = decltype(zero);
      T* w = slot.parameter.mutable_value().data<T>();
      const T* g = grad.data<T>();
      T* m = slot.first_moment.data<T>();
      T* v = slot.second_moment.data<T>();
      const T b1 = static_cast<T>(options_.beta1), b2 = static_cast<T>(options_.beta2);
      const T wd = slot.decay ? static_cast<T>(options_.weight_decay) : T(0);
      const T lr = static_cast<T>(options_.learning_rate);
      const T step = static_cast<T>(options_.learning_rate / correction1);
      const T inv_sqrt_c2 = static_cast<T>(1.0 / std::sqrt(correction2));
      const T eps = static_cast<T>(options_.epsilon);
      // Vectorises (std::sqrt included: this file is compiled with
      // -fno-math-errno, see training/CMakeLists.txt); each element goes
      // through the same operations either way.
      for (int64_t i = begin; i < end; ++i) {
        T gi = g[i];
        if (decoupled) {
          w[i] -= lr * wd * w[i];
        } else {
          gi += wd * w[i];
        }
        m[i] = b1 * m[i] + (T(1) - b1) * gi;
        v[i] = b2 * v[i] + (T(1) - b2) * gi * gi;
        w[i] -= step * m[i] / (std::sqrt(v[i]) * inv_sqrt_c2 + eps);
      }
    });
  }
};

}  // namespace

const char* ToString(OptimizerType type) {
  switch (type) {
    case OptimizerType::kSgd:
      return "sgd";
    case OptimizerType::kAdam:
      return "adam";
    case OptimizerType::kAdamW:
      return "adamw";
  }
  return "unknown";
}

bool StringToOptimizerType(const std::string& text, OptimizerType* type) {
  for (OptimizerType t : {OptimizerType::kSgd, OptimizerType::kAdam, OptimizerType::kAdamW}) {
    if (text == ToString(t)) {
      *type = t;
      return true;
    }
  }
  return false;
}

bool OptimizerOptions::IsValid(std::string* error) const {
  auto fail = [&](const std::string& message) {
    if (error) *error = message;
    return false;
  };
  if (!(learning_rate >= 0)) return fail("learning_rate must be >= 0");
  if (!(momentum >= 0 && momentum < 1)) return fail("momentum must be in [0, 1)");
  if (nesterov && momentum <= 0) return fail("nesterov needs momentum > 0");
  if (!(beta1 >= 0 && beta1 < 1)) return fail("beta1 must be in [0, 1)");
  if (!(beta2 >= 0 && beta2 < 1)) return fail("beta2 must be in [0, 1)");
  if (!(epsilon > 0)) return fail("epsilon must be > 0");
  if (!(weight_decay >= 0)) return fail("weight_decay must be >= 0");
  return true;
}

std::unique_ptr<Optimizer> Optimizer::Create(const OptimizerOptions& options,
                                             const NamedVars& parameters) {
  std::string error;
  SP_CHECK(options.IsValid(&error), "Optimizer: invalid options: ", error);
  switch (options.type) {
    case OptimizerType::kSgd:
      return std::unique_ptr<Optimizer>(new Sgd(options, parameters));
    case OptimizerType::kAdam:
    case OptimizerType::kAdamW:
      return std::unique_ptr<Optimizer>(new Adam(options, parameters));
  }
  return nullptr;
}

Optimizer::Optimizer(const OptimizerOptions& options, const NamedVars& parameters)
    : options_(options) {
  for (const auto& [name, parameter] : parameters) {
    if (!parameter.requires_grad()) continue;
    Slot slot;
    slot.name = name;
    slot.parameter = parameter;
    for (const std::string& suffix : options.no_weight_decay_suffixes) {
      if (EndsWith(name, suffix)) slot.decay = false;
    }
    slots_.push_back(std::move(slot));
  }
  slot_offsets_.push_back(0);
  for (const Slot& slot : slots_) {
    slot_offsets_.push_back(slot_offsets_.back() + slot.parameter.numel());
  }
}

void Optimizer::Step() {
  ++step_count_;
  std::vector<Tensor> grads(slots_.size());
  for (std::size_t s = 0; s < slots_.size(); ++s) {
    const Var& g = slots_[s].parameter.grad();
    if (g.defined()) {
      SP_CHECK(g.dtype() == slots_[s].parameter.dtype(), "Optimizer::Step: gradient of '",
               slots_[s].name, "' is ", ToString(g.dtype()), " but the parameter is ",
               ToString(slots_[s].parameter.dtype()));
      grads[s] = g.value();
    }
  }
  // Tasks split the flat element range of all parameters, so every task gets
  // about the same number of elements whatever the parameter sizes. Each
  // element is updated by one task with the same arithmetic, so the result
  // does not depend on the split.
  ParallelForSegments(slot_offsets_, kParameterElementsPerTask,
                      [&](std::size_t s, int64_t begin, int64_t end) {
                        if (grads[s].defined()) UpdateSegment(slots_[s], grads[s], begin, end);
                      });
}

void Optimizer::ZeroGrad() {
  for (Slot& slot : slots_) slot.parameter.zero_grad();
}

NamedTensors Optimizer::SaveState() const {
  NamedTensors state;
  state.emplace_back("step", Tensor::Scalar(static_cast<double>(step_count_), DType::kFloat64));
  for (const Slot& slot : slots_) {
    if (slot.first_moment.defined()) state.emplace_back(slot.name + ".m", slot.first_moment);
    if (slot.second_moment.defined()) state.emplace_back(slot.name + ".v", slot.second_moment);
  }
  return state;
}

void Optimizer::LoadState(const NamedTensors& state) {
  auto find = [&](const std::string& name) -> const Tensor* {
    for (const auto& [key, tensor] : state) {
      if (key == name) return &tensor;
    }
    return nullptr;
  };
  const Tensor* step = find("step");
  SP_CHECK(step != nullptr, "Optimizer::LoadState: the state has no 'step' entry");
  auto load = [&](const std::string& name, Tensor& target) {
    if (!target.defined()) return;
    const Tensor* source = find(name);
    SP_CHECK(source != nullptr, "Optimizer::LoadState: missing entry '", name, "'");
    SP_CHECK(source->shape() == target.shape(), "Optimizer::LoadState: entry '", name,
             "' has shape ", source->shape(), " but the parameter needs ", target.shape());
    target.CopyFrom(*source);
  };
  // Check everything before changing anything.
  for (Slot& slot : slots_) {
    for (const auto& [suffix, tensor] :
         {std::pair<std::string, Tensor*>{".m", &slot.first_moment},
          std::pair<std::string, Tensor*>{".v", &slot.second_moment}}) {
      if (!tensor->defined()) continue;
      const Tensor* source = find(slot.name + suffix);
      SP_CHECK(source != nullptr, "Optimizer::LoadState: missing entry '", slot.name + suffix, "'");
      SP_CHECK(source->shape() == tensor->shape(), "Optimizer::LoadState: entry '",
               slot.name + suffix, "' has shape ", source->shape(), " but the parameter needs ",
               tensor->shape());
    }
  }
  for (Slot& slot : slots_) {
    load(slot.name + ".m", slot.first_moment);
    load(slot.name + ".v", slot.second_moment);
  }
  step_count_ = static_cast<int64_t>(step->item());
}

double GradNorm(const VarList& parameters) {
  double total = 0.0;
  for (const Var& p : parameters) {
    if (!p.has_grad()) continue;
    const Tensor& g = p.grad().value();
    DispatchDType(g.dtype(), [&](auto zero) {
      using T = decltype(zero);
      const T* data = g.data<T>();
      for (int64_t i = 0; i < g.numel(); ++i) total += double(data[i]) * double(data[i]);
    });
  }
  return std::sqrt(total);
}

double ClipGradNorm(const VarList& parameters, double max_norm) {
  SP_CHECK(max_norm > 0, "ClipGradNorm: max_norm must be positive, got ", max_norm);
  const double norm = GradNorm(parameters);
  if (!std::isfinite(norm) || norm <= max_norm) return norm;
  const double scale = max_norm / norm;
  for (const Var& p : parameters) {
    if (!p.has_grad()) continue;
    // A new tensor: gradient tensors may be shared between parameters.
    Tensor scaled = p.grad().value().Clone();
    DispatchDType(scaled.dtype(), [&](auto zero) {
      using T = decltype(zero);
      T* data = scaled.data<T>();
      for (int64_t i = 0; i < scaled.numel(); ++i) data[i] *= static_cast<T>(scale);
    });
    Var handle = p;  // shares the node
    handle.set_grad(Var(scaled));
  }
  return norm;
}

}  // namespace stillpoint
