// Module: a named collection of parameters and of child modules.
//
// A layer derives from Module, creates its parameters with RegisterParameter
// and its sub-layers with RegisterModule, and keeps the returned handles as
// members for use in its forward function:
//
//   class Linear : public Module {
//    public:
//     Linear(int64_t in, int64_t out, Rng& rng) {
//       weight_ = RegisterParameter("weight", init::XavierUniform({in, out},
//                                   DType::kFloat32, rng));
//       bias_ = RegisterParameter("bias", Tensor::Zeros({out}, DType::kFloat32));
//     }
//     std::string Name() const override { return "Linear"; }
//     Var Forward(const Var& x) const { return add(matmul(x, weight_), bias_); }
//    private:
//     Var weight_, bias_;
//   };
//
// The base class knows nothing about forward (layers have different
// signatures); it gives optimizers a flat parameter list, checkpoints a list
// of (dotted name, tensor) pairs, and people a printable tree.
//
// Names. Each registered name is one segment: non-empty, no '.', no
// whitespace. A parameter's full name joins the path of modules that leads to
// it with dots: "cells.0.attn.wq". Parameter and child names share one
// namespace per module, so "w" cannot be both.
//
// Order. named_parameters() lists a module's own parameters in registration
// order, then each child's, depth first, in registration order (as PyTorch
// does). The order is therefore deterministic and is the order in which
// optimizers see, and checkpoints store, the parameters.
//
// Sharing. A Var or a child module may be registered more than once (weight
// tying). The flat lists then contain it once, under the first name reached
// in the order above, so an optimizer never updates a tied weight twice and a
// checkpoint stores it once.
//
// Modules are not copyable: parameters are handles, and a copy that silently
// shared them would surprise. Hold modules by std::shared_ptr.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "framework/autograd.h"
#include "framework/tensor.h"

namespace stillpoint {

// (name, tensor) pairs in a meaningful order: what checkpoints store.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
// (name, parameter) pairs.
using NamedVars = std::vector<std::pair<std::string, Var>>;

struct LoadParametersOptions {
  // When true, every parameter of the module must be present in the source
  // and every source tensor must name a parameter. When false, parameters
  // without a source tensor keep their values and extra source tensors are
  // ignored. Shapes of matching names are checked either way.
  bool strict = true;
};

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The kind of module ("Linear", "HopfieldAttention"), shown by ToString.
  // Overrides may include the configuration: "Linear(4 -> 8)".
  virtual std::string Name() const { return "Module"; }

  // ---- registration

  // Adds a leaf Var holding `value` (no copy: the Var shares its storage)
  // and returns it. requires_grad = false registers a frozen parameter: it is
  // listed, saved and loaded, and optimizers should skip it.
  Var RegisterParameter(const std::string& name, Tensor value, bool requires_grad = true);
  // Registers an existing leaf Var (e.g. to tie it to another module's
  // parameter). Throws if it is not a leaf.
  Var RegisterParameter(const std::string& name, const Var& parameter);

  // Adds a child module and returns it with its own type, so a layer can
  // write `cell_ = RegisterModule("cell", std::make_shared<Cell>(...));`.
  template <typename M>
  std::shared_ptr<M> RegisterModule(const std::string& name, std::shared_ptr<M> module) {
    AddChild(name, module);
    return module;
  }

  // ---- parameters

  // Every parameter of this module and its descendants, each once (see
  // "Order" and "Sharing" above).
  VarList parameters() const;
  NamedVars named_parameters() const;
  // The parameters' values as (dotted name, tensor) pairs. The tensors share
  // storage with the parameters (Clone them to snapshot).
  NamedTensors NamedValues() const;
  // The total number of scalar values over parameters() (not the number of
  // tensors, which is parameters().size()).
  int64_t NumParameters() const;
  // Drops the accumulated gradient of every parameter.
  void ZeroGrad();

  // This module's own parameters and children, in registration order.
  const NamedVars& own_parameters() const { return own_parameters_; }
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const {
    return children_;
  }

  // Lookup by dotted name ("cells.0.attn.wq"). parameter() and submodule()
  // throw an Error naming the path and what exists at the point where it
  // fails; the Has* forms return false instead.
  Var parameter(const std::string& dotted_name) const;
  bool HasParameter(const std::string& dotted_name) const;
  std::shared_ptr<Module> submodule(const std::string& dotted_name) const;
  bool HasSubmodule(const std::string& dotted_name) const;

  // Copies values into the parameters, matched by dotted name (the format of
  // NamedValues and LoadTensors). Values are copied into the existing
  // storage, so Vars held elsewhere (optimizers) see the new values;
  // float32 <-> float64 is converted. All names and shapes are checked
  // before anything is copied, so on error the module is unchanged. The
  // error names the parameter and both shapes, or lists missing/unexpected
  // names.
  void LoadParameters(const NamedTensors& source, const LoadParametersOptions& options = {});

  // ---- modes

  // Sets training mode (true) or evaluation mode (false) on this module and
  // every descendant. Modules start in training mode.
  void Train(bool training = true);
  void Eval() { Train(false); }
  bool is_training() const { return training_; }

  // ---- printing

  // The tree: one line per module with its Name() and parameter count, one
  // line per parameter with its dtype and shape, indented by depth:
  //   Net (44 parameters)
  //     w: float32 [4, 8]
  //     cell: Cell (12 parameters)
  //       b: float32 [12] (frozen)
  std::string ToString() const;

 private:
  void AddChild(const std::string& name, std::shared_ptr<Module> module);
  void CheckNewName(const std::string& name, const char* what) const;
  // The module at a dotted path of child names ("" is this); null if absent.
  // On failure, *error (if given) says which segment is missing.
  const Module* FindModule(const std::string& dotted_path, std::string* error) const;

  NamedVars own_parameters_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

std::ostream& operator<<(std::ostream& out, const Module& module);

// A container of numbered children "0", "1", ... (for stacks of layers, whose
// parameters are then named "cells.0.w", "cells.1.w", ...).
class ModuleList : public Module {
 public:
  std::string Name() const override { return "ModuleList"; }

  // Registers module under the next index and returns it.
  template <typename M>
  std::shared_ptr<M> Append(std::shared_ptr<M> module) {
    return RegisterModule(std::to_string(size()), std::move(module));
  }

  int64_t size() const { return static_cast<int64_t>(children().size()); }
  // The child at index (0 <= index < size()).
  const std::shared_ptr<Module>& at(int64_t index) const;
  // The child at index as an M; throws if it is another kind of module.
  template <typename M>
  std::shared_ptr<M> Get(int64_t index) const {
    std::shared_ptr<M> typed = std::dynamic_pointer_cast<M>(at(index));
    SP_CHECK(typed != nullptr, "ModuleList::Get: element ", index, " is a ", at(index)->Name(),
             ", not the requested type");
    return typed;
  }
};

}  // namespace stillpoint
