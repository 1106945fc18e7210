// Differentiable fixed-point cells with known structure, and the helpers
// the implicit-differentiation tests share: solving at a tight tolerance,
// analytic gradients through SolveImplicit, and central finite differences
// of the whole converged solve.
//
// Every problem is float64, rows are samples, and every parameter (and the
// injection x) is a leaf that requires grad. The cells capture the leaves,
// so changing a leaf's value changes the cell (that is how the finite
// differences perturb them).
#pragma once

#include <Eigen/Dense>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "framework/autograd.h"
#include "framework/ops.h"
#include "framework/random.h"
#include "framework/tensor.h"
#include "solvers/implicit_solve.h"

namespace stillpoint {
namespace implicit_test {

struct ImplicitProblem {
  std::string name;
  VarList params;  // parameters and the injection, all requiring grad
  std::vector<std::string> param_names;
  CellFn cell;
  CellEnergyFn energy;     // set when f(z) = z - grad E(z)
  bool symmetric = false;  // I - J symmetric (energy maps)
  Tensor z0;               // [B, n]
};

inline Var Leaf(const Tensor& value) { return Var(value, true); }

// Scales a random matrix to Frobenius norm `norm` (so its spectral norm,
// and the map's Lipschitz constant, is at most `norm`).
inline Tensor RandomMatrix(int64_t rows, int64_t cols, double norm, bool symmetric, Rng& rng) {
  Tensor m = RandomNormal(Shape{rows, cols}, 0.0, 1.0, DType::kFloat64, rng);
  if (symmetric) {
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < i; ++j) {
        const double mean = 0.5 * (m.at(i * cols + j) + m.at(j * cols + i));
        m.set(i * cols + j, mean);
        m.set(j * cols + i, mean);
      }
    }
  }
  double sum_squares = 0.0;
  for (double v : m.ToVector()) sum_squares += v * v;
  const double scale = norm / std::sqrt(sum_squares);
  for (int64_t i = 0; i < m.numel(); ++i) m.set(i, m.at(i) * scale);
  return m;
}

// f(z) = z W^T + x U^T + b, ||W|| <= 0.6. With symmetric W it is
// z - grad E for E(z) = 1/2 z (I - W) z^T - (x U^T + b) z^T.
inline ImplicitProblem AffineProblem(
    int64_t batch, int64_t n, int64_t d, bool symmetric, uint64_t seed) {
  Rng rng(seed);
  ImplicitProblem p;
  p.name = symmetric ? "affine_symmetric" : "affine";
  Var w = Leaf(RandomMatrix(n, n, 0.6, symmetric, rng));
  Var u = Leaf(RandomNormal(Shape{n, d}, 0.0, 0.5, DType::kFloat64, rng));
  Var b = Leaf(RandomNormal(Shape{n}, 0.0, 0.5, DType::kFloat64, rng));
  Var x = Leaf(RandomNormal(Shape{batch, d}, 0.0, 1.0, DType::kFloat64, rng));
  p.params = {w, u, b, x};
  p.param_names = {"W", "U", "b", "x"};
  auto injection = [u, b, x](const std::vector<int64_t>& ids) {
    return add(matmul(gather(x, 0, ids), u, false, true), b);
  };
  p.cell = [w, injection](const Var& z, const std::vector<int64_t>& ids) {
    return add(matmul(z, w, false, true), injection(ids));
  };
  p.symmetric = symmetric;
  if (symmetric) {
    p.energy = [w, injection](const Var& z, const std::vector<int64_t>& ids) {
      // 1/2 z.z - 1/2 z.(z W) - c.z, per row.
      Var quadratic = sub(mul_scalar(z, 0.5), mul_scalar(matmul(z, w, false, true), 0.5));
      return sum(mul(z, sub(quadratic, injection(ids))), 1);
    };
  }
  p.z0 = Tensor::Zeros(Shape{batch, n}, DType::kFloat64);
  return p;
}

