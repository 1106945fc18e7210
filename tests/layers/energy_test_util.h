// Helpers shared by the energy-layer tests: random float64 tensors, a
// finite-difference check of a module's parameter gradients, a model's
// flattened parameter gradient, and dense Jacobians/Hessians by autodiff for
// small maps.
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
#include "layers/models.h"
#include "solvers/implicit_solve.h"

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

// stillpoint::CheckParameterGradients (framework/gradcheck.h) with the step
// and tolerances given positionally; called with the module and the loss
// alone, the framework's function is chosen.
inline ParameterCheck CheckParameterGradients(Module& module,
                                              const std::function<Var()>& loss,
                                              double step,
                                              double rel_tol,
                                              double abs_tol) {
  GradCheckOptions options;
  options.step = step;
  options.relative_tolerance = rel_tol;
  options.absolute_tolerance = abs_tol;
  options.max_reported = 20;
  const GradCheckResult result = stillpoint::CheckParameterGradients(module, loss, options);
  ParameterCheck check;
  check.ok = result.ok;
  check.max_rel_error = result.max_rel_error;
  check.log = result.log;
  return check;
}

// Every trainable parameter's gradient of sum(logits * probe) for a feature
// model, flattened in named_parameters() order (zeros where none arrived).
inline std::vector<double> ModelGradient(SequenceModel& model,
                                         const Var& features,
                                         const Tensor& probe) {
  model.ZeroGrad();
  backward(sum(mul(model.ForwardFeatures(features), Var(probe))));
  std::vector<double> flat;
  for (const auto& [name, parameter] : model.named_parameters()) {
    if (!parameter.requires_grad()) continue;
    const std::vector<double> g = parameter.has_grad() ? parameter.grad().value().ToVector()
                                                       : std::vector<double>(parameter.numel());
    flat.insert(flat.end(), g.begin(), g.end());
  }
  return flat;
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
