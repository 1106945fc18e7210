#include "framework/gradcheck.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <ostream>
#include <sstream>

#include "framework/ops.h"
#include "framework/random.h"

namespace stillpoint {
namespace {

struct EntryError {
  std::size_t input;
  int64_t index;
  double analytic;
  double numeric;
  double abs_error;
  double rel_error;
};

VarList FreshLeaves(const VarList& inputs) {
  VarList leaves;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    SP_CHECK(inputs[i].defined(), "CheckGradients: input ", i, " is undefined");
    SP_CHECK(inputs[i].dtype() == DType::kFloat64, "CheckGradients: input ", i, " is ",
             ToString(inputs[i].dtype()), "; gradient checks run in float64");
    leaves.emplace_back(inputs[i].value().Clone(), true);
  }
  return leaves;
}

bool NearKink(double value, const GradCheckOptions& options) {
  for (double kink : options.kinks) {
    if (std::abs(value - kink) < options.kink_margin) return true;
  }
  return false;
}

}  // namespace

std::ostream& operator<<(std::ostream& out, const GradCheckResult& result) {
  out << (result.ok ? "gradient check passed" : "gradient check FAILED") << ": "
      << result.entries_checked << " entries checked, " << result.entries_skipped
      << " skipped near kinks, max abs error " << result.max_abs_error << ", max rel error "
      << result.max_rel_error;
  if (!result.log.empty()) out << "\n" << result.log;
  return out;
}

namespace {

// Sets result->all_zero when every compared gradient is exactly zero, and
// then fails the check (unless allowed) with a warning at the top of log.
void MarkAllZero(const std::vector<EntryError>& errors, const GradCheckOptions& options,
                 const std::string& likely_cause, GradCheckResult* result, std::ostream& log) {
  if (errors.empty()) return;
  for (const EntryError& e : errors) {
    if (e.analytic != 0.0 || e.numeric != 0.0) return;
  }
  result->all_zero = true;
  log << "  warning: every compared gradient (" << errors.size()
      << " entries) is exactly zero, so the check proves nothing; likely cause: " << likely_cause
      << (options.allow_all_zero ? " (allowed: allow_all_zero)" : "; failing (allow_all_zero "
                                                                   "passes it)")
      << "\n";
  if (!options.allow_all_zero) result->ok = false;
}

}  // namespace

GradCheckResult CheckGradients(const VarFunction& f, const VarList& inputs,
                               const GradCheckOptions& options) {
  VarList leaves = FreshLeaves(inputs);
  Rng rng(options.seed);

  // The probe p fixes the scalar L = <f(x), p>.
  Tensor probe;
  auto objective = [&](const VarList& args) -> Var {
    Var out = f(args);
    SP_CHECK(out.defined() && out.dtype() == DType::kFloat64,
             "CheckGradients: f must return a float64 Var");
    if (!probe.defined()) probe = RandomNormal(out.shape(), 0.0, 1.0, DType::kFloat64, rng);
    SP_CHECK(out.shape() == probe.shape(), "CheckGradients: f changed its output shape from ",
             probe.shape(), " to ", out.shape());
    return sum(mul(out, constant(probe)));
  };

  Var loss = objective(leaves);
  VarList analytic = grad({loss}, leaves);

  GradCheckResult result;
  std::vector<EntryError> errors;
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    Tensor& value = leaves[i].mutable_value();
    for (int64_t j = 0; j < value.numel(); ++j) {
      const double original = value.at(j);
      if (NearKink(original, options)) {
        result.entries_skipped++;
        continue;
      }
      double plus, minus;
      {
        NoGrad no_grad;
        value.set(j, original + options.step);
        plus = objective(leaves).item();
        value.set(j, original - options.step);
        minus = objective(leaves).item();
        value.set(j, original);
      }
      const double numeric = (plus - minus) / (2.0 * options.step);
      const double a = analytic[i].defined() ? analytic[i].value().at(j) : 0.0;
      const double abs_error = std::abs(a - numeric);
      const double scale = std::max(std::abs(a), std::abs(numeric));
      const double rel_error = scale > 0 ? abs_error / scale : 0.0;
      result.entries_checked++;
      result.max_abs_error = std::max(result.max_abs_error, abs_error);
      const bool fails = abs_error > options.absolute_tolerance &&
                         abs_error > options.relative_tolerance * scale;
      if (abs_error > options.absolute_tolerance) {
        result.max_rel_error = std::max(result.max_rel_error, rel_error);
      }
      if (fails) result.ok = false;
      errors.push_back({i, j, a, numeric, abs_error, rel_error});
    }
  }

  std::sort(errors.begin(), errors.end(),
            [](const EntryError& a, const EntryError& b) { return a.abs_error > b.abs_error; });
  std::ostringstream log;
  log << std::setprecision(10);
  MarkAllZero(errors, options, "f reads values that are not its inputs (a module's own "
              "parameters? use CheckParameterGradients)", &result, log);
  const std::size_t shown = std::min<std::size_t>(errors.size(), options.max_reported);
  for (std::size_t k = 0; k < shown; ++k) {
    const EntryError& e = errors[k];
    log << "  input " << e.input << " " << leaves[e.input].shape() << " entry " << e.index
        << ": analytic " << e.analytic << ", numeric " << e.numeric << ", abs err "
        << e.abs_error << ", rel err " << e.rel_error << "\n";
  }
  result.log = log.str();
  return result;
}