// The closed-form fixed point of AffineProblem: rows of (I - W)^{-1} c.
inline Tensor AffineSolution(const ImplicitProblem& p) {
  const Tensor& w = p.params[0].value();
  const int64_t n = w.dim(0);
  Eigen::MatrixXd iw = Eigen::MatrixXd::Identity(n, n);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) iw(i, j) -= w.at(i * n + j);
  }
  Tensor c;
  {
    NoGrad no_grad;
    const int64_t batch = p.params[3].dim(0);
    std::vector<int64_t> ids(batch);
    for (int64_t i = 0; i < batch; ++i) ids[i] = i;
    c = p.cell(Var(Tensor::Zeros(Shape{batch, n}, DType::kFloat64)), ids).value();
  }
  Tensor out(c.shape(), DType::kFloat64);
  const Eigen::PartialPivLU<Eigen::MatrixXd> lu(iw);
  for (int64_t r = 0; r < c.dim(0); ++r) {
    Eigen::VectorXd rhs(n);
    for (int64_t i = 0; i < n; ++i) rhs(i) = c.at(r * n + i);
    const Eigen::VectorXd z = lu.solve(rhs);
    for (int64_t i = 0; i < n; ++i) out.set(r * n + i, z(i));
  }
  return out;
}

// f(z) = tanh(z W^T + x U^T + b), ||W|| <= 0.6 (a contraction).
// The map z -> tanh(z W^T + x[ids] U^T + b) of TanhProblem, for tests that
// rebuild it around a perturbed W.
inline CellFn TanhCell(const Var& w, const Var& u, const Var& b, const Var& x) {
  return [w, u, b, x](const Var& z, const std::vector<int64_t>& ids) {
    return tanh(add(add(matmul(z, w, false, true), matmul(gather(x, 0, ids), u, false, true)), b));
  };
}

inline ImplicitProblem TanhProblem(
    int64_t batch, int64_t n, int64_t d, uint64_t seed, double w_norm = 0.6) {
  Rng rng(seed);
  ImplicitProblem p;
  p.name = "tanh";
  Var w = Leaf(RandomMatrix(n, n, w_norm, false, rng));
  Var u = Leaf(RandomNormal(Shape{n, d}, 0.0, 0.5, DType::kFloat64, rng));
  Var b = Leaf(RandomNormal(Shape{n}, 0.0, 0.5, DType::kFloat64, rng));
  Var x = Leaf(RandomNormal(Shape{batch, d}, 0.0, 1.0, DType::kFloat64, rng));
  p.params = {w, u, b, x};
  p.param_names = {"W", "U", "b", "x"};
  p.cell = TanhCell(w, u, b, x);
  p.z0 = Tensor::Zeros(Shape{batch, n}, DType::kFloat64);
  return p;
}

// A Hopfield retrieval map with an injection:
//   f(z) = softmax(beta z X^T) X + x U^T,
// = z - grad E for E(z) = 1/2 |z|^2 - lse(beta z X^T) / beta - (x U^T) z^T.
// X is scaled so that ||J_f|| <= beta ||X||^2 / 2 <= 0.6.
inline ImplicitProblem HopfieldProblem(
    int64_t batch, int64_t d, int64_t patterns, double beta, uint64_t seed) {
  Rng rng(seed);
  ImplicitProblem p;
  p.name = "hopfield";
  Var patterns_var = Leaf(RandomMatrix(patterns, d, std::sqrt(1.2 / beta), false, rng));
  Var u = Leaf(RandomNormal(Shape{d, d}, 0.0, 0.3, DType::kFloat64, rng));
  Var x = Leaf(RandomNormal(Shape{batch, d}, 0.0, 1.0, DType::kFloat64, rng));
  p.params = {patterns_var, u, x};
  p.param_names = {"X", "U", "x"};
  p.cell = [patterns_var, u, x, beta](const Var& z, const std::vector<int64_t>& ids) {
    Var attention = softmax(mul_scalar(matmul(z, patterns_var, false, true), beta));
    return add(matmul(attention, patterns_var), matmul(gather(x, 0, ids), u, false, true));
  };
  p.energy = [patterns_var, u, x, beta](const Var& z, const std::vector<int64_t>& ids) {
    Var half_norm = mul_scalar(sum(square(z), 1), 0.5);
    Var lse =
        mul_scalar(logsumexp(mul_scalar(matmul(z, patterns_var, false, true), beta)), 1.0 / beta);
    Var linear = sum(mul(z, matmul(gather(x, 0, ids), u, false, true)), 1);
    return sub(sub(half_norm, lse), linear);
  };
  p.symmetric = true;
  p.z0 = Tensor::Zeros(Shape{batch, d}, DType::kFloat64);
  return p;
}

