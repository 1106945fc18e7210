#include "solvers/regularizers.h"

#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <complex>
#include <numeric>

#include "framework/check.h"
#include "framework/ops.h"

namespace stillpoint {
namespace {

std::vector<int64_t> AllSamples(int64_t batch) {
  std::vector<int64_t> ids(batch);
  std::iota(ids.begin(), ids.end(), 0);
  return ids;
}

// Per-row Euclidean norms of a [B, n] tensor.
std::vector<double> RowNorms(const Tensor& rows) {
  const int64_t batch = rows.dim(0);
  const int64_t n = rows.numel() / batch;
  const std::vector<double> values = rows.ToVector();
  std::vector<double> norms(batch, 0.0);
  for (int64_t b = 0; b < batch; ++b) {
    double sum_squares = 0.0;
    for (int64_t i = 0; i < n; ++i) sum_squares += values[b * n + i] * values[b * n + i];
    norms[b] = std::sqrt(sum_squares);
  }
  return norms;
}

// Per-row dot products of two [B, n] tensors, in float64.
std::vector<double> RowDots(const Tensor& a, const Tensor& b) {
  const int64_t batch = a.dim(0);
  const int64_t n = a.numel() / batch;
  const std::vector<double> x = a.ToVector();
  const std::vector<double> y = b.ToVector();
  std::vector<double> dots(batch, 0.0);
  for (int64_t r = 0; r < batch; ++r) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += x[r * n + i] * y[r * n + i];
    dots[r] = sum;
  }
  return dots;
}

}  // namespace

Var JacobianFrobeniusPenalty(const Var& f_z, const Var& z, int num_probes, Rng& rng) {
  SP_CHECK(num_probes >= 1, "JacobianFrobeniusPenalty: num_probes = ", num_probes, " must be >= 1");
  SP_CHECK(f_z.defined() && z.defined(), "JacobianFrobeniusPenalty: undefined input");
  SP_CHECK(z.requires_grad(), "JacobianFrobeniusPenalty: z (shape ", z.shape(),
           ") does not require grad, so f_z cannot depend on it on the tape");
  GradModeGuard tape_on(true);
  Var total;
  for (int k = 0; k < num_probes; ++k) {
    Var probe(RandomNormal(f_z.shape(), 0.0, 1.0, f_z.dtype(), rng));
    VarList vjp = grad({f_z}, {z}, {probe}, {.retain_graph = true, .create_graph = true});
    Var term = vjp[0].defined() ? sum(square(vjp[0])) : scalar_like(f_z, 0.0);
    total = total.defined() ? add(total, term) : term;
  }
  return mul_scalar(total, 1.0 / (static_cast<double>(num_probes) * z.numel()));
}

Var JacobianFrobeniusPenalty(const CellFn& f, const Tensor& z, int num_probes, Rng& rng) {
  SP_CHECK(z.defined() && z.rank() >= 1, "JacobianFrobeniusPenalty: z must be [B, ...]");
  GradModeGuard tape_on(true);
  Var z_leaf(z, true);
  Var f_z = f(z_leaf, AllSamples(z.dim(0)));
  SP_CHECK(f_z.defined() && f_z.shape() == z.shape(), "JacobianFrobeniusPenalty: the cell maps ",
           z.shape(), " to ", f_z.defined() ? f_z.shape().ToString() : "undefined");
  return JacobianFrobeniusPenalty(f_z, z_leaf, num_probes, rng);
}

