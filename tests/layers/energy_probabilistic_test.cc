// ProbabilisticAttention (Movellan & Gabbur): EM value inference, key
// adaptation and clamped-value belief propagation (docs/seeds.md,
// seed 004, checks P1-P5).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <vector>

#include "framework/gradcheck.h"
#include "framework/ops.h"
#include "layers/attention.h"
#include "layers/probabilistic_attention.h"
#include "tests/layers/energy_test_util.h"

namespace stillpoint::energy_probabilistic_test {
namespace {

using testing_energy::CheckParameterGradients;
using testing_energy::DenseJacobian;
using testing_energy::Randn;
using testing_energy::RandnVar;

ProbabilisticAttentionOptions SmallOptions(int64_t dim, int64_t heads) {
  ProbabilisticAttentionOptions options;
  options.dim = dim;
  options.heads = heads;
  options.dtype = DType::kFloat64;
  return options;
}

// A raw value-inference problem: logits a [1, 1, N, S], values mu [1, 1, S, dv], uniform beta.
ProbabilisticContext RawContext(const Tensor& logits, const Tensor& values, double beta) {
  ProbabilisticContext ctx;
  ctx.logits = Var(logits);
  ctx.values = Var(values);
  ctx.value_precision = Var(Tensor::Full({1, 1, 1, 1}, beta, DType::kFloat64));
  return ctx;
}

// P1: beta = 0, uniform alpha = 1/sqrt(d) and magnitude priors give softmax
// attention with scale alpha: the same output as MultiHeadAttention with
// those weights, after one EM step and at the fixed point.
TEST(ProbabilisticAttentionTest, ZeroValuePrecisionIsSoftmaxAttention) {
  Rng rng(1);
  const int64_t D = 6, H = 2;
  AttentionOptions mha_options;
  mha_options.bias = false;
  mha_options.dtype = DType::kFloat64;
  MultiHeadAttention mha(D, H, rng, mha_options);
  Var x = RandnVar({2, 3, D}, rng), context = RandnVar({2, 4, D}, rng);
  const Tensor reference = mha.Forward(x, context).value();
  for (int steps : {1, 7}) {
    ProbabilisticAttentionOptions options = SmallOptions(D, H);
    options.solve.steps = steps;
    ProbabilisticAttention layer(options, rng);
    EXPECT_NEAR(layer.query_precision().value().at(0), 1.0 / std::sqrt(3.0), 1e-15);
    EXPECT_FALSE(layer.HasParameter("log_value_precision"));  // beta = 0 exactly
    layer.LoadParameters({{"log_query_precision", layer.parameter("log_query_precision").value()},
                          {"wq.weight", mha.wq()->weight().value()},
                          {"wk.weight", mha.wk()->weight().value()},
                          {"wv.weight", mha.wv()->weight().value()},
                          {"wo.weight", mha.wo()->weight().value()}});
    EXPECT_LT(MaxAbsDiff(layer.Forward(x, context).value(), reference), 1e-12) << steps;
  }
}

// Reference for the expansion: Cov_w[mu] v0 with w the beta = 0 weights.
std::vector<double> CovarianceTimesMean(const Tensor& logits, const Tensor& values, int64_t n) {
  const int64_t S = values.dim(2), dv = values.dim(3);
  std::vector<double> w(S);
  double top = -INFINITY, total = 0.0;
  for (int64_t j = 0; j < S; ++j) top = std::max(top, logits.at(n * S + j));
  for (int64_t j = 0; j < S; ++j) total += (w[j] = std::exp(logits.at(n * S + j) - top));
  std::vector<double> mean(dv, 0.0);
  for (int64_t j = 0; j < S; ++j) {
    w[j] /= total;
    for (int64_t k = 0; k < dv; ++k) mean[k] += w[j] * values.at(j * dv + k);
  }
  // Cov v0 = sum_j w_j mu_j (mu_j . v0) - v0 (v0 . v0).
  double mean_sq = 0.0;
  for (double m : mean) mean_sq += m * m;
  std::vector<double> out(dv, 0.0);
  for (int64_t j = 0; j < S; ++j) {
    double dot = 0.0;
    for (int64_t k = 0; k < dv; ++k) dot += values.at(j * dv + k) * mean[k];
    for (int64_t k = 0; k < dv; ++k) out[k] += w[j] * values.at(j * dv + k) * dot;
  }
  for (int64_t k = 0; k < dv; ++k) out[k] -= mean[k] * mean_sq;
  return out;
}

// P2: v*(beta) = v0 + beta Cov_w[mu] v0 + O(beta^2): the residual of the
// first-order term shrinks linearly with beta.
TEST(ProbabilisticAttentionTest, FirstOrderSlopeInValuePrecision) {
  Rng rng(2);
  Tensor logits = Randn({1, 1, 1, 6}, rng);
  Tensor values = Randn({1, 1, 6, 3}, rng);
  ProbabilisticAttention layer(SmallOptions(3, 1), rng);
  const std::vector<double> slope = CovarianceTimesMean(logits, values, 0);
  std::vector<double> residuals;
  for (double beta : {1e-2, 1e-3, 1e-4}) {
    ProbabilisticContext ctx = RawContext(logits, values, beta);
    Tensor v0 = matmul(softmax(Var(logits)), Var(values)).value();
    EnergyTraceOptions options;
    options.max_steps = 100;
    options.tolerance = 1e-15;
    EnergyTrace trace = TraceUpdates(layer, v0, ctx, options);
    ASSERT_TRUE(trace.converged) << beta;
    double sq = 0.0;
    for (int64_t k = 0; k < 3; ++k) {
      const double r = (trace.final_state.at(k) - v0.at(k)) / beta - slope[k];
      sq += r * r;
    }
    residuals.push_back(std::sqrt(sq));
  }
  EXPECT_GT(residuals[0], 0.0);
  EXPECT_NEAR(residuals[1] / residuals[0], 0.1, 0.02);
  EXPECT_NEAR(residuals[2] / residuals[1], 0.1, 0.02);
}

// P3: EM never increases the energy and converges at beta = 2; at the fixed
// point the Jacobian of the EM map is beta Cov_w[mu], a contraction here.
TEST(ProbabilisticAttentionTest, EmIsMonotoneAndJacobianIsBetaCovariance) {
  Rng rng(3);
  const int64_t N = 4, S = 6, dv = 3;
  const double beta = 2.0;
  Tensor logits = Randn({1, 1, N, S}, rng);
  Tensor values = Randn({1, 1, S, dv}, rng, 0.4);
  ProbabilisticAttention layer(SmallOptions(dv, 1), rng);
  ProbabilisticContext ctx = RawContext(logits, values, beta);
  EnergyTraceOptions options;
  options.max_steps = 300;
  options.tolerance = 1e-13;
  EnergyTrace trace =
      TraceUpdates(layer, matmul(softmax(Var(logits)), Var(values)).value(), ctx, options);
  EXPECT_TRUE(trace.converged);
  EXPECT_EQ(trace.CountIncreases(1e-12), 0) << trace.MaxIncrease();
  EXPECT_LT(trace.energies.back()[0], trace.energies.front()[0]);

  // J = beta Cov_w[mu] per query (block diagonal over queries).
  const Tensor v = trace.final_state;
  Eigen::MatrixXd jacobian = DenseJacobian([&](const Var& z) { return layer.Update(z, ctx); }, v);
  Tensor w = layer.Responsibilities(Var(v), ctx).value();
  double spectral = 0.0;
  for (int64_t n = 0; n < N; ++n) {
    Eigen::MatrixXd cov = Eigen::MatrixXd::Zero(dv, dv);
    Eigen::VectorXd mean = Eigen::VectorXd::Zero(dv);
    for (int64_t j = 0; j < S; ++j) {
      Eigen::VectorXd m(dv);
      for (int64_t k = 0; k < dv; ++k) m(k) = values.at(j * dv + k);
      cov.noalias() += w.at(n * S + j) * m * m.transpose();
      mean += w.at(n * S + j) * m;
    }
    cov.noalias() -= mean * mean.transpose();
    Eigen::MatrixXd block = jacobian.block(n * dv, n * dv, dv, dv);
    EXPECT_LT((block - beta * cov).cwiseAbs().maxCoeff(), 1e-12) << "query " << n;
    Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> eigen(beta * cov);
    spectral = std::max(spectral, eigen.eigenvalues().maxCoeff());
  }
  EXPECT_LT(spectral, 1.0);
}

// The contraction option bounds the EM map's Jacobian beta Cov_w(mu) below c
// at every state, whatever the values and beta learned: with large values
// and a large value precision the map expands (the fixed point region holds
// saddles) without it, and its largest eigenvalue stays below c with it.
TEST(ProbabilisticAttentionTest, ContractionBoundsTheEmJacobianEverywhere) {
  const auto largest_eigenvalue = [](double contraction) {
    Rng rng(11);
    ProbabilisticAttentionOptions o = SmallOptions(4, 1);
    o.value_precision = 3.0;
    o.contraction = contraction;
    ProbabilisticAttention layer(o, rng);
    const Var x = RandnVar({1, 5, 4}, rng, 2.0);
    const ProbabilisticProblem problem = layer.Prepare(x, x);
    double largest = -std::numeric_limits<double>::infinity();
    for (int trial = 0; trial < 8; ++trial) {
      // States anywhere near the values, not only the fixed point.
      const Tensor v = Randn(problem.initial_state.shape(), rng, 2.0);
      const Eigen::MatrixXd j =
          DenseJacobian([&](const Var& z) { return layer.Update(z, problem.context); }, v);
      const Eigen::MatrixXd symmetric = 0.5 * (j + j.transpose());
      EXPECT_LT((j - symmetric).cwiseAbs().maxCoeff(), 1e-10);  // beta Cov_w(mu)
      Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> eigen(symmetric);
      EXPECT_GT(eigen.eigenvalues().minCoeff(), -1e-10);  // positive semidefinite
      largest = std::max(largest, eigen.eigenvalues().maxCoeff());
    }
    return largest;
  };
  EXPECT_GT(largest_eigenvalue(0.0), 1.0);
  EXPECT_LT(largest_eigenvalue(0.9), 0.9);
  EXPECT_LT(largest_eigenvalue(0.5), 0.5);
}

// T6 for EM: the energy never increases along EM updates, across beta.
TEST(ProbabilisticAttentionTest, EmNeverIncreasesEnergyAcrossBeta) {
  for (double beta : {0.25, 1.0, 4.0, 16.0}) {
    SCOPED_TRACE(beta);
    Rng rng(static_cast<uint64_t>(4 * beta));
    Tensor logits = Randn({20, 2, 3, 8}, rng);
    Tensor values = Randn({20, 2, 8, 4}, rng);
    ProbabilisticAttention layer(SmallOptions(4, 1), rng);
    ProbabilisticContext ctx;
    ctx.logits = Var(logits);
    ctx.values = Var(values);
    ctx.value_precision = Var(Tensor::Full({1, 2, 1, 1}, beta, DType::kFloat64));
    EnergyTraceOptions options;
    options.max_steps = 50;
    EnergyTrace trace = TraceUpdates(layer, Randn({20, 2, 3, 4}, rng), ctx, options);
    EXPECT_EQ(trace.CountIncreases(1e-10), 0) << trace.MaxIncrease();
    EXPECT_LT(trace.energies.back()[0], trace.energies.front()[0]);
  }
}

// The energy is -log p_i(q_i, v) up to a constant, also with per-key
// precisions and magnitude priors, and EM (eq 15) does not increase it.
TEST(ProbabilisticAttentionTest, EnergyIsNegativeLogMixtureWithPerKeyPrecisions) {
  Rng rng(4);
  const int64_t N = 3, S = 3, D = 2;
  ProbabilisticAttentionOptions options = SmallOptions(D, 1);
  options.solve.steps = 0;
  ProbabilisticAttention layer(options, rng);
  Var x = RandnVar({1, N, D}, rng);
  ProbabilisticAttentionInputs inputs;
  inputs.key_precision = Var(RandomUniform({1, 1, S}, 0.5, 2.0, DType::kFloat64, rng));
  inputs.value_precision = Var(RandomUniform({1, 1, S}, 0.5, 2.0, DType::kFloat64, rng));
  ProbabilisticProblem problem = layer.Prepare(x, x, inputs);

  // Explicit -log sum_j pi_ij N(q_i; xi_j, 1/alpha_j) N(v; mu_j, 1/beta_j).
  const Tensor q = matmul(x, layer.parameter("wq.weight")).value();
  const Tensor xi = matmul(x, layer.parameter("wk.weight")).value();
  const Tensor mu = matmul(x, layer.parameter("wv.weight")).value();
  auto neg_log_p = [&](const Tensor& v) {
    double total = 0.0;
    for (int64_t i = 0; i < N; ++i) {
      std::vector<double> log_terms(S);
      for (int64_t j = 0; j < S; ++j) {
        const double a = inputs.key_precision.value().at(j);
        const double b = inputs.value_precision.value().at(j);
        double xi_sq = 0, mu_sq = 0, dq = 0, dvv = 0;
        for (int64_t k = 0; k < D; ++k) {
          xi_sq += xi.at(j * D + k) * xi.at(j * D + k);
          mu_sq += mu.at(j * D + k) * mu.at(j * D + k);
          dq += std::pow(q.at(i * D + k) - xi.at(j * D + k), 2);
          dvv += std::pow(v.at(i * D + k) - mu.at(j * D + k), 2);
        }
        const double log_prior = 0.5 * a * xi_sq + 0.5 * b * mu_sq;  // unnormalised over j
        log_terms[j] = log_prior + 0.5 * D * std::log(a / (2 * std::numbers::pi)) - 0.5 * a * dq +
                       0.5 * D * std::log(b / (2 * std::numbers::pi)) - 0.5 * b * dvv;
      }
      // The prior's normaliser over j does not depend on v: leave it out.
      const double top = *std::max_element(log_terms.begin(), log_terms.end());
      double sum = 0.0;
      for (double t : log_terms) sum += std::exp(t - top);
      total -= top + std::log(sum);
    }
    return total;
  };
  Tensor v1 = Randn({1, 1, N, D}, rng), v2 = Randn({1, 1, N, D}, rng);
  const double e1 = layer.Energy(Var(v1), problem.context).item();
  const double e2 = layer.Energy(Var(v2), problem.context).item();
  EXPECT_NEAR(e1 - e2, neg_log_p(v1) - neg_log_p(v2), 1e-12);

  EnergyTraceOptions trace_options;
  trace_options.max_steps = 50;
  EnergyTrace trace = TraceUpdates(layer, v1, problem.context, trace_options);
  EXPECT_EQ(trace.CountIncreases(1e-12), 0) << trace.MaxIncrease();
  EXPECT_LT(trace.step_norms.back()[0], 1e-8);
}

// P4: the key-adaptation table, d = 1, keys (0, 4), queries (-1, 1, 3, 5),
// alpha = 1, uniform pi.
TEST(KeyAdaptationTest, MatchesPublishedTable) {
  Var queries(Tensor::FromVector({1, 1, 4, 1}, {-1, 1, 3, 5}, DType::kFloat64));
  Var keys(Tensor::FromVector({1, 1, 2, 1}, {0, 4}, DType::kFloat64));
  Var alpha(Tensor::Ones({1, 1, 1}, DType::kFloat64));
  struct Row {
    double lambda;
    double one_step[2];
    double converged[2];
    double precision;
  };
  const Row rows[] = {{0.0, {0.01800464, 3.98199536}, {0.01867868, 3.98132132}, 0.93078165},
                      {1.0, {0.01200309, 3.98799691}, {0.01229710, 3.98770290}, 0.93154961}};
  for (const Row& row : rows) {
    SCOPED_TRACE(row.lambda);
    KeyAdaptationOptions options;
    options.key_prior_precision = row.lambda;
    options.iterations = 1;
    KeyAdaptationResult one = AdaptKeys(queries, keys, alpha, Var(), options);
    EXPECT_NEAR(one.keys.value().at(0), row.one_step[0], 5e-9);
    EXPECT_NEAR(one.keys.value().at(1), row.one_step[1], 5e-9);
    options.iterations = 200;
    KeyAdaptationResult converged = AdaptKeys(queries, keys, alpha, Var(), options);
    EXPECT_NEAR(converged.keys.value().at(0), row.converged[0], 5e-9);
    EXPECT_NEAR(converged.keys.value().at(1), row.converged[1], 5e-9);
    for (std::size_t t = 1; t < converged.log_posterior.size(); ++t) {
      ASSERT_GE(converged.log_posterior[t], converged.log_posterior[t - 1] - 1e-12) << t;
    }
    if (row.lambda == 0.0) {
      EXPECT_NEAR(converged.log_posterior.front(), -8.41203, 5e-6);
      EXPECT_NEAR(one.log_posterior.back(), -8.41136, 5e-6);
    }
    // The ML precision update (Gamma shape 1, rate 0) at the converged keys.
    KeyAdaptationOptions precision;
    precision.iterations = 1;
    precision.key_prior_precision = std::numeric_limits<double>::infinity();
    precision.adapt_precision = true;
    KeyAdaptationResult alpha_update = AdaptKeys(queries, converged.keys, alpha, Var(), precision);
    EXPECT_NEAR(alpha_update.key_precision.value().at(0), row.precision, 5e-9);
    EXPECT_EQ(alpha_update.keys.value().at(0), converged.keys.value().at(0));
  }
}

// The reference code recentres the prior on the current key, which drifts to
// the lambda = 0 (ML) point: P4 tells the two apart.
TEST(KeyAdaptationTest, RecentredPriorConvergesToMaximumLikelihoodPoint) {
  Var queries(Tensor::FromVector({1, 1, 4, 1}, {-1, 1, 3, 5}, DType::kFloat64));
  Var keys(Tensor::FromVector({1, 1, 2, 1}, {0, 4}, DType::kFloat64));
  Var alpha(Tensor::Ones({1, 1, 1}, DType::kFloat64));
  KeyAdaptationOptions options;
  options.key_prior_precision = 1.0;
  options.recentre_prior = true;
  options.iterations = 2000;
  KeyAdaptationResult result = AdaptKeys(queries, keys, alpha, Var(), options);
  EXPECT_NEAR(result.keys.value().at(0), 0.01867868, 5e-8);
  EXPECT_NEAR(result.keys.value().at(1), 3.98132132, 5e-8);
}

TEST(KeyAdaptationTest, MapEmWithPrecisionIsMonotone) {
  Rng rng(5);
  Var queries = RandnVar({2, 2, 7, 3}, rng), keys = RandnVar({2, 2, 4, 3}, rng);
  Var alpha(RandomUniform({2, 2, 4}, 0.5, 2.0, DType::kFloat64, rng));
  Var log_prior = RandnVar({2, 2, 1, 4}, rng);
  KeyAdaptationOptions options;
  options.iterations = 30;
  options.key_prior_precision = 0.5;
  options.adapt_precision = true;
  options.precision_prior_shape = 2.0;
  options.precision_prior_rate = 0.5;
  KeyAdaptationResult result = AdaptKeys(queries, keys, alpha, log_prior, options);
  ASSERT_EQ(result.log_posterior.size(), 31u);
  for (std::size_t t = 1; t < result.log_posterior.size(); ++t) {
    EXPECT_GE(result.log_posterior[t], result.log_posterior[t - 1] - 1e-10) << t;
  }
  EXPECT_GT(result.log_posterior.back(), result.log_posterior.front() + 1e-3);
  // lambda = infinity freezes the keys.
  options.key_prior_precision = std::numeric_limits<double>::infinity();
  options.adapt_precision = false;
  EXPECT_EQ(
      MaxAbsDiff(AdaptKeys(queries, keys, alpha, log_prior, options).keys.value(), keys.value()),
      0.0);
}

// P5: belief propagation with clamped values.
TEST(ValueBeliefTest, InvariantsOfClampedValuePropagation) {
  Rng rng(6);
  const int64_t N = 5, d = 2, dv = 3;
  Var q = RandnVar({1, 1, N, d}, rng), xi = RandnVar({1, 1, N, d}, rng);
  Var mu0 = RandnVar({1, 1, N, dv}, rng), clamped = RandnVar({1, 1, N, dv}, rng);
  Var alpha(Tensor::Full({1, 1, 1}, 1.5, DType::kFloat64));
  Var beta(Tensor::Full({1, 1, 1}, 0.7, DType::kFloat64));
  Tensor all = Tensor::Ones({1, N}, DType::kFloat64);

  // m = n and lambda_mu = 0: mu_j is the weighted mean of the clamped values,
  // weighted by the E-step responsibilities.
  ValueBeliefOptions options;
  options.iterations = 1;
  ValueBeliefResult result =
      PropagateClampedValues(q, xi, alpha, mu0, beta, Var(), clamped, all, options);
  Tensor w(Shape{N, N}, DType::kFloat64);
  for (int64_t i = 0; i < N; ++i) {
    std::vector<double> l(N);
    double top = -INFINITY, total = 0.0;
    for (int64_t j = 0; j < N; ++j) {
      double dq = 0.0, dvv = 0.0;
      for (int64_t k = 0; k < d; ++k)
        dq += std::pow(q.value().at(i * d + k) - xi.value().at(j * d + k), 2);
      for (int64_t k = 0; k < dv; ++k) {
        dvv += std::pow(clamped.value().at(i * dv + k) - mu0.value().at(j * dv + k), 2);
      }
      l[j] = -0.75 * dq - 0.35 * dvv;
      top = std::max(top, l[j]);
    }
    for (int64_t j = 0; j < N; ++j) total += std::exp(l[j] - top);
    for (int64_t j = 0; j < N; ++j) w.set(i * N + j, std::exp(l[j] - top) / total);
  }
  for (int64_t j = 0; j < N; ++j) {
    double weight = 0.0;
    std::vector<double> mean(dv, 0.0);
    for (int64_t i = 0; i < N; ++i) {
      weight += w.at(i * N + j);
      for (int64_t k = 0; k < dv; ++k) mean[k] += w.at(i * N + j) * clamped.value().at(i * dv + k);
    }
    for (int64_t k = 0; k < dv; ++k) {
      EXPECT_NEAR(result.values.value().at(j * dv + k), mean[k] / weight, 1e-12);
    }
  }

  // lambda_mu = infinity changes nothing.
  options.value_prior_precision = std::numeric_limits<double>::infinity();
  EXPECT_EQ(MaxAbsDiff(PropagateClampedValues(q, xi, alpha, mu0, beta, Var(), clamped, all, options)
                           .values.value(),
                       mu0.value()),
            0.0);

  // The log posterior never decreases, with partial clamping and every
  // re-estimation switched on.
  Tensor partial = Tensor::FromVector({1, N}, {1, 0, 1, 1, 0}, DType::kFloat64);
  options.iterations = 25;
  options.value_prior_precision = 0.3;
  options.adapt_value_precision = true;
  options.precision_prior_shape = 2.0;
  options.precision_prior_rate = 0.1;
  options.adapt_mixing = true;
  options.mixing_concentration = 1.5;
  result = PropagateClampedValues(q, xi, alpha, mu0, beta, Var(), clamped, partial, options);
  for (std::size_t t = 1; t < result.log_posterior.size(); ++t) {
    EXPECT_GE(result.log_posterior[t], result.log_posterior[t - 1] - 1e-10) << t;
  }
  EXPECT_GT(result.log_posterior.back(), result.log_posterior.front() + 1e-3);
  EXPECT_EQ(result.log_prior.shape(), (Shape{1, 1, 1, N}));
}

TEST(ProbabilisticAttentionTest, ForceClampedOutputOverwritesClampedUnits) {
  Rng rng(7);
  const int64_t N = 4, D = 4;
  ProbabilisticAttentionOptions options = SmallOptions(D, 2);
  options.value_precision = 0.5;
  options.value_belief.iterations = 3;
  options.solve.steps = 5;
  Var x = RandnVar({1, N, D}, rng);
  ProbabilisticAttentionInputs inputs;
  inputs.clamp_mask = Tensor::FromVector({1, N}, {1, 0, 0, 1}, DType::kFloat64);
  inputs.clamped_values = RandnVar({1, N, D}, rng);

  Rng init(8);
  ProbabilisticAttention plain(options, init);
  options.force_clamped_output = true;
  Rng same_init(8);
  ProbabilisticAttention forced(options, same_init);
  // Identity W_O, so outputs are the values themselves.
  Tensor eye = Tensor::Zeros({D, D}, DType::kFloat64);
  for (int64_t i = 0; i < D; ++i) eye.set(i * D + i, 1.0);
  Var(plain.parameter("wo.weight")).mutable_value().CopyFrom(eye);
  Var(forced.parameter("wo.weight")).mutable_value().CopyFrom(eye);
  Tensor a = plain.Forward(x, inputs).value(), b = forced.Forward(x, inputs).value();
  for (int64_t k = 0; k < D; ++k) {
    EXPECT_NEAR(b.at(0 * D + k), inputs.clamped_values.value().at(0 * D + k), 1e-14);
    EXPECT_NEAR(b.at(3 * D + k), inputs.clamped_values.value().at(3 * D + k), 1e-14);
    EXPECT_NEAR(a.at(1 * D + k), b.at(1 * D + k), 1e-14);  // free units agree
  }
  EXPECT_GT(std::abs(a.at(0) - b.at(0)), 1e-6);  // the reference behaviour differs
}

// The test-time inference a tool sets on a trained layer (clamps, key
// adaptation) gives exactly what the same options and inputs give when
// passed directly, and clearing it restores the layer's own forward.
TEST(ProbabilisticAttentionTest, TestTimeInferenceActsLikeOptionsAndInputs) {
  Rng rng(11);
  const int64_t N = 5, D = 4;
  ProbabilisticAttentionOptions options = SmallOptions(D, 2);
  options.value_precision = 0.5;
  options.solve.steps = 5;
  Var x = RandnVar({1, N, D}, rng);
  ProbabilisticAttentionInputs inputs;
  inputs.clamp_mask = Tensor::FromVector({1, N}, {0, 1, 0, 0, 1}, DType::kFloat64);
  inputs.clamped_values = RandnVar({1, N, D}, rng);

  Rng init(12);
  ProbabilisticAttention trained(options, init);
  const Tensor plain = trained.Forward(x).value().Clone();
  ProbabilisticAttentionOptions with_inference = options;
  with_inference.value_belief.iterations = 3;
  with_inference.value_belief.value_prior_precision = 0.1;
  with_inference.key_adaptation.iterations = 2;
  Rng same_init(12);
  ProbabilisticAttention reference(with_inference, same_init);
  const Tensor expected = reference.Forward(x, inputs).value();

  ProbabilisticAttention::TestTimeInference inference;
  inference.value_belief = with_inference.value_belief;
  inference.key_adaptation = with_inference.key_adaptation;
  inference.clamp_mask = inputs.clamp_mask;
  inference.clamped_values = inputs.clamped_values;
  trained.SetTestTimeInference(inference);
  const Tensor got = trained.Forward(x).value().Clone();
  trained.ClearTestTimeInference();
  const Tensor cleared = trained.Forward(x).value();
  double moved = 0.0;
  for (int64_t i = 0; i < expected.numel(); ++i) {
    EXPECT_NEAR(got.at(i), expected.at(i), 1e-12) << i;
    EXPECT_EQ(cleared.at(i), plain.at(i)) << i;
    moved = std::max(moved, std::abs(got.at(i) - plain.at(i)));
  }
  EXPECT_GT(moved, 1e-4) << "the clamps and adaptation change the output";
}

ProbabilisticAttentionOptions GradcheckOptions() {
  ProbabilisticAttentionOptions options = SmallOptions(4, 2);
  options.value_precision = 0.6;
  options.projection_bias = true;
  options.solve.steps = 3;
  options.key_adaptation.iterations = 2;
  options.key_adaptation.adapt_precision = true;
  options.key_adaptation.precision_prior_shape = 2.0;
  options.key_adaptation.precision_prior_rate = 1.0;
  options.value_belief.iterations = 2;
  options.value_belief.value_prior_precision = 0.5;
  options.value_belief.adapt_value_precision = true;
  options.value_belief.precision_prior_shape = 2.0;
  options.value_belief.precision_prior_rate = 1.0;
  options.value_belief.adapt_mixing = true;
  options.value_belief.mixing_concentration = 2.0;
  return options;
}

TEST(ProbabilisticAttentionTest, GradcheckForward) {
  Rng rng(9);
  ProbabilisticAttention layer(GradcheckOptions(), rng);
  Var clamped = RandnVar({2, 3, 4}, rng);
  auto inputs_for = [&](const Var& values) {
    ProbabilisticAttentionInputs inputs;
    inputs.clamp_mask = Tensor::FromVector({2, 3}, {1, 0, 1, 0, 1, 0}, DType::kFloat64);
    inputs.clamped_values = values;
    inputs.mask.key_mask = Tensor::FromVector({2, 3}, {0, 0, 1, 0, 0, 0}, DType::kFloat64);
    return inputs;
  };
  auto r =
      CheckGradients([&](const VarList& in) { return layer.Forward(in[0], inputs_for(in[1])); },
                     {RandnVar({2, 3, 4}, rng, 0.7), clamped});
  EXPECT_TRUE(r) << r;

  Var x = RandnVar({2, 3, 4}, rng, 0.7);
  Tensor probe = Randn({2, 3, 4}, rng);
  auto loss = [&] { return sum(mul(layer.Forward(x, inputs_for(clamped)), Var(probe))); };
  auto p = CheckParameterGradients(layer, loss);
  EXPECT_TRUE(p) << p;
}

TEST(ProbabilisticAttentionTest, GradcheckPerKeyPrecisionInputs) {
  Rng rng(10);
  ProbabilisticAttentionOptions options = SmallOptions(4, 2);
  options.solve.steps = 4;
  ProbabilisticAttention layer(options, rng);
  Var x = RandnVar({1, 3, 4}, rng), context = RandnVar({1, 5, 4}, rng);
  auto f = [&](const VarList& in) {
    ProbabilisticAttentionInputs inputs;
    inputs.key_precision = in[0];
    inputs.value_precision = in[1];
    inputs.log_prior = in[2];
    return layer.Forward(x, context, inputs);
  };
  auto r = CheckGradients(f, {Var(RandomUniform({1, 2, 5}, 0.5, 1.5, DType::kFloat64, rng)),
                              Var(RandomUniform({1, 2, 5}, 0.2, 0.8, DType::kFloat64, rng)),
                              RandnVar({1, 1, 3, 5}, rng)});
  EXPECT_TRUE(r) << r;
}

TEST(ProbabilisticAttentionTest, RejectsBadPrecisionsAndClamping) {
  Rng rng(11);
  ProbabilisticAttentionOptions options = SmallOptions(4, 1);
  ProbabilisticAttention layer(options, rng);
  Var x = RandnVar({1, 3, 4}, rng);
  ProbabilisticAttentionInputs inputs;
  inputs.key_precision = Var(Tensor::Full({1, 1, 3}, -1.0, DType::kFloat64));
  EXPECT_THROW(layer.Forward(x, inputs), Error);
  options.value_belief.iterations = 1;
  ProbabilisticAttention belief(options, rng);
  EXPECT_THROW(belief.Forward(x), Error);  // no clamp mask
}

}  // namespace
}  // namespace stillpoint::energy_probabilistic_test
