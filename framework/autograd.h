// Reverse-mode automatic differentiation.
//
// A Var is a handle to a node of the computation graph: a value (Tensor), and
// for results of ops that need gradients, the op's inputs and its
// vector-Jacobian product (VJP). Ops are free functions (framework/ops.h);
// each computes its value and records a BackwardFn with RecordOp.
//
// The VJP contract (as in dlib): a BackwardFn receives the op's inputs, its
// output and the gradient dL/d(output), and returns, for every input, the
// gradient dL/d(input) = J^T grad_output, shaped like that input (an
// undefined Var where an input gets no gradient). The engine ADDS these into
// the inputs' accumulators; a BackwardFn never mutates anything.
//
// VJPs are written with the same differentiable ops. With create_graph =
// false (the default) the engine runs them with the tape off, so they record
// nothing; with create_graph = true the gradients are themselves Vars on the
// tape, which gives Hessian-vector products and gradients of gradient norms.
//
// Backward is one iterative topological sort and a reverse sweep (no
// recursion: graphs may be hundreds of thousands of nodes deep). Graph
// recording happens on the calling thread only; ParallelFor is used inside
// kernels, never to build graphs.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "framework/tensor.h"

namespace stillpoint {

class Var;
using VarList = std::vector<Var>;

// Returns one gradient per input (see the VJP contract above).
using BackwardFn =
    std::function<VarList(const VarList& inputs, const Var& output, const Var& grad_output)>;

namespace detail {
struct Node;
}

class Var {
 public:
  // An undefined Var (defined() == false): "no gradient" in VJP results.
  Var() = default;
  // A leaf holding value. Leaves with requires_grad accumulate gradients in
  // grad() during backward().
  explicit Var(Tensor value, bool requires_grad = false);

  bool defined() const { return node_ != nullptr; }
  const Tensor& value() const;
  // For in-place updates of leaves (optimizers, initialisers). Changing the
  // value of a Var that a recorded graph still uses gives wrong gradients.
  Tensor& mutable_value();

  const Shape& shape() const { return value().shape(); }
  int rank() const { return value().rank(); }
  int64_t dim(int axis) const { return value().dim(axis); }
  int64_t numel() const { return value().numel(); }
  DType dtype() const { return value().dtype(); }
  double item() const { return value().item(); }

  bool requires_grad() const;
  // Leaves only: whether backward() should compute this leaf's gradient.
  void set_requires_grad(bool requires_grad);
  bool is_leaf() const;
  // The op that produced this Var ("leaf" for leaves).
  const char* op_name() const;

  // The gradient accumulated by backward() (undefined before). With
  // create_graph it is itself on the tape. Without, a later backward adds
  // into its storage when nothing else holds it; a copy of the Var or of its
  // tensor that you keep is never changed.
  const Var& grad() const;
  bool has_grad() const { return grad().defined(); }
  void zero_grad();
  // Replaces the accumulated gradient (used by optimizers' clipping and by
  // implicit layers); shape must match.
  void set_grad(const Var& grad);

  // The same value, cut from the graph: a leaf that does not require grad.
  Var detach() const;

  detail::Node* node() const { return node_.get(); }
  const std::shared_ptr<detail::Node>& node_ptr() const { return node_; }
  explicit Var(std::shared_ptr<detail::Node> node) : node_(std::move(node)) {}

 private:
  std::shared_ptr<detail::Node> node_;
};

// Whether ops record graph nodes. On by default, and per thread: one thread
// can record a graph while another runs a solve or a backward pass with the
// tape off (the shards of a data-parallel step, training/data_parallel.h).
// The tasks of a ParallelFor run with the mode of the thread that called it.
bool GradModeEnabled();
void SetGradModeEnabled(bool enabled);

// Turns the tape off for its lifetime: ops return plain values with no graph.
class NoGrad {
 public:
  NoGrad();
  ~NoGrad();
  NoGrad(const NoGrad&) = delete;
  NoGrad& operator=(const NoGrad&) = delete;

