#include "solvers/regularizers.h"

#include <cmath>
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
    VarList jt_v = grad({f_z}, {z_leaf}, {Var(v.Reshape(z.shape()))}, {.retain_graph = true});
    Tensor next = jt_v[0].defined() ? jt_v[0].value().Reshape(Shape{batch, n}).Clone()
                                    : Tensor::Zeros(Shape{batch, n}, z.dtype());
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
  for (int64_t b = 0; b < batch; ++b) {
    if (b == 0 || result.radius[b] > result.max_radius) {
      result.max_radius = result.radius[b];
      result.dominant_eigenvalue = result.eigenvalue[b];
    }
  }
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
