#include "framework/autograd.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "framework/kernels/elementwise_kernels.h"
#include "framework/leaf_gradient_observer.h"
#include "framework/ops.h"

namespace stillpoint {
namespace {

thread_local bool t_grad_mode = true;

// The needed-input mask of the VJP that the sweep on this thread is running
// (null outside a sweep). Graphs are swept on the calling thread only.
thread_local const std::vector<char>* t_input_needed = nullptr;
thread_local const ScopedLeafGradientObserver::Observer* t_leaf_observer = nullptr;

using NodePtr = std::shared_ptr<detail::Node>;

// existing + increment: a gradient reaching a node (or leaf) it has
// reached before. Outside create_graph, when existing is a plain value held
// by the caller alone (its node and its storage: no other pending
// gradient, view or reference sees it), the sum is written into it, the
// same values as add() without a fresh tensor: a transformer layer's input
// and residual stream get two gradients each, and the in-place sum spares
// the allocation and a pass over memory (bench/RESULTS.md).
Var Accumulate(Var& existing, const Var& increment) {
  if (!existing.defined()) return increment;
  if (!GradModeEnabled() && existing.is_leaf() && !existing.requires_grad() &&
      existing.node_ptr().use_count() == 1 && existing.value().HoldsStorageAlone() &&
      existing.shape() == increment.shape() && existing.dtype() == increment.dtype()) {
    Tensor& sum = existing.mutable_value();
    DispatchDType(sum.dtype(), [&](auto zero) {
      using T = decltype(zero);
      T* out = sum.data<T>();
      internal::BinaryLoop(out, increment.value().data<T>(), out, sum.numel(),
                           [](T u, T v) { return u + v; });
    });
    return existing;
  }
  return add(existing, increment);
}

}  // namespace

// ------------------------------------------------------------------ Node

namespace detail {

Node::~Node() {
  std::vector<NodePtr> pending = std::move(inputs);
  if (grad.defined()) pending.push_back(grad.node_ptr());
  grad = Var();
  backward = nullptr;
  while (!pending.empty()) {
    NodePtr node = std::move(pending.back());
    pending.pop_back();
    if (node && node.use_count() == 1) {
      // We hold the last reference: move its inputs out before it dies so its
      // destructor has nothing to recurse into.
      for (auto& input : node->inputs) pending.push_back(std::move(input));
      node->inputs.clear();
      if (node->grad.defined()) pending.push_back(node->grad.node_ptr());
      node->grad = Var();
      node->backward = nullptr;
    }
  }
}

}  // namespace detail

// ------------------------------------------------------------------- Var

Var::Var(Tensor value, bool requires_grad) : node_(std::make_shared<detail::Node>()) {
  SP_CHECK(value.defined(), "Var: cannot wrap an empty tensor");
  node_->value = std::move(value);
  node_->requires_grad = requires_grad;
}

const Tensor& Var::value() const {
  SP_CHECK(defined(), "Var::value: the Var is undefined");
  return node_->value;
}

Tensor& Var::mutable_value() {
  SP_CHECK(defined(), "Var::mutable_value: the Var is undefined");
  return node_->value;
}

bool Var::requires_grad() const { return defined() && node_->requires_grad; }

void Var::set_requires_grad(bool requires_grad) {
  SP_CHECK(defined() && node_->is_leaf, "set_requires_grad: only leaves can change it (op '",
           op_name(), "')");
  node_->requires_grad = requires_grad;
}

bool Var::is_leaf() const { return defined() && node_->is_leaf; }

const char* Var::op_name() const { return defined() ? node_->op_name : "undefined"; }

const Var& Var::grad() const {
  static const Var kUndefined;
  return defined() ? node_->grad : kUndefined;
}

void Var::zero_grad() {
  if (defined()) node_->grad = Var();
}

void Var::set_grad(const Var& grad) {
  SP_CHECK(defined(), "set_grad: the Var is undefined");
  SP_CHECK(!grad.defined() || grad.shape() == shape(), "set_grad: gradient of shape ", grad.shape(),
           " for a value of shape ", shape());
  node_->grad = grad;
}

Var Var::detach() const { return Var(value(), false); }

// ------------------------------------------------------------- grad mode

bool GradModeEnabled() { return t_grad_mode; }
void SetGradModeEnabled(bool enabled) { t_grad_mode = enabled; }

NoGrad::NoGrad() : previous_(GradModeEnabled()) { SetGradModeEnabled(false); }
NoGrad::~NoGrad() { SetGradModeEnabled(previous_); }

GradModeGuard::GradModeGuard(bool enabled) : previous_(GradModeEnabled()) {
  SetGradModeEnabled(enabled);
}
GradModeGuard::~GradModeGuard() { SetGradModeEnabled(previous_); }

// Restores the previous mask on exit: a VJP may itself run a sweep.
ScopedInputGradMask::ScopedInputGradMask(const std::vector<char>* mask)
    : previous_(t_input_needed) {
  t_input_needed = mask;
}
ScopedInputGradMask::~ScopedInputGradMask() { t_input_needed = previous_; }

ScopedLeafGradientObserver::ScopedLeafGradientObserver(const Observer* observer)
    : previous_(t_leaf_observer) {
  t_leaf_observer = observer;
}
ScopedLeafGradientObserver::~ScopedLeafGradientObserver() { t_leaf_observer = previous_; }

bool InputGradNeeded(std::size_t index) {
  const std::vector<char>* mask = t_input_needed;
  if (mask == nullptr || index >= mask->size()) return true;
  return (*mask)[index] != 0;
}

bool WouldRecord(const VarList& inputs) {
  if (!GradModeEnabled()) return false;
  for (const Var& input : inputs) {
    if (input.requires_grad()) return true;
  }
  return false;
}

Var RecordOp(const char* op_name, Tensor value, VarList inputs, BackwardFn backward) {
  auto node = std::make_shared<detail::Node>();
  node->value = std::move(value);
  node->op_name = op_name;
  if (WouldRecord(inputs)) {
    node->requires_grad = true;
    node->is_leaf = false;
    node->inputs.reserve(inputs.size());
    for (const Var& input : inputs) node->inputs.push_back(input.node_ptr());
    node->backward = std::move(backward);
  }
  return Var(std::move(node));
}

// ---------------------------------------------------------------- engine

namespace {

// Post-order (inputs before outputs) over the nodes that require grad.
// Holds owning pointers, so nothing dies while the sweep releases the graph.
std::vector<NodePtr> TopologicalOrder(const VarList& outputs) {
  std::vector<NodePtr> order;
  std::unordered_set<detail::Node*> visited;
  // Each frame: node and the index of the next input to visit.
  std::vector<std::pair<NodePtr, std::size_t>> stack;
  for (const Var& output : outputs) {
    const NodePtr& root = output.node_ptr();
    if (!root || !root->requires_grad || visited.count(root.get())) continue;
    visited.insert(root.get());
    stack.emplace_back(root, 0);
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      if (next < node->inputs.size()) {
        const NodePtr& input = node->inputs[next++];
        if (input && input->requires_grad && !visited.count(input.get())) {
          visited.insert(input.get());
          stack.emplace_back(input, 0);
        }
        continue;
      }
      order.push_back(std::move(node));
      stack.pop_back();
    }
  }
  return order;
}

void CheckNotReleased(const detail::Node* node) {
  SP_CHECK(!node->released, "backward: the graph behind op '", node->op_name, "' (output shape ",
           node->value.shape(),
           ") was already freed by an earlier backward; pass retain_graph = true to the "
           "first backward to differentiate twice");
}

// The reverse sweep shared by grad() and backward(). When targets is null,
// every reached leaf that requires grad accumulates into its grad();
// otherwise the gradients of the target nodes are returned in `found`.
void Sweep(const VarList& outputs,
           const VarList& grad_outputs,
           const GradOptions& options,
           const std::vector<detail::Node*>* targets,
           std::unordered_map<detail::Node*, Var>* found) {
  SP_CHECK(grad_outputs.empty() || grad_outputs.size() == outputs.size(), "grad: ", outputs.size(),
           " outputs but ", grad_outputs.size(), " grad_outputs");
  std::vector<NodePtr> order = TopologicalOrder(outputs);

  // Which nodes lead to a target (only those need their VJPs evaluated).
  std::unordered_set<detail::Node*> needed;
  if (targets) {
    std::unordered_set<detail::Node*> target_set(targets->begin(), targets->end());
    for (const NodePtr& node : order) {  // inputs come before outputs
      bool need = target_set.count(node.get()) > 0;
      for (const auto& input : node->inputs) {
        if (input && needed.count(input.get())) need = true;
      }
      if (need) needed.insert(node.get());
    }
  }

  const bool retain = options.retain_graph || options.create_graph;
  GradModeGuard mode(options.create_graph);
  std::unordered_map<detail::Node*, Var> pending;
  std::vector<char> input_needed;
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    const Var& output = outputs[k];
    SP_CHECK(output.defined(), "grad: output ", k, " is undefined");
    if (!output.requires_grad()) continue;
    Var seed;
    if (grad_outputs.empty() || !grad_outputs[k].defined()) {
      SP_CHECK(output.numel() == 1, "backward: output of op '", output.op_name(), "' has shape ",
               output.shape(), "; a non-scalar output needs grad_outputs of the same shape");
      seed = Var(Tensor::Ones(output.shape(), output.dtype()));
    } else {
      seed = grad_outputs[k];
      SP_CHECK(seed.shape() == output.shape() && seed.dtype() == output.dtype(),
               "grad: grad_output of shape ", seed.shape(), " (", ToString(seed.dtype()),
               ") for output of op '", output.op_name(), "' with shape ", output.shape(), " (",
               ToString(output.dtype()), ")");
      if (!options.create_graph) seed = seed.detach();
    }
    pending[output.node()] = Accumulate(pending[output.node()], seed);
  }

  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const NodePtr& node_ptr = *it;
    detail::Node* node = node_ptr.get();
    if (targets && !needed.count(node)) continue;
    auto entry = pending.find(node);
    if (entry == pending.end()) continue;
    Var g = std::move(entry->second);
    pending.erase(entry);