 private:
  bool previous_;
};

// Sets grad mode to `enabled` for its lifetime.
class GradModeGuard {
 public:
  explicit GradModeGuard(bool enabled);
  ~GradModeGuard();
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool previous_;
};

// Creates the result of an op: a Var holding value that, when grad mode is on
// and some input requires grad, remembers inputs and backward. Otherwise the
// result is a constant leaf and backward is dropped (so NoGrad leaves no
// graph). op_name must be a string literal.
Var RecordOp(const char* op_name, Tensor value, VarList inputs, BackwardFn backward);
// Whether RecordOp with these inputs records a node: grad mode is on and
// some input requires grad. An op that computes extra values only for its
// backward (a derivative, attention probabilities) asks this first.
bool WouldRecord(const VarList& inputs);

// Inside a BackwardFn called by a backward sweep: whether the sweep will use
// the gradient of the op's input `index`. False when that input does not
// require grad, or when grad() was asked for inputs that it does not lead to
// (an adjoint iteration asks for d/dz only, so a matmul VJP can skip the
// weight gradient). A VJP may return an undefined Var for such an input
// instead of computing it; the results of the sweep do not change. Outside a
// sweep it returns true (a VJP called directly computes everything).
bool InputGradNeeded(std::size_t index);

// Makes InputGradNeeded(i) return mask[i] on this thread for its lifetime
// (the sweep sets one around every VJP; tests use it to call a VJP
// directly). mask must outlive the scope.
class ScopedInputGradMask {
 public:
  explicit ScopedInputGradMask(const std::vector<char>* mask);
  ~ScopedInputGradMask();
  ScopedInputGradMask(const ScopedInputGradMask&) = delete;
  ScopedInputGradMask& operator=(const ScopedInputGradMask&) = delete;

 private:
  const std::vector<char>* previous_;
};

// What a VJP asks before computing the gradient of input `index`: it
// requires grad and the running sweep needs it.
inline bool WantsInputGrad(const VarList& inputs, std::size_t index) {
  return inputs[index].requires_grad() && InputGradNeeded(index);
}

struct GradOptions {
  // Keep the graph after the sweep so it can be differentiated again. When
  // false, the sweep frees every op's saved inputs and VJP; a second backward
  // through them is an error. create_graph implies retain_graph.
  bool retain_graph = false;
  // Record the gradient computation itself (for second derivatives).
  bool create_graph = false;
  // grad() only: treat the inputs as independent variables. The sweep stops
  // at each input, so an input computed from another one (keys computed from
  // a weight, both listed) passes nothing on to it: each gets the partial
  // derivative along the paths that avoid the other inputs, and pushing
  // every input's gradient on through its own history counts each path once.
  bool stop_at_inputs = false;
};

// Gradients of sum_k <outputs[k], grad_outputs[k]> with respect to inputs.
// grad_outputs may be empty when every output is a one-element tensor (then
// each seed is 1). Inputs that the outputs do not depend on get an
// undefined Var. Does not touch any Var's grad().
VarList grad(const VarList& outputs,
             const VarList& inputs,
             const VarList& grad_outputs = {},
             const GradOptions& options = {});

// Accumulates d(output)/d(leaf) into grad() of every leaf that requires grad
// and that output depends on. output must hold one element unless
// grad_output is given.
void backward(const Var& output, const Var& grad_output = Var(), const GradOptions& options = {});

// Number of graph nodes reachable from outputs (for tests and diagnostics).
int64_t CountGraphNodes(const VarList& outputs);

namespace detail {

struct Node {
  Tensor value;
  bool requires_grad = false;
  bool is_leaf = true;
  bool released = false;  // the graph behind it was freed by a backward sweep
  const char* op_name = "leaf";
  std::vector<std::shared_ptr<Node>> inputs;
  BackwardFn backward;
  Var grad;

  Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  // Releases long chains of inputs iteratively, so destroying a graph
  // 10^5 nodes deep does not overflow the stack.
  ~Node();
};

}  // namespace detail
}  // namespace stillpoint