namespace {

// The batched product J^T V for the rows V ([B, n]) at the recorded f_z.
Tensor TransposedJacobianTimes(const Var& f_z, const Var& z_leaf, const Tensor& rows) {
  const int64_t batch = rows.dim(0);
  VarList jt_v =
      grad({f_z}, {z_leaf}, {Var(rows.Reshape(z_leaf.shape()))}, {.retain_graph = true});
  return jt_v[0].defined() ? jt_v[0].value().Reshape(Shape{batch, rows.numel() / batch}).Clone()
                           : Tensor::Zeros(rows.shape(), rows.dtype());
}

void SetLargestRadius(SpectralRadiusResult* result) {
  for (size_t b = 0; b < result->radius.size(); ++b) {
    if (b == 0 || result->radius[b] > result->max_radius) {
      result->max_radius = result->radius[b];
      result->dominant_eigenvalue = result->eigenvalue[b];
    }
  }
}

// The unit coefficient vector c in the real plane of the Ritz vector s
// (span{Re s, Im s}; a line for a real Ritz value) along which J^T stretches
// most: with J^T V_k = V_{k+1} H (H the extended (k+2) x (k+1) Hessenberg
// matrix), ||J^T V c|| = ||H c||. For a real eigenvector that is |lambda|;
// for a complex pair the largest gain on its invariant plane, at least
// |lambda|, so a penalty on it lowers the pair's modulus (the real part
// alone can be stretched less than |lambda| and leave the penalty at zero).
Eigen::VectorXd StretchedDirection(const Eigen::MatrixXd& extended_hessenberg,
                                   const Eigen::VectorXcd& s) {
  Eigen::MatrixXd plane(s.size(), 2);
  plane.col(0) = s.real();
  plane.col(1) = s.imag();
  const Eigen::JacobiSVD<Eigen::MatrixXd> span(plane, Eigen::ComputeThinU);
  // A one-dimensional Krylov space (the first step) has one singular value.
  const Eigen::VectorXd& sigma = span.singularValues();
  const Eigen::Index rank = sigma.size() > 1 && sigma(1) > 1e-10 * sigma(0) ? 2 : 1;
  const Eigen::MatrixXd basis = span.matrixU().leftCols(rank);
  const Eigen::JacobiSVD<Eigen::MatrixXd> gain(extended_hessenberg * basis, Eigen::ComputeThinV);
  return basis * gain.matrixV().col(0);
}

// Arnoldi on each sample's J_b^T, all samples advanced by one batched VJP a
// step. The basis is kept in float64 and orthogonalised twice (classical
// Gram-Schmidt repeated), which keeps it orthonormal to rounding however
// non-normal J is. Its storage, and every other [B, n] buffer, is a pooled
// tensor: the spectral-radius penalty runs this every few training steps,
// and fresh heap memory of this size costs a page fault per page each time.
SpectralRadiusResult ArnoldiSpectralRadius(const Var& f_z, const Var& z_leaf, int64_t batch,
                                           int64_t n, const SpectralRadiusOptions& options) {
  const int max_steps = static_cast<int>(std::min<int64_t>(options.max_iterations, n));
  using Matrix = Eigen::MatrixXd;
  using MatrixMap = Eigen::Map<Matrix>;
  // Sample b's columns v_0..v_k, column-major; a column is written before it
  // is read.
  Tensor basis_storage(Shape{batch, max_steps + 1, n}, DType::kFloat64);
  const auto basis = [&basis_storage, n, max_steps](int64_t b) {
    return MatrixMap(basis_storage.data<double>() + b * (max_steps + 1) * n, n, max_steps + 1);
  };
  std::vector<Matrix> hessenberg(batch, Matrix::Zero(max_steps + 1, max_steps));
  SpectralRadiusResult result;
  result.radius.assign(batch, 0.0);
  result.eigenvalue.assign(batch, 0.0);
  result.iterations.assign(batch, 0);
  result.converged.assign(batch, 0);
  Tensor directions = Tensor::Zeros(Shape{batch, n}, DType::kFloat64);
  double* direction = directions.data<double>();

  Rng rng(options.seed);
  const Tensor start = RandomNormal(Shape{batch, n}, 0.0, 1.0, DType::kFloat64, rng);
  for (int64_t b = 0; b < batch; ++b) {
    basis(b).col(0) =
        Eigen::Map<const Eigen::VectorXd>(start.data<double>() + b * n, n).normalized();
  }
  // Each step's v_k of every active sample (0 for the converged ones), then
  // in the state's dtype for the VJP.
  Tensor columns(Shape{batch, n}, DType::kFloat64);
  Tensor rows = Tensor::Zeros(Shape{batch, n}, z_leaf.value().dtype());
  for (int k = 0; k < max_steps; ++k) {
    bool any_active = false;
    for (int64_t b = 0; b < batch; ++b) {
      Eigen::Map<Eigen::VectorXd> column(columns.data<double>() + b * n, n);
      if (result.converged[b]) {
        column.setZero();
      } else {
        column = basis(b).col(k);
        any_active = true;
      }
    }
    if (!any_active) break;
    rows.CopyFrom(columns);
    Tensor products = TransposedJacobianTimes(f_z, z_leaf, rows);
    if (products.dtype() != DType::kFloat64) products = products.To(DType::kFloat64);
    for (int64_t b = 0; b < batch; ++b) {
      if (result.converged[b]) continue;
      Eigen::VectorXd w = Eigen::Map<const Eigen::VectorXd>(products.data<double>() + b * n, n);
      const auto previous = basis(b).leftCols(k + 1);
      for (int pass = 0; pass < 2; ++pass) {
        const Eigen::VectorXd coefficients = previous.transpose() * w;
        w -= previous * coefficients;
        hessenberg[b].col(k).head(k + 1) += coefficients;
      }
      const double next_norm = w.norm();
      hessenberg[b](k + 1, k) = next_norm;
      // The Ritz values of the leading (k+1) x (k+1) block; the dominant one
      // and its residual ||J^T y - lambda y|| = h_{k+1,k} |e_k^T s|.
      const Matrix square = hessenberg[b].topLeftCorner(k + 1, k + 1);
      Eigen::EigenSolver<Matrix> eigen(square);
      Eigen::Index dominant = 0;
      eigen.eigenvalues().cwiseAbs().maxCoeff(&dominant);
      const std::complex<double> lambda = eigen.eigenvalues()(dominant);
      const Eigen::VectorXcd s = eigen.eigenvectors().col(dominant).normalized();
      const double residual = next_norm * std::abs(s(k));
      result.radius[b] = std::abs(lambda);
      result.eigenvalue[b] = lambda.real();
      result.iterations[b] = k + 1;
      Eigen::Map<Eigen::VectorXd>(direction + b * n, n) =
          previous * StretchedDirection(hessenberg[b].topLeftCorner(k + 2, k + 1), s);
      const double scale = 1e-12 * std::max(1.0, square.norm());
      if (next_norm <= scale || residual <= options.tolerance * result.radius[b]) {
        result.converged[b] = 1;  // an invariant subspace is exact
      } else {
        basis(b).col(k + 1) = w / next_norm;
      }
    }
  }
  for (int64_t b = 0; b < batch; ++b) {
    Eigen::Map<Eigen::VectorXd> row(direction + b * n, n);
    const double norm = row.norm();
    if (norm > 0) row /= norm;
  }
  result.directions = directions.dtype() == z_leaf.value().dtype()
                          ? directions
                          : directions.To(z_leaf.value().dtype());
  SetLargestRadius(&result);
  return result;
}

}  // namespace