    if (targets) {
      if (std::find(targets->begin(), targets->end(), node) != targets->end()) {
        (*found)[node] = g;
        if (options.stop_at_inputs) continue;
      }
    } else if (node->is_leaf) {
      node->grad = Accumulate(node->grad, g);
      if (t_leaf_observer != nullptr) (*t_leaf_observer)(Var{node_ptr});
    }
    if (node->is_leaf) continue;

    CheckNotReleased(node);
    VarList inputs;
    inputs.reserve(node->inputs.size());
    for (const auto& input : node->inputs) inputs.emplace_back(input);
    // Which input gradients this sweep will use (the VJP may skip the rest).
    input_needed.assign(inputs.size(), 0);
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      detail::Node* input = inputs[i].node();
      input_needed[i] = input && input->requires_grad && (!targets || needed.count(input) > 0);
    }
    // The node's own Var, so the VJP can reuse the output (exp, tanh, ...).
    Var self{node_ptr};
    VarList input_grads;
    {
      ScopedInputGradMask mask_scope(&input_needed);
      input_grads = node->backward(inputs, self, g);
    }
    SP_CHECK(input_grads.size() == inputs.size(), "backward of op '", node->op_name, "' returned ",
             input_grads.size(), " gradients for ", inputs.size(), " inputs");
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      detail::Node* input = inputs[i].node();
      if (!input || !input->requires_grad || !input_grads[i].defined()) continue;
      if (targets && !needed.count(input)) continue;
      SP_CHECK(input_grads[i].shape() == input->value.shape(), "backward of op '", node->op_name,
               "' produced a gradient of shape ", input_grads[i].shape(), " for input ", i,
               " of shape ", input->value.shape());
      pending[input] = Accumulate(pending[input], input_grads[i]);
    }
    if (!retain) {
      node->inputs.clear();
      node->backward = nullptr;
      node->released = true;
    }
  }
}

}  // namespace

VarList grad(const VarList& outputs,
             const VarList& inputs,
             const VarList& grad_outputs,
             const GradOptions& options) {
  std::vector<detail::Node*> targets;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    SP_CHECK(inputs[i].defined(), "grad: input ", i, " is undefined");
    targets.push_back(inputs[i].node());
  }
  std::unordered_map<detail::Node*, Var> found;
  Sweep(outputs, grad_outputs, options, &targets, &found);
  VarList result(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    auto it = found.find(inputs[i].node());
    if (it != found.end()) result[i] = it->second;
  }
  return result;
}

void backward(const Var& output, const Var& grad_output, const GradOptions& options) {
  Sweep({output}, grad_output.defined() ? VarList{grad_output} : VarList{}, options, nullptr,
        nullptr);
}

int64_t CountGraphNodes(const VarList& outputs) {
  return static_cast<int64_t>(TopologicalOrder(outputs).size());
}

}  // namespace stillpoint