// The energy map with step s: f_s(z) = z - s grad E(z) = (1 - s) z + s f(z).
// Same fixed points; I - J_{f_s} = s Hess E.
inline CellFn ScaledEnergyCell(const CellFn& cell, double s) {
  return [cell, s](const Var& z, const std::vector<int64_t>& ids) {
    return add(mul_scalar(z, 1.0 - s), mul_scalar(cell(z, ids), s));
  };
}

// Forward options that converge to ~1e-12 on the problems above.
inline ForwardSolverOptions TightForward(ForwardSolverType type) {
  ForwardSolverOptions options;
  options.type = type;
  options.max_iterations = 400;
  options.stop_mode = StopMode::kAbsolute;
  options.absolute_tolerance = 1e-12;
  options.stagnation_window = 0;
  return options;
}

// The loss L = <z*, probe>.
inline Var ProbeLoss(const Var& z_star, const Tensor& probe) {
  return sum(mul(z_star, constant(probe)));
}

// dL/dparams through SolveImplicit (the backward pass under test).
inline std::vector<Tensor> AnalyticGradients(
    const ImplicitProblem& p,
    const CellFn& cell,
    const ImplicitOptions& options,
    const Tensor& probe,
    ImplicitResult* result_out = nullptr,
    const std::shared_ptr<AdjointWarmStart>& warm_start = nullptr) {
  ImplicitResult result = SolveImplicit(cell, p.z0, options, p.energy, {}, warm_start);
  VarList grads = grad({ProbeLoss(result.z_star, probe)}, p.params);
  std::vector<Tensor> out;
  for (size_t i = 0; i < grads.size(); ++i) {
    out.push_back(grads[i].defined() ? grads[i].value()
                                     : Tensor::Zeros(p.params[i].shape(), DType::kFloat64));
  }
  if (result_out != nullptr) *result_out = std::move(result);
  return out;
}

// Central differences of L(params) = <z*(params), probe>, where every
// evaluation runs the whole forward solve (tape off) with `forward`.
inline std::vector<Tensor> NumericGradients(const ImplicitProblem& p,
                                            const CellFn& cell,
                                            const ForwardSolverOptions& forward,
                                            const Tensor& probe,
                                            double step = 1e-5) {
  ImplicitOptions options;
  options.forward = forward;
  auto loss = [&]() {
    NoGrad no_grad;
    ImplicitResult r = SolveImplicit(cell, p.z0, options, p.energy);
    double total = 0.0;
    const std::vector<double> z = r.z_star.value().ToVector();
    const std::vector<double> q = probe.ToVector();
    for (size_t i = 0; i < z.size(); ++i) total += z[i] * q[i];
    return total;
  };
  std::vector<Tensor> out;
  for (const Var& param : p.params) {
    Var mutable_param = param;
    Tensor& value = mutable_param.mutable_value();
    Tensor g(value.shape(), DType::kFloat64);
    for (int64_t i = 0; i < value.numel(); ++i) {
      const double original = value.at(i);
      value.set(i, original + step);
      const double plus = loss();
      value.set(i, original - step);
      const double minus = loss();
      value.set(i, original);
      g.set(i, (plus - minus) / (2 * step));
    }
    out.push_back(g);
  }
  return out;
}

inline double Norm(const std::vector<Tensor>& tensors) {
  double total = 0.0;
  for (const Tensor& t : tensors) {
    for (double v : t.ToVector()) total += v * v;
  }
  return std::sqrt(total);
}

// ||a - b|| / ||b|| over all tensors together.
inline double RelativeError(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  double diff = 0.0;
  for (size_t k = 0; k < a.size(); ++k) {
    const std::vector<double> x = a[k].ToVector();
    const std::vector<double> y = b[k].ToVector();
    for (size_t i = 0; i < x.size(); ++i) diff += (x[i] - y[i]) * (x[i] - y[i]);
  }
  return std::sqrt(diff) / std::max(Norm(b), 1e-300);
}

inline double Cosine(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  double dot = 0.0;
  for (size_t k = 0; k < a.size(); ++k) {
    const std::vector<double> x = a[k].ToVector();
    const std::vector<double> y = b[k].ToVector();
    for (size_t i = 0; i < x.size(); ++i) dot += x[i] * y[i];
  }
  return dot / std::max(Norm(a) * Norm(b), 1e-300);
}

}  // namespace implicit_test
}  // namespace stillpoint
