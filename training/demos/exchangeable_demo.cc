#include "training/demos/exchangeable_demo.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <ostream>
#include <vector>

#include "framework/check.h"
#include "framework/ops.h"
#include "framework/random.h"
#include "training/demos/demo_output.h"
#include "training/svg_plot.h"

namespace stillpoint {
namespace {

constexpr int64_t kDim = 2;  // key and value width
constexpr DType kF64 = DType::kFloat64;

// The fixed problem: query q, score matrix W, key covariance Sigma
// (diagonal), value map A (row-major 2 x 2).
struct Problem {
  double q[kDim] = {0.6, -0.4};
  double w[kDim][kDim] = {{0.8, 0.3}, {-0.2, 0.6}};
  double sigma[kDim] = {1.0, 0.5};
  double a[kDim][kDim] = {{1.0, 0.5}, {-0.3, 0.8}};

  // eta = W^T q: the dot-product logits are eta.k.
  std::vector<double> Eta() const {
    std::vector<double> eta(kDim, 0.0);
    for (int i = 0; i < kDim; ++i)
      for (int j = 0; j < kDim; ++j) eta[j] += w[i][j] * q[i];
    return eta;
  }
  std::vector<double> ApplyA(const std::vector<double>& x) const {
    std::vector<double> y(kDim, 0.0);
    for (int i = 0; i < kDim; ++i)
      for (int j = 0; j < kDim; ++j) y[i] += a[i][j] * x[j];
    return y;
  }
  double NormA2(const std::vector<double>& x) const {
    double s = 0.0;
    for (double v : ApplyA(x)) s += v * v;
    return s;
  }
  // tr(A diag(s) A^T).
  double TraceASAt(const double* s) const {
    double t = 0.0;
    for (int i = 0; i < kDim; ++i)
      for (int j = 0; j < kDim; ++j) t += a[i][j] * a[i][j] * s[j];
    return t;
  }
};

// E[w^2 |v - m|^2] / E[w]^2 for the dot-product variant; independent of z:
// exp(eta' Sigma eta) (tr(A Sigma A') + |A Sigma eta|^2).
double DotVarianceFactor(const Problem& p) {
  const std::vector<double> eta = p.Eta();
  std::vector<double> sigma_eta(kDim);
  double quad = 0.0;
  for (int j = 0; j < kDim; ++j) {
    sigma_eta[j] = p.sigma[j] * eta[j];
    quad += eta[j] * sigma_eta[j];
  }
  return std::exp(quad) * (p.TraceASAt(p.sigma) + p.NormA2(sigma_eta));
}

// The same for the RBF variant at latent z (keys N(z, I), w =
// exp(-b/2 |k - q|^2), r = q - z): with m1 = z + b r / (1 + b) and
// m2 = z + 2 b r / (1 + 2 b),
//   (1 + b)^d (1 + 2b)^-d/2 exp(b|r|^2 (1/(1+b) - 1/(1+2b)))
//   x (tr(A A') / (1 + 2b) + |A (m2 - m1)|^2).
double RbfVarianceFactor(const Problem& p, double b, const double* z) {
  std::vector<double> r(kDim), diff(kDim);
  double r2 = 0.0;
  for (int j = 0; j < kDim; ++j) {
    r[j] = p.q[j] - z[j];
    r2 += r[j] * r[j];
    diff[j] = r[j] * (2.0 * b / (1.0 + 2.0 * b) - b / (1.0 + b));
  }
  const double ones[kDim] = {1.0, 1.0};
  const double d = static_cast<double>(kDim);
  return std::pow(1.0 + b, d) * std::pow(1.0 + 2.0 * b, -0.5 * d) *
         std::exp(b * r2 * (1.0 / (1.0 + b) - 1.0 / (1.0 + 2.0 * b))) *
         (p.TraceASAt(ones) / (1.0 + 2.0 * b) + p.NormA2(diff));
}

struct ErrorAtL {
  double error = 0.0, rbf_error = 0.0, expected = 0.0, rbf_expected = 0.0;
};

ErrorAtL MeasureAt(const Problem& p, const ExchangeableDemoOptions& o, int64_t tokens, Rng& rng) {
  const int64_t trials = o.trials;
  const double b = o.rbf_bandwidth;
  std::vector<double> latents(trials * kDim), dot_keys(trials * tokens * kDim),
      rbf_keys(trials * tokens * kDim);
  for (int64_t t = 0; t < trials; ++t) {
    for (int j = 0; j < kDim; ++j) latents[t * kDim + j] = rng.Normal();
    for (int64_t l = 0; l < tokens; ++l) {
      for (int j = 0; j < kDim; ++j) {
        const int64_t at = (t * tokens + l) * kDim + j;
        dot_keys[at] = latents[t * kDim + j] + std::sqrt(p.sigma[j]) * rng.Normal();
        rbf_keys[at] = latents[t * kDim + j] + rng.Normal();
      }
    }
  }
  const std::vector<double> eta = p.Eta();
  std::vector<double> eta_rows, q_rows, a_t;
  for (int64_t t = 0; t < trials; ++t) {
    eta_rows.insert(eta_rows.end(), eta.begin(), eta.end());
    q_rows.insert(q_rows.end(), p.q, p.q + kDim);
  }
  for (int j = 0; j < kDim; ++j)
    for (int i = 0; i < kDim; ++i) a_t.push_back(p.a[i][j]);  // A^T, row-major
  const Var a_transposed(Tensor::FromVector(Shape{kDim, kDim}, a_t, kF64));

  NoGrad no_grad;
  // Dot-product attention: softmax_l(eta.k_l) over v_l = A k_l.
  const Var keys(Tensor::FromVector(Shape{trials, tokens, kDim}, dot_keys, kF64));
  const Var etas(Tensor::FromVector(Shape{trials, 1, kDim}, eta_rows, kF64));
  const Var dot = matmul(softmax(matmul(etas, keys, false, true)), matmul(keys, a_transposed));
  // RBF attention: softmax_l(-b/2 |q - k_l|^2).
  const Var rkeys(Tensor::FromVector(Shape{trials, tokens, kDim}, rbf_keys, kF64));
  const Var queries(Tensor::FromVector(Shape{trials, 1, kDim}, q_rows, kF64));
  const Var distances = sum(square(sub(rkeys, queries)), -1);  // [trials, tokens]
  const Var rbf_weights =
      softmax(reshape(mul_scalar(distances, -0.5 * b), Shape{trials, 1, tokens}));
  const Var rbf = matmul(rbf_weights, matmul(rkeys, a_transposed));
  const std::vector<double> dot_out = dot.value().ToVector(), rbf_out = rbf.value().ToVector();

  double dot_sq = 0.0, rbf_sq = 0.0, rbf_factor = 0.0;
  for (int64_t t = 0; t < trials; ++t) {
    const double* z = &latents[t * kDim];
    std::vector<double> dot_mean(kDim), rbf_mean(kDim);
    for (int j = 0; j < kDim; ++j) {
      dot_mean[j] = z[j] + p.sigma[j] * eta[j];
      rbf_mean[j] = (b * p.q[j] + z[j]) / (1.0 + b);
    }
    const std::vector<double> dot_limit = p.ApplyA(dot_mean), rbf_limit = p.ApplyA(rbf_mean);
    for (int i = 0; i < kDim; ++i) {
      dot_sq += std::pow(dot_out[t * kDim + i] - dot_limit[i], 2);
      rbf_sq += std::pow(rbf_out[t * kDim + i] - rbf_limit[i], 2);
    }
    rbf_factor += RbfVarianceFactor(p, b, z);
  }
  const double n = static_cast<double>(trials), l = static_cast<double>(tokens);
  ErrorAtL e;
  e.error = std::sqrt(dot_sq / n);
  e.rbf_error = std::sqrt(rbf_sq / n);
  e.expected = std::sqrt(DotVarianceFactor(p) / l);
  e.rbf_expected = std::sqrt(rbf_factor / n / l);
  return e;
}

}  // namespace

void CheckExchangeableDemoOptions(const ExchangeableDemoOptions& o) {
  SP_CHECK(o.min_tokens >= 2, "--min-tokens must be >= 2, got ", o.min_tokens);
  SP_CHECK(o.max_tokens >= 2 * o.min_tokens && o.max_tokens <= (int64_t{1} << 20),
           "--max-tokens must be at least twice --min-tokens and at most 2^20, got ",
           o.max_tokens);
  SP_CHECK(o.trials >= 10 && o.trials <= 100000, "--trials must be in [10, 100000], got ",
           o.trials);
  SP_CHECK(o.rbf_bandwidth > 0.0 && std::isfinite(o.rbf_bandwidth),
           "--rbf-bandwidth must be > 0, got ", o.rbf_bandwidth);
  SP_CHECK(!o.out_dir.empty(), "--out must name a directory");
}

ExchangeableDemoResult RunExchangeableDemo(const ExchangeableDemoOptions& o, std::ostream& out) {
  CheckExchangeableDemoOptions(o);
  PrepareDemoDirectory(o.out_dir, o.overwrite);

  const Problem problem;
  Rng rng(o.seed);
  std::vector<double> tokens, errors, rbf_errors, expected, rbf_expected, log_l, log_e, log_r;
  for (int64_t l = o.min_tokens; l <= o.max_tokens; l *= 2) {
    const ErrorAtL e = MeasureAt(problem, o, l, rng);
    tokens.push_back(static_cast<double>(l));
    errors.push_back(e.error);
    rbf_errors.push_back(e.rbf_error);
    expected.push_back(e.expected);
    rbf_expected.push_back(e.rbf_expected);
    log_l.push_back(std::log(static_cast<double>(l)));
    log_e.push_back(std::log(e.error));
    log_r.push_back(std::log(e.rbf_error));
    out << "L " << l << ": error " << e.error << " (expected " << e.expected << "), rbf error "
        << e.rbf_error << " (expected " << e.rbf_expected << ")\n";
  }
  const LineFit fit = FitLine(log_l, log_e), rbf_fit = FitLine(log_l, log_r);

  ExchangeableDemoResult r;
  r.slope = fit.slope;
  r.rbf_slope = rbf_fit.slope;
  r.final_error = errors.back();
  r.rbf_final_error = rbf_errors.back();
  r.expected_final_error = expected.back();
  r.rbf_expected_final_error = rbf_expected.back();

  DemoTable table;
  table.Add("L", tokens);
  table.Add("error", errors);
  table.Add("rbf_error", rbf_errors);
  table.Add("expected_error", expected);
  table.Add("rbf_expected_error", rbf_expected);
  const std::filesystem::path dir(o.out_dir);
  WriteTextFile((dir / "exchangeable.csv").string(), table.ToCsv());

  auto line = [&](const LineFit& f) {
    std::vector<double> y;
    for (double x : log_l) y.push_back(std::exp(f.intercept + f.slope * x));
    return y;
  };
  char dot_name[64], rbf_name[64];
  std::snprintf(dot_name, sizeof dot_name, "dot fit, slope %.3f", fit.slope);
  std::snprintf(rbf_name, sizeof rbf_name, "rbf fit, slope %.3f", rbf_fit.slope);
  const std::vector<PlotSeries> series = {
      {"dot-product error", tokens, errors, true},
      {dot_name, tokens, line(fit), false},
      {"rbf error", tokens, rbf_errors, true},
      {rbf_name, tokens, line(rbf_fit), false},
      {"expected (dot)", tokens, expected, false},
  };
  PlotOptions plot;
  plot.title = "Attention over L exchangeable tokens: error of the conditional mean";
  plot.x_label = "tokens L";
  plot.y_label = "RMS error";
  plot.log_x = plot.log_y = true;
  plot.width = 760;
  WriteTextFile((dir / "error.svg").string(), LinePlotSvg(series, plot));

  DemoSummary summary;
  summary.SetText("demo", "exchangeable");
  summary.Set("slope", r.slope);
  summary.Set("rbf_slope", r.rbf_slope);
  summary.Set("final_error", r.final_error);
  summary.Set("rbf_final_error", r.rbf_final_error);
  summary.Set("expected_final_error", r.expected_final_error);
  summary.Set("rbf_expected_final_error", r.rbf_expected_final_error);
  summary.Set("final_tokens", tokens.back());
  summary.Set("trials", static_cast<double>(o.trials));
  summary.Set("rbf_bandwidth", o.rbf_bandwidth);
  WriteTextFile((dir / "summary.json").string(), summary.ToJson());
  out << "slope " << r.slope << ", rbf slope " << r.rbf_slope << "; wrote " << o.out_dir
      << "/{exchangeable.csv, error.svg, summary.json}\n";
  return r;
}

}  // namespace stillpoint