GradCheckResult CheckSecondOrderGradients(const VarFunction& f, const VarList& inputs,
                                          const GradCheckOptions& options) {
  Rng rng(options.seed + 1);
  Tensor probe;
  VarList directions;
  for (const Var& input : inputs) {
    directions.push_back(
        constant(RandomNormal(input.shape(), 0.0, 1.0, DType::kFloat64, rng)));
  }
  // x -> sum_i <dL/dx_i, v_i>, with L = <f(x), p>.
  VarFunction directional = [&](const VarList& args) -> Var {
    Var out = f(args);
    if (!probe.defined()) probe = RandomNormal(out.shape(), 0.0, 1.0, DType::kFloat64, rng);
    Var loss = sum(mul(out, constant(probe)));
    // Under NoGrad (the finite-difference evaluations) the inner gradient is
    // still needed: turn recording on locally.
    GradModeGuard recording(true);
    VarList args_tracked;
    for (const Var& a : args) args_tracked.push_back(a);
    VarList grads;
    Var recorded_loss = loss;
    if (!loss.requires_grad()) {
      // Re-evaluate with fresh leaves so the inner gradient exists.
      args_tracked.clear();
      for (const Var& a : args) args_tracked.emplace_back(a.value(), true);
      Var again = f(args_tracked);
      recorded_loss = sum(mul(again, constant(probe)));
    }
    grads = grad({recorded_loss}, args_tracked, {}, {.retain_graph = true, .create_graph = true});
    Var total = scalar_like(args[0], 0.0);
    for (std::size_t i = 0; i < grads.size(); ++i) {
      if (grads[i].defined()) total = add(total, sum(mul(grads[i], directions[i])));
    }
    return total;
  };
  return CheckGradients(directional, inputs, options);
}

GradCheckResult CheckParameterGradients(Module& module, const std::function<Var()>& loss,
                                        const GradCheckOptions& options) {
  module.ZeroGrad();
  {
    GradModeGuard recording(true);
    Var value = loss();
    SP_CHECK(value.defined() && value.numel() == 1,
             "CheckParameterGradients: loss must return a scalar, got ",
             value.defined() ? value.shape().ToString() : std::string("(undefined)"));
    backward(value);
  }
  GradCheckResult result;
  std::vector<EntryError> errors;
  std::vector<std::string> names;
  for (auto& [name, parameter] : module.named_parameters()) {
    if (!parameter.requires_grad()) continue;
    SP_CHECK(parameter.dtype() == DType::kFloat64, "CheckParameterGradients: parameter ", name,
             " is ", ToString(parameter.dtype()), "; the check needs float64 parameters");
    const Tensor analytic = parameter.has_grad()
                                ? parameter.grad().value().Clone()
                                : Tensor::Zeros(parameter.shape(), DType::kFloat64);
    Tensor& values = parameter.mutable_value();
    names.push_back(name);
    for (int64_t i = 0; i < values.numel(); ++i) {
      const double original = values.at(i);
      if (NearKink(original, options)) {
        result.entries_skipped++;
        continue;
      }
      double plus, minus;
      {
        NoGrad no_grad;
        values.set(i, original + options.step);
        plus = loss().item();
        values.set(i, original - options.step);
        minus = loss().item();
        values.set(i, original);
      }
      const double numeric = (plus - minus) / (2.0 * options.step);
      const double a = analytic.at(i);
      const double abs_error = std::abs(a - numeric);
      const double scale = std::max(std::abs(a), std::abs(numeric));
      const double rel_error = scale > 0 ? abs_error / scale : 0.0;
      result.entries_checked++;
      result.max_abs_error = std::max(result.max_abs_error, abs_error);
      if (abs_error > options.absolute_tolerance) {
        result.max_rel_error = std::max(result.max_rel_error, rel_error);
      }
      if (abs_error > options.absolute_tolerance &&
          abs_error > options.relative_tolerance * scale) {
        result.ok = false;
      }
      errors.push_back({names.size() - 1, i, a, numeric, abs_error, rel_error});
    }
  }
  module.ZeroGrad();
  std::sort(errors.begin(), errors.end(),
            [](const EntryError& a, const EntryError& b) { return a.abs_error > b.abs_error; });
  std::ostringstream log;
  log << std::setprecision(10);
  MarkAllZero(errors, options,
              "loss does not depend on the module's parameters (is it the module whose "
              "parameters the loss reads?)",
              &result, log);
  const std::size_t shown = std::min<std::size_t>(errors.size(), options.max_reported);
  for (std::size_t k = 0; k < shown; ++k) {
    const EntryError& e = errors[k];
    log << "  " << names[e.input] << "[" << e.index << "]: analytic " << e.analytic
        << ", numeric " << e.numeric << ", abs err " << e.abs_error << ", rel err " << e.rel_error
        << "\n";
  }
  result.log = log.str();
  return result;
}

}  // namespace stillpoint
