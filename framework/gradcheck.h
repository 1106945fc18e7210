// Gradient checking against central finite differences in float64.
//
//   auto r = CheckGradients(f, {x, w});
//   EXPECT_TRUE(r) << r;
//
// f maps the inputs to a Var of any shape; the check reduces it to the scalar
// L = <f(inputs), p> with a fixed random probe p, and compares dL/d(input)
// from backward with (L(x + h e_i) - L(x - h e_i)) / 2h for every entry i.
// An entry fails only when BOTH its absolute and its relative error exceed
// their tolerances (as dlib does). Inputs whose values sit within
// kink_margin of a declared kink (e.g. 0 for relu/abs) are skipped.
//
// A check in which every compared gradient (analytic and numeric) is
// exactly zero proves nothing; typically f reads values that are not its
// inputs, such as a module's own parameters (CheckGradients perturbs copies
// of the inputs only). It fails with a warning in the log, unless
// allow_all_zero. For a module's parameters use CheckParameterGradients:
//
//   auto r = CheckParameterGradients(layer, [&] { return sum(layer.Forward(x)); });
//   EXPECT_TRUE(r) << r;
#pragma once

#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

#include "framework/autograd.h"
#include "framework/module.h"

namespace stillpoint {

struct GradCheckOptions {
  // Central-difference step h.
  double step = 1e-6;
  // An entry fails when |analytic - numeric| > absolute_tolerance AND
  // |analytic - numeric| > relative_tolerance * max(|analytic|, |numeric|).
  double relative_tolerance = 1e-6;
  double absolute_tolerance = 1e-8;
  // Input values where f is not differentiable; entries closer than
  // kink_margin to one of them are not checked.
  std::vector<double> kinks;
  double kink_margin = 1e-3;
  // Seed of the probe vector p.
  uint64_t seed = 7;
  // How many of the worst entries the log lists.
  int max_reported = 5;
  // Pass a check whose compared gradients are all exactly zero (otherwise it
  // fails: see the note above).
  bool allow_all_zero = false;
};

struct GradCheckResult {
  bool ok = true;
  double max_abs_error = 0.0;
  double max_rel_error = 0.0;
  int64_t entries_checked = 0;
  int64_t entries_skipped = 0;
  // Every compared gradient, analytic and numeric, was exactly zero; the
  // log then opens with a warning.
  bool all_zero = false;
  // The worst entries: input, flat index, analytic, numeric.
  std::string log;
  explicit operator bool() const { return ok; }
};

std::ostream& operator<<(std::ostream& out, const GradCheckResult& result);

using VarFunction = std::function<Var(const VarList& inputs)>;

// First-order check of f at inputs (each a float64 tensor; requires_grad is
// set on copies, the caller's Vars are not modified).
GradCheckResult CheckGradients(const VarFunction& f, const VarList& inputs,
                               const GradCheckOptions& options = {});

// First-order check of a module's trainable parameters: compares
// backward's gradient of loss() with respect to each of module's parameters
// (named_parameters, float64) with central differences, perturbing the
// parameter values in place (restored after). loss must build its graph
// anew on every call and return a scalar. The module's gradients are zeroed
// before and after. Failures in the log are named "parameter[index]".
GradCheckResult CheckParameterGradients(Module& module, const std::function<Var()>& loss,
                                        const GradCheckOptions& options = {});

// Second-order check: with L as above and a fixed random v, checks the
// gradient of  x -> sum_i <dL/dx_i, v_i>  (computed with create_graph), i.e.
// Hessian-vector products, against finite differences of the first-order
// gradient.
GradCheckResult CheckSecondOrderGradients(const VarFunction& f, const VarList& inputs,
                                          const GradCheckOptions& options = {});

}  // namespace stillpoint
