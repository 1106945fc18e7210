// Test helper: gradient checks of a module's forward with respect to its
// inputs AND its parameters.
//
// CheckGradients differentiates with respect to the Vars it is given, but a
// module's forward reads its own parameter Vars. CheckModuleGradients hands
// the checker copies of the parameters, points each parameter at its copy's
// storage (so finite-difference perturbations reach the forward), and wraps
// the forward in a node whose VJP differentiates through the module's graph
// and returns the parameters' gradients as the copies' gradients.
#pragma once

#include <cstddef>
#include <functional>

#include "framework/autograd.h"
#include "framework/gradcheck.h"
#include "framework/module.h"
#include "framework/ops.h"

namespace stillpoint {
namespace testing_support {

inline GradCheckResult CheckModuleGradients(Module& module,
                                            const std::function<Var(const VarList&)>& forward,
                                            const VarList& inputs,
                                            const GradCheckOptions& options = {}) {
  VarList parameters = module.parameters();
  std::vector<Tensor> originals;
  VarList all = inputs;
  for (const Var& p : parameters) {
    originals.push_back(p.value());
    all.push_back(Var(p.value().Clone()));
  }
  const std::size_t num_inputs = inputs.size();
  VarFunction f = [&](const VarList& args) -> Var {
    for (std::size_t k = 0; k < parameters.size(); ++k) {
      parameters[k].mutable_value() = args[num_inputs + k].value();
    }
    const VarList in(args.begin(), args.begin() + num_inputs);
    if (!GradModeEnabled()) return forward(in);
    // Fresh leaves for the inputs, so the inner graph is separate from the
    // checker's and its gradient is returned exactly once (by the wrapper).
    VarList inner_inputs;
    for (const Var& x : in) inner_inputs.push_back(Var(x.value(), true));
    const Var out = forward(inner_inputs);
    VarList targets = inner_inputs;
    targets.insert(targets.end(), parameters.begin(), parameters.end());
    return RecordOp("module_gradcheck", out.value(), args,
                    [out, targets](const VarList&, const Var&, const Var& g) {
                      return grad({out}, targets, {g});
                    });
  };
  GradCheckResult result = CheckGradients(f, all, options);
  for (std::size_t k = 0; k < parameters.size(); ++k) {
    parameters[k].mutable_value() = originals[k];
  }
  return result;
}

}  // namespace testing_support
}  // namespace stillpoint
