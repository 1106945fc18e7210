// Helpers shared by the energy-layer tests: random float64 tensors, a
// finite-difference check of a module's parameter gradients, and dense
// Jacobians/Hessians by autodiff for small maps.
#pragma once

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "framework/autograd.h"
#include "framework/gradcheck.h"
#include "framework/module.h"
#include "framework/ops.h"
#include "framework/random.h"
#include "framework/tensor.h"
#include "solvers/implicit.h"

namespace stillpoint {
namespace testing_energy {

// Forward and adjoint solves far below the finite-difference noise of a
// float64 gradient check.
inline ImplicitOptions TightImplicitOptions(
    ForwardSolverType forward = ForwardSolverType::kAnderson,
    AdjointSolverType adjoint = AdjointSolverType::kGmres) {
  ImplicitOptions options;
  options.forward.type = forward;
  options.forward.max_iterations = 300;
  options.forward.stop_mode = StopMode::kAbsolute;
  options.forward.absolute_tolerance = 1e-13;
  options.forward.stagnation_window = 0;
  options.backward.solver = adjoint;
  options.backward.max_iterations = 200;
  options.backward.tolerance = 1e-12;
  return options;
}

// Gradient-check settings for functions that contain a converged solve:
// step 1e-5 and relative tolerance 1e-5, absolute tolerance as given.
inline GradCheckOptions SolveGradCheckOptions(double absolute_tolerance) {
  GradCheckOptions options;
  options.step = 1e-5;
  options.relative_tolerance = 1e-5;
  options.absolute_tolerance = absolute_tolerance;
  return options;
}

inline Tensor Randn(const Shape& shape, Rng& rng, double stddev = 1.0) {
  return RandomNormal(shape, 0.0, stddev, DType::kFloat64, rng);
}

inline Var RandnVar(const Shape& shape, Rng& rng, double stddev = 1.0) {
  return Var(Randn(shape, rng, stddev));
}

// Re-draws every parameter of module from N(0, stddev^2) (betas and other
// positive scalars keep their values when keep(name) says so).
inline void RandomizeParameters(Module& module,
                                Rng& rng,
                                double stddev,
                                const std::function<bool(const std::string&)>& keep = {}) {
  for (auto& [name, parameter] : module.named_parameters()) {
    if (keep && keep(name)) continue;
    Tensor& value = parameter.mutable_value();
    value.CopyFrom(Randn(value.shape(), rng, stddev));
  }
}

struct ParameterCheck {
  bool ok = true;
  double max_rel_error = 0.0;
  std::string log;
  explicit operator bool() const { return ok; }
};

inline std::ostream& operator<<(std::ostream& out, const ParameterCheck& check) {
  return out << (check.ok ? "ok" : "FAILED") << " (max rel error " << check.max_rel_error << ")\n"
             << check.log;
}

// Compares backward's gradient of loss() with respect to every trainable
// parameter of module against central differences (perturbing the values in
// place). loss must rebuild its graph on every call and return a scalar.
// An entry fails when both |a - n| > abs_tol and |a - n| > rel_tol max(|a|, |n|).
inline ParameterCheck CheckParameterGradients(Module& module,
                                              const std::function<Var()>& loss,
                                              double step = 1e-6,
                                              double rel_tol = 1e-6,
                                              double abs_tol = 1e-8) {
  ParameterCheck check;
  module.ZeroGrad();
  Var value = loss();
  backward(value);
  std::ostringstream log;
  for (auto& [name, parameter] : module.named_parameters()) {
    if (!parameter.requires_grad()) continue;
    Tensor analytic = parameter.has_grad() ? parameter.grad().value().Clone()
                                           : Tensor::Zeros(parameter.shape(), DType::kFloat64);
    Tensor& values = parameter.mutable_value();
    for (int64_t i = 0; i < values.numel(); ++i) {
      const double original = values.at(i);
      double plus, minus;
      {
        NoGrad no_grad;
        values.set(i, original + step);
        plus = loss().item();
        values.set(i, original - step);
        minus = loss().item();
        values.set(i, original);
      }
      const double numeric = (plus - minus) / (2.0 * step);
      const double a = analytic.at(i);
      const double error = std::abs(a - numeric);
      const double scale = std::max(std::abs(a), std::abs(numeric));
      const double rel = scale > 0.0 ? error / scale : 0.0;
      if (error > abs_tol) check.max_rel_error = std::max(check.max_rel_error, rel);
      if (error > abs_tol && error > rel_tol * scale) {
        check.ok = false;
        log << "  " << name << "[" << i << "]: analytic " << a << ", numeric " << numeric << "\n";
      }
    }
  }
  module.ZeroGrad();
  check.log = log.str();
  return check;
}

// The dense Jacobian d vec(f(x)) / d vec(x) by reverse mode, one row per
// output entry.
inline Eigen::MatrixXd DenseJacobian(const std::function<Var(const Var&)>& f, const Tensor& x) {
  Var input(x.Clone(), /*requires_grad=*/true);
  Var output = f(input);
  const int64_t m = output.numel();
  Eigen::MatrixXd jacobian(m, x.numel());
  for (int64_t r = 0; r < m; ++r) {
    Tensor seed = Tensor::Zeros(output.shape(), DType::kFloat64);
    seed.set(r, 1.0);
    GradOptions options;
    options.retain_graph = true;
    Var g = grad({output}, {input}, {Var(seed)}, options)[0];
    for (int64_t c = 0; c < x.numel(); ++c) jacobian(r, c) = g.defined() ? g.value().at(c) : 0.0;
  }
  return jacobian;
}

// The dense Hessian of a scalar function by double backward.
inline Eigen::MatrixXd DenseHessian(const std::function<Var(const Var&)>& f, const Tensor& x) {
  return DenseJacobian(
      [&](const Var& input) {
        GradOptions options;
        options.create_graph = true;
        return grad({f(input)}, {input}, {}, options)[0];
      },
      x);
}

inline Eigen::VectorXd ToEigen(const Tensor& t) {
  Eigen::VectorXd v(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) v(i) = t.at(i);
  return v;
}

inline double MaxAbs(const Tensor& t) {
  double m = 0.0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::abs(t.at(i)));
  return m;
}

}  // namespace testing_energy
}  // namespace stillpoint
