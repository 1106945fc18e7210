#include "training/optimizer.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>

#include "framework/parallel.h"

namespace stillpoint {
namespace {

// Fewest parameter elements per task of the update loop: large enough to
// amortise the task, so small models update inline.
constexpr int64_t kParameterElementsPerTask = 4096;

bool EndsWith(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Asks for the cache lines of [p, p + n) ahead of their use.
template <typename T>
void Prefetch(const T* p, int64_t n, bool for_writing) {
  constexpr int64_t kPerLine = 64 / sizeof(T);
  for (int64_t i = 0; i < n; i += kPerLine) {
    if (for_writing) {
      __builtin_prefetch(p + i, 1);
    } else {
      __builtin_prefetch(p + i, 0);
    }
  }
}

// Calls update(lo, hi, g) for consecutive chunks [lo, hi) of [begin, end),
// with g the gradient's elements from lo. While a chunk is worked on, the
// next chunk of the gradient and of each array in `state` (the
// optimizer's, indexed like the parameter) is prefetched: the update reads
// each element of these arrays once per step, long after the forward and
// backward passes pushed them out of the caches, and its loop is too short
// and cut into too many small tensors for the hardware prefetchers to keep
// up (bench/RESULTS.md, historic notes, training/optimizer.cc).
template <typename T, typename Update>
void ForGradientChunks(const T* gradient,
                       std::initializer_list<const T*> state,
                       int64_t begin,
                       int64_t end,
                       Update&& update) {
  constexpr int64_t kChunk = 512;
  for (int64_t lo = begin; lo < end; lo += kChunk) {
    const int64_t n = std::min(kChunk, end - lo);
    const int64_t next = lo + n, next_n = std::min(kChunk, end - next);
    Prefetch(gradient + next, next_n, false);
    for (const T* array : state) Prefetch(array + next, next_n, true);
    update(lo, lo + n, gradient + lo);
  }
}

// The element loops take their coefficients by value and their arrays as
// pointer arguments: kept in registers, they let GCC vectorise the loop
// (std::sqrt included: this file is compiled with -fno-math-errno, see
// training/CMakeLists.txt); read through a lambda's captures instead, the
// loop stayed scalar (bench/RESULTS.md, historic notes). Each element goes
// through the same operations either way.

template <typename T>
struct SgdCoefficients {
  T learning_rate;
  T decay;  // L2 penalty: g + decay w
  T momentum;
  bool nesterov;
};

// w (and v, the momentum buffer, unless null) of n elements from gradient g.
template <typename T>
void SgdUpdate(const SgdCoefficients<T> c, const T* g, T* w, T* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    T d = g[i] + c.decay * w[i];
    if (v) {
      v[i] = c.momentum * v[i] + d;
      d = c.nesterov ? d + c.momentum * v[i] : v[i];
    }
    w[i] -= c.learning_rate * d;
  }
}

template <typename T>
struct AdamCoefficients {
  T beta1;
  T beta2;
  T decay;
  bool decoupled;  // AdamW: w <- w - learning_rate decay w; Adam: g + decay w
  T learning_rate;
  // The bias corrections folded into the step size and epsilon (one
  // multiply per element instead of two divisions): learning_rate /
  // (1 - beta1^t) and 1 / sqrt(1 - beta2^t).
  T step;
  T inv_sqrt_c2;
  T epsilon;
};

// w, m, v of n elements from gradient g.
template <typename T>
void AdamUpdate(const AdamCoefficients<T> c, const T* g, T* w, T* m, T* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    T gi = g[i];
    if (c.decoupled) {
      w[i] -= c.learning_rate * c.decay * w[i];
    } else {
      gi += c.decay * w[i];
    }
    m[i] = c.beta1 * m[i] + (T(1) - c.beta1) * gi;
    v[i] = c.beta2 * v[i] + (T(1) - c.beta2) * gi * gi;
    w[i] -= c.step * m[i] / (std::sqrt(v[i]) * c.inv_sqrt_c2 + c.epsilon);
  }
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
      const SgdCoefficients<T> c{static_cast<T>(options_.learning_rate),
                                 slot.decay ? static_cast<T>(options_.weight_decay) : T(0),
                                 static_cast<T>(options_.momentum), options_.nesterov};
      T* w = slot.parameter.mutable_value().data<T>();
      T* v = slot.first_moment.defined() ? slot.first_moment.data<T>() : nullptr;
      const std::initializer_list<const T*> state_with_momentum = {w, v}, state = {w};
      ForGradientChunks<T>(grad.data<T>(), v ? state_with_momentum : state, begin, end,
                           [&](int64_t lo, int64_t hi, const T* g) {
                             SgdUpdate(c, g, w + lo, v ? v + lo : nullptr, hi - lo);
                           });
    });
  }
};

