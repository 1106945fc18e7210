// Optimizers: SGD (momentum, Nesterov), Adam and AdamW.
//
// Hyperparameters (OptimizerOptions) are kept apart from state (moment
// buffers). The update of every parameter runs as ONE parallel loop over a
// flat view of all parameters' elements: ParallelFor splits that range into
// tasks of about equal element counts (a task's range is cut at tensor
// boundaries into one update call per tensor), so a step costs one pass over
// memory and balances the threads whatever the parameter sizes. Every
// element gets the same arithmetic whichever task updates it, so the result
// is bitwise identical for any thread count.
//
//   auto optimizer = Optimizer::Create(options, model.named_parameters());
//   loss = ...; optimizer->ZeroGrad(); backward(loss); optimizer->Step();
//
// Optimizers are created by name from OptimizerRegistry() ("sgd", "adam",
// "adamw" built in): a new one is a subclass of Optimizer implementing
// UpdateSegment, registered under its name, which train.optimizer.type then
// accepts.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "framework/module.h"
#include "framework/option_fields.h"
#include "layers/name_registry.h"

namespace stillpoint {

struct OptimizerOptions {
  // A name registered in OptimizerRegistry().
  std::string type = "adamw";
  // Step size; schedules overwrite it each step through set_learning_rate.
  double learning_rate = 1e-3;
  // SGD: v <- momentum v + g; update -lr (g + momentum v) if nesterov else -lr v.
  double momentum = 0.0;
  bool nesterov = false;
  // Adam/AdamW moment decay rates and the denominator's epsilon:
  // update = -lr m_hat / (sqrt(v_hat) + epsilon).
  double beta1 = 0.9;
  double beta2 = 0.999;
  double epsilon = 1e-8;
  // SGD and Adam: L2 penalty added to the gradient (g + wd * w).
  // AdamW: decoupled decay, w <- w - lr * wd * w before the Adam update.
  double weight_decay = 0.01;
  // Parameters whose dotted name ends with one of these suffixes get no
  // weight decay (default: biases and norm gains/biases).
  std::vector<std::string> no_weight_decay_suffixes = {".bias", ".gain"};

  // train.optimizer.* (framework/option_fields.h; the config key of
  // learning_rate is lr).
  static const OptionFields<OptimizerOptions>& Fields();
  // The fields' ranges, type registered, nesterov only with momentum.
  bool IsValid(std::string* error) const;
  std::string ToString() const;
};

class Optimizer {
 public:
  // Parameters that do not require grad are ignored.
  static std::unique_ptr<Optimizer> Create(const OptimizerOptions& options,
                                           const NamedVars& parameters);
  virtual ~Optimizer() = default;

  // Applies one update from the parameters' accumulated gradients.
  // Parameters without a gradient are left unchanged (and their moments too).
  void Step();

  void ZeroGrad();

  double learning_rate() const { return options_.learning_rate; }
  void set_learning_rate(double learning_rate) { options_.learning_rate = learning_rate; }
  const OptimizerOptions& options() const { return options_; }
  int64_t step_count() const { return step_count_; }

  // The state as named tensors ("step", "<param>.m", "<param>.v", ...) for
  // checkpoints, and back. LoadState checks names and shapes.
  NamedTensors SaveState() const;
  void LoadState(const NamedTensors& state);

 protected:
  struct Slot {
    std::string name;
    Var parameter;
    bool decay = true;
    Tensor first_moment;   // SGD momentum buffer or Adam m (parameter dtype)
    Tensor second_moment;  // Adam v (undefined for SGD)
  };
  Optimizer(const OptimizerOptions& options, const NamedVars& parameters);
  // Updates elements [begin, end) of slot's parameter from its gradient.
  virtual void UpdateSegment(Slot& slot, const Tensor& grad, int64_t begin, int64_t end) = 0;

  OptimizerOptions options_;
  std::vector<Slot> slots_;
  int64_t step_count_ = 0;

 private:

  // All parameters' elements seen as one flat range: slot s holds
  // [slot_offsets_[s], slot_offsets_[s + 1]).
  std::vector<int64_t> slot_offsets_;
};

// Builds an optimizer of the given options over the parameters.
using OptimizerFactory = std::function<std::unique_ptr<Optimizer>(const OptimizerOptions& options,
                                                                  const NamedVars& parameters)>;
// The optimizers by name: "sgd", "adam" and "adamw" are built in.
Registry<OptimizerFactory>& OptimizerRegistry();

// Scales all gradients so their global L2 norm is at most max_norm; returns
// the norm before clipping (non-finite if any gradient is).
double ClipGradNorm(const VarList& parameters, double max_norm);
// The global L2 norm of the parameters' gradients.
double GradNorm(const VarList& parameters);

}  // namespace stillpoint