SpectralRadiusResult EstimateSpectralRadius(const CellFn& f,
                                            const Tensor& z,
                                            const SpectralRadiusOptions& options) {
  SP_CHECK(z.defined() && z.rank() >= 1, "EstimateSpectralRadius: z must be [B, ...]");
  SP_CHECK(options.max_iterations >= 1,
           "EstimateSpectralRadius: max_iterations = ", options.max_iterations, " must be >= 1");
  SP_CHECK(options.tolerance >= 0, "EstimateSpectralRadius: tolerance = ", options.tolerance,
           " must be >= 0");
  const int64_t batch = z.dim(0);
  const int64_t n = z.numel() / batch;
  GradModeGuard tape_on(true);
  Var z_leaf(z, true);
  Var f_z = f(z_leaf, AllSamples(batch));
  SP_CHECK(f_z.defined() && f_z.shape() == z.shape(), "EstimateSpectralRadius: the cell maps ",
           z.shape(), " to ", f_z.defined() ? f_z.shape().ToString() : "undefined");
  if (options.method == SpectralRadiusMethod::kArnoldi) {
    return ArnoldiSpectralRadius(f_z, z_leaf, batch, n, options);
  }

  SpectralRadiusResult result;
  result.radius.assign(batch, 0.0);
  result.eigenvalue.assign(batch, 0.0);
  result.iterations.assign(batch, 0);
  result.converged.assign(batch, 0);
  Rng rng(options.seed);
  Tensor v = RandomNormal(Shape{batch, n}, 0.0, 1.0, z.dtype(), rng);
  auto normalize = [&](Tensor* rows, const std::vector<double>& norms) {
    for (int64_t b = 0; b < batch; ++b) {
      const double scale = norms[b] > 0 ? 1.0 / norms[b] : 0.0;
      for (int64_t i = 0; i < n; ++i) rows->set(b * n + i, rows->at(b * n + i) * scale);
    }
  };
  normalize(&v, RowNorms(v));
  for (int it = 0; it < options.max_iterations; ++it) {
    Tensor next = TransposedJacobianTimes(f_z, z_leaf, v);
    const std::vector<double> norms = RowNorms(next);
    const std::vector<double> quotients = RowDots(v, next);
    // Every row of v is the direction of its sample's latest estimate
    // (converged rows keep theirs).
    result.directions = v.Clone();
    bool all_done = true;
    for (int64_t b = 0; b < batch; ++b) {
      if (result.converged[b]) continue;
      const double previous = result.radius[b];
      result.radius[b] = norms[b];
      result.eigenvalue[b] = quotients[b];
      result.iterations[b] = it + 1;
      if (it > 0 && std::abs(norms[b] - previous) <= options.tolerance * norms[b]) {
        result.converged[b] = 1;
      } else {
        all_done = false;
      }
      if (norms[b] == 0.0) result.converged[b] = 1;
    }
    // Converged samples keep their vector: rows are independent, so this
    // does not disturb the others.
    for (int64_t b = 0; b < batch; ++b) {
      if (result.converged[b]) continue;
      for (int64_t i = 0; i < n; ++i) v.set(b * n + i, next.at(b * n + i) / norms[b]);
    }
    if (all_done) break;
  }
  SetLargestRadius(&result);
  return result;
}