class Adam : public Optimizer {
 public:
  // decoupled: AdamW's weight decay (w <- w - lr wd w), else an L2 term.
  Adam(const OptimizerOptions& options, const NamedVars& parameters, bool decoupled)
      : Optimizer(options, parameters), decoupled_(decoupled) {
    for (Slot& slot : slots_) {
      slot.first_moment = Tensor::Zeros(slot.parameter.shape(), slot.parameter.dtype());
      slot.second_moment = Tensor::Zeros(slot.parameter.shape(), slot.parameter.dtype());
    }
  }

 protected:
  void UpdateSegment(Slot& slot, const Tensor& grad, int64_t begin, int64_t end) override {
    const double t = static_cast<double>(step_count_);
    const double correction1 = 1.0 - std::pow(options_.beta1, t);
    const double correction2 = 1.0 - std::pow(options_.beta2, t);
    DispatchDType(slot.parameter.dtype(), [&](auto zero) {
      using T = decltype(zero);
      const AdamCoefficients<T> c{static_cast<T>(options_.beta1),
                                  static_cast<T>(options_.beta2),
                                  slot.decay ? static_cast<T>(options_.weight_decay) : T(0),
                                  decoupled_,
                                  static_cast<T>(options_.learning_rate),
                                  static_cast<T>(options_.learning_rate / correction1),
                                  static_cast<T>(1.0 / std::sqrt(correction2)),
                                  static_cast<T>(options_.epsilon)};
      T* w = slot.parameter.mutable_value().data<T>();
      T* m = slot.first_moment.data<T>();
      T* v = slot.second_moment.data<T>();
      ForGradientChunks<T>(grad.data<T>(), {w, m, v}, begin, end,
                           [&](int64_t lo, int64_t hi, const T* g) {
                             AdamUpdate(c, g, w + lo, m + lo, v + lo, hi - lo);
                           });
    });
  }

 private:
  bool decoupled_;
};

}  // namespace

Registry<OptimizerFactory>& OptimizerRegistry() {
  static Registry<OptimizerFactory>* registry = [] {
    auto* r = new Registry<OptimizerFactory>("optimizer");
    r->Register(
        "sgd",
        [](const OptimizerOptions& o, const NamedVars& p) { return std::make_unique<Sgd>(o, p); },
        "SGD with momentum and Nesterov momentum; weight decay as an L2 term");
    r->Register(
        "adam",
        [](const OptimizerOptions& o, const NamedVars& p) {
          return std::make_unique<Adam>(o, p, /*decoupled=*/false);
        },
        "Adam; weight decay as an L2 term of the gradient");
    r->Register(
        "adamw",
        [](const OptimizerOptions& o, const NamedVars& p) {
          return std::make_unique<Adam>(o, p, /*decoupled=*/true);
        },
        "Adam with decoupled weight decay");
    return r;
  }();
  return *registry;
}

const OptionFields<OptimizerOptions>& OptimizerOptions::Fields() {
  using O = OptimizerOptions;
  constexpr double kInf = std::numeric_limits<double>::max();
  // Decay rates below 1 (at 1 the moments never forget); the config's
  // bound, 1 - 1e-6, is the declared one.
  constexpr double kBelowOne = 0.999999;
  static const auto* fields =
      &(new OptionFields<O>)
           ->String("type", &O::type, "Optimizer (OptimizerRegistry, training/optimizer.h)")
           .Double("lr", &O::learning_rate, 0.0, kInf, "Base learning rate")
           .Double("momentum", &O::momentum, 0.0, kBelowOne, "sgd: momentum")
           .Bool("nesterov", &O::nesterov, "sgd: Nesterov momentum")
           .Double("beta1", &O::beta1, 0.0, kBelowOne, "adam/adamw: first-moment decay")
           .Double("beta2", &O::beta2, 0.0, kBelowOne, "adam/adamw: second-moment decay")
           .Double("epsilon", &O::epsilon, 1e-30, 1.0, "adam/adamw: denominator epsilon")
           .Double("weight_decay", &O::weight_decay, 0.0, kInf,
                   "Weight decay (decoupled for adamw, L2 for sgd and adam)")
           .StringList("no_weight_decay", &O::no_weight_decay_suffixes, {},
                       "Parameter-name suffixes exempt from weight decay");
  return *fields;
}

bool OptimizerOptions::IsValid(std::string* error) const {
  std::string problem = Fields().Check(*this);
  if (problem.empty() && !OptimizerRegistry().Has(type)) {
    problem = "type '" + type + "' is not a registered optimizer";
  }
  if (problem.empty() && nesterov && momentum <= 0) problem = "nesterov needs momentum > 0";
  if (!problem.empty() && error != nullptr) *error = problem;
  return problem.empty();
}

std::string OptimizerOptions::ToString() const { return Fields().Describe(*this) + "\n"; }

std::unique_ptr<Optimizer> Optimizer::Create(const OptimizerOptions& options,
                                             const NamedVars& parameters) {
  std::string error;
  SP_CHECK(options.IsValid(&error), "Optimizer: invalid options: ", error);
  return OptimizerRegistry().Get(options.type)(options, parameters);
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
  ++step_count_;
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