Var SpectralRadiusPenalty(const CellFn& f, const Tensor& z, const Tensor& directions,
                          double target) {
  SP_CHECK(z.defined() && z.rank() >= 1, "SpectralRadiusPenalty: z must be [B, ...]");
  const int64_t batch = z.dim(0);
  const int64_t n = z.numel() / batch;
  SP_CHECK(directions.defined() && directions.numel() == z.numel() &&
               directions.dtype() == z.dtype(),
           "SpectralRadiusPenalty: directions must hold one [n] row per sample of z ", z.shape(),
           " in its dtype, got ",
           directions.defined() ? directions.shape().ToString() : std::string("undefined"));
  SP_CHECK(std::isfinite(target) && target >= 0, "SpectralRadiusPenalty: target = ", target,
           " must be finite and >= 0");
  GradModeGuard tape_on(true);
  Var z_leaf(z, true);
  Var f_z = f(z_leaf, AllSamples(batch));
  SP_CHECK(f_z.defined() && f_z.shape() == z.shape(), "SpectralRadiusPenalty: the cell maps ",
           z.shape(), " to ", f_z.defined() ? f_z.shape().ToString() : "undefined");
  VarList jt_v = grad({f_z}, {z_leaf}, {Var(directions.Reshape(z.shape()))},
                      {.retain_graph = true, .create_graph = true});
  if (!jt_v[0].defined()) return scalar_like(f_z, 0.0);  // J = 0: nothing to penalise
  const Var radius = sqrt(sum(square(reshape(jt_v[0], Shape{batch, n})), 1));
  return mean(square(relu(add_scalar(radius, -target))));
}

Var FixedPointCorrectionLoss(const CellFn& f,
                             const std::vector<Tensor>& iterates,
                             const std::function<Var(const Var&)>& loss,
                             const FixedPointCorrectionOptions& options) {
  SP_CHECK(!iterates.empty(),
           "FixedPointCorrectionLoss: no iterates given (set "
           "ImplicitOptions::sampled_iterates to keep some)");
  SP_CHECK(options.steps >= 1, "FixedPointCorrectionLoss: steps = ", options.steps,
           " must be >= 1");
  SP_CHECK(options.tau > 0 && options.tau <= 1, "FixedPointCorrectionLoss: tau = ", options.tau,
           " must be in (0, 1]");
  SP_CHECK(options.gamma > 0 && options.gamma <= 1,
           "FixedPointCorrectionLoss: gamma = ", options.gamma, " must be in (0, 1]");
  const int64_t count = static_cast<int64_t>(iterates.size());
  Var total;
  for (int64_t i = 0; i < count; ++i) {
    const Tensor& start = iterates[i];
    SP_CHECK(start.defined() && start.rank() >= 1, "FixedPointCorrectionLoss: iterate ", i,
             " is not [B, ...]");
    const std::vector<int64_t> ids = AllSamples(start.dim(0));
    Var z(start);
    for (int k = 0; k < options.steps; ++k) {
      Var fz = f(z, ids);
      SP_CHECK(fz.defined() && fz.shape() == start.shape(),
               "FixedPointCorrectionLoss: the cell maps ", start.shape(), " to ",
               fz.defined() ? fz.shape().ToString() : "undefined");
      z = options.tau == 1.0 ? fz
                             : add(mul_scalar(z, 1.0 - options.tau), mul_scalar(fz, options.tau));
    }
    Var term = loss(z);
    SP_CHECK(term.defined() && term.numel() == 1,
             "FixedPointCorrectionLoss: the loss must return one value");
    term = mul_scalar(term, std::pow(options.gamma, static_cast<double>(count - 1 - i)));
    total = total.defined() ? add(total, term) : term;
  }
  return total;
}

}  // namespace stillpoint
