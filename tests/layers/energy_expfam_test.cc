// ExpFamAttention (Shim): attention as the gradient of a log-normaliser
// (docs/seeds.md, seeds 000/002, checks S1, S2, S4, S5, S6 and S7b).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "framework/gradcheck.h"
#include "framework/ops.h"
#include "layers/expfam_attention.h"
#include "tests/layers/energy_test_util.h"

namespace stillpoint::energy_expfam_test {
namespace {

using testing_energy::CheckParameterGradients;
using testing_energy::DenseHessian;
using testing_energy::DenseJacobian;
using testing_energy::Randn;
using testing_energy::RandnVar;

ExpFamAttentionOptions Options(ExpFamMeasure measure, int64_t dim, int64_t heads) {
  ExpFamAttentionOptions options;
  options.measure = measure;
  options.dim = dim;
  options.heads = heads;
  options.dtype = DType::kFloat64;
  return options;
}

Tensor Vector(const std::vector<double>& values) {
  return Tensor::FromVector({1, 1, static_cast<int64_t>(values.size())}, values, DType::kFloat64);
}

// S1 / T1: for the discrete measure, autodiff of G = lse_b(X eta) is
// X^T softmax(b X eta) and the Hessian is b X^T (diag p - p p^T) X:
// symmetric positive semidefinite, and it matches finite differences.
TEST(ExpFamAttentionTest, DiscreteGradientAndHessian) {
  Rng rng(1);
  const int64_t d = 8, S = 5;
  const double beta = 1.7;
  ExpFamAttentionOptions options = Options(ExpFamMeasure::kDiscrete, d, 1);
  options.beta = beta;
  options.project_patterns = false;
  ExpFamAttention layer(options, rng);
  Tensor x = Randn({1, S, d}, rng);
  ExpFamContext ctx = layer.Prepare(Var(x));
  Tensor eta = Randn({1, 1, d}, rng);

  auto log_partition = [&](const Var& e) { return sum(layer.LogPartition(e, ctx)); };
  Var leaf(eta.Clone(), true);
  Var autodiff = grad({log_partition(leaf)}, {leaf})[0];
  // X^T softmax(b X eta), by hand.
  std::vector<double> p(S);
  double top = -INFINITY, total = 0.0;
  for (int64_t s = 0; s < S; ++s) {
    double dot = 0.0;
    for (int64_t k = 0; k < d; ++k) dot += x.at(s * d + k) * eta.at(k);
    p[s] = beta * dot;
    top = std::max(top, p[s]);
  }
  for (double& v : p) total += (v = std::exp(v - top));
  for (double& v : p) v /= total;
  Eigen::MatrixXd xm(S, d);
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t k = 0; k < d; ++k) xm(s, k) = x.at(s * d + k);
  }
  Eigen::VectorXd pv(S);
  for (int64_t s = 0; s < S; ++s) pv(s) = p[s];
  Eigen::VectorXd expected = xm.transpose() * pv;
  for (int64_t k = 0; k < d; ++k) {
    EXPECT_NEAR(autodiff.value().at(k), expected(k), 1e-12 * std::max(1.0, std::abs(expected(k))));
    EXPECT_NEAR(layer.LogPartitionGrad(Var(eta), ctx).value().at(k), expected(k), 1e-12);
  }

  Eigen::MatrixXd hessian = DenseHessian(log_partition, eta);
  Eigen::MatrixXd cov_p = Eigen::MatrixXd(pv.asDiagonal()) - pv * pv.transpose();
  Eigen::MatrixXd closed = beta * xm.transpose() * cov_p * xm;
  EXPECT_LT((hessian - closed).cwiseAbs().maxCoeff(), 1e-12);
  EXPECT_LT((hessian - hessian.transpose()).cwiseAbs().maxCoeff(), 1e-12);
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> eigen(hessian);
  EXPECT_GE(eigen.eigenvalues().minCoeff(), -1e-12);
  // Finite differences of the analytic gradient.
  const double h = 1e-5;
  for (int64_t k = 0; k < d; ++k) {
    Tensor plus = eta.Clone(), minus = eta.Clone();
    plus.set(k, eta.at(k) + h);
    minus.set(k, eta.at(k) - h);
    Tensor gp = layer.LogPartitionGrad(Var(plus), ctx).value();
    Tensor gm = layer.LogPartitionGrad(Var(minus), ctx).value();
    for (int64_t r = 0; r < d; ++r) {
      EXPECT_NEAR((gp.at(r) - gm.at(r)) / (2 * h), hessian(r, k), 1e-8);
    }
  }
}

// The fixed L of the Gaussian checks and its Sigma = L L^T.
void LoadScale(ExpFamAttention& layer, const std::vector<double>& l) {
  Var(layer.parameter("scale"))
      .mutable_value()
      .CopyFrom(Tensor::FromVector({1, 3, 3}, l, DType::kFloat64));
}

const std::vector<double> kScale = {0.9, 0.0, 0.0, 0.3, 0.7, 0.0, -0.2, 0.4, 0.5};

Eigen::Matrix3d SigmaOf(const std::vector<double>& l) {
  Eigen::Matrix3d lm;
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 3; ++c) lm(r, c) = l[r * 3 + c];
  }
  return lm * lm.transpose();
}

// S2 / T2: the Gaussian measure gives the affine "attention" mu + Sigma eta.
TEST(ExpFamAttentionTest, GaussianClosedForm) {
  Rng rng(2);
  ExpFamAttention layer(Options(ExpFamMeasure::kGaussian, 3, 1), rng);
  Var(layer.parameter("mu"))
      .mutable_value()
      .CopyFrom(Tensor::FromVector({1, 3}, {1.0, -1.0, 0.5}, DType::kFloat64));
  LoadScale(layer, kScale);
  const Eigen::Matrix3d sigma = SigmaOf(kScale);
  const Eigen::Vector3d mu(1.0, -1.0, 0.5), eta(0.2, 0.1, -0.3);
  ExpFamContext ctx = layer.Prepare(Var());
  Var leaf(Vector({0.2, 0.1, -0.3}), true);
  Var g = layer.LogPartition(leaf, ctx);
  EXPECT_NEAR(g.item(), mu.dot(eta) + 0.5 * eta.dot(sigma * eta), 1e-14);
  Var autodiff = grad({sum(g)}, {leaf})[0];
  Eigen::Vector3d expected = mu + sigma * eta;
  for (int k = 0; k < 3; ++k) {
    EXPECT_NEAR(autodiff.value().at(k), expected(k), 1e-12);
    EXPECT_NEAR(layer.LogPartitionGrad(leaf, ctx).value().at(k), expected(k), 1e-12);
  }
}

// S4 / T2: the Gaussian-mixture measure is softmax attention over the means
// with a log-prior bias plus the skip term Sigma eta.
TEST(ExpFamAttentionTest, GaussianMixtureClosedForm) {
  Rng rng(3);
  ExpFamAttentionOptions options = Options(ExpFamMeasure::kMixture, 3, 1);
  options.components = 3;
  ExpFamAttention layer(options, rng);
  const std::vector<double> pi = {0.2, 0.3, 0.5};
  const std::vector<double> means = {1.0, 0.0, -1.0, 0.5, 2.0, 0.3, -1.2, 0.4, 0.8};
  Var(layer.parameter("means"))
      .mutable_value()
      .CopyFrom(Tensor::FromVector({1, 3, 3}, means, DType::kFloat64));
  // Unnormalised log weights: the layer normalises them.
  Var(layer.parameter("log_weights"))
      .mutable_value()
      .CopyFrom(Tensor::FromVector(
          {1, 3}, {std::log(pi[0]) + 2.0, std::log(pi[1]) + 2.0, std::log(pi[2]) + 2.0},
          DType::kFloat64));
  LoadScale(layer, kScale);
  const Eigen::Matrix3d sigma = SigmaOf(kScale);
  const Eigen::Vector3d eta(0.2, 0.1, -0.3);
  std::vector<double> w(3);
  double total = 0.0, lse_arg = 0.0;
  for (int n = 0; n < 3; ++n) {
    double dot = 0.0;
    for (int k = 0; k < 3; ++k) dot += means[n * 3 + k] * eta(k);
    w[n] = pi[n] * std::exp(dot);
    total += w[n];
  }
  lse_arg = std::log(total);
  Eigen::Vector3d expected = sigma * eta;
  for (int n = 0; n < 3; ++n) {
    for (int k = 0; k < 3; ++k) expected(k) += w[n] / total * means[n * 3 + k];
  }
  ExpFamContext ctx = layer.Prepare(Var());
  Var leaf(Vector({0.2, 0.1, -0.3}), true);
  Var g = layer.LogPartition(leaf, ctx);
  EXPECT_NEAR(g.item(), lse_arg + 0.5 * eta.dot(sigma * eta), 1e-14);
  Var autodiff = grad({sum(g)}, {leaf})[0];
  for (int k = 0; k < 3; ++k) {
    EXPECT_NEAR(autodiff.value().at(k), expected(k), 1e-12);
    EXPECT_NEAR(layer.LogPartitionGrad(leaf, ctx).value().at(k), expected(k), 1e-12);
  }
}

// S5 / T4: lse(y) = max over the simplex of nu.y + H(nu), attained at
// nu = softmax(y).
TEST(ExpFamAttentionTest, MaxEntropyDuality) {
  const std::vector<double> y = {0.0, 1.0, 3.0};
  Var yv(Tensor::FromVector({3}, y, DType::kFloat64));
  const double lse = logsumexp(yv).item();
  EXPECT_NEAR(lse, 3.1698460196, 1e-10);
  auto dual = [&](const std::vector<double>& nu) {
    double value = 0.0;
    for (int j = 0; j < 3; ++j) value += nu[j] * y[j] - (nu[j] > 0 ? nu[j] * std::log(nu[j]) : 0);
    return value;
  };
  const std::vector<double> nu_star = softmax(yv).value().ToVector();
  EXPECT_NEAR(dual(nu_star), lse, 1e-12);
  Rng rng(4);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<double> nu(3);
    double total = 0.0;
    for (double& v : nu) total += (v = -std::log(1.0 - rng.Uniform()));  // Dirichlet(1)
    for (double& v : nu) v /= total;
    EXPECT_LT(dual(nu), lse);
  }
}

// S6 / T4: the Bregman divergence of G = lse is a KL divergence with the
// arguments in the order B_G(eta1, eta2) = KL(p_eta2 || p_eta1) (the seed
// states the reverse).
TEST(ExpFamAttentionTest, BregmanIsReversedKl) {
  Rng rng(5);
  ExpFamAttentionOptions options = Options(ExpFamMeasure::kDiscrete, 3, 1);
  options.project_patterns = false;
  ExpFamAttention layer(options, rng);
  // Patterns = the standard basis, so G(eta) = lse(eta) (categorical family).
  ExpFamContext ctx = layer.Prepare(
      Var(Tensor::FromVector({1, 3, 3}, {1, 0, 0, 0, 1, 0, 0, 0, 1}, DType::kFloat64)));
  const Tensor eta1 = Vector({0.0, 1.0, 3.0}), eta2 = Vector({0.5, 0.0, 0.0});
  auto bregman = [&](const Tensor& a, const Tensor& b) {
    const double ga = layer.LogPartition(Var(a), ctx).item();
    const double gb = layer.LogPartition(Var(b), ctx).item();
    Tensor grad_b = layer.LogPartitionGrad(Var(b), ctx).value();
    double inner = 0.0;
    for (int k = 0; k < 3; ++k) inner += grad_b.at(k) * (a.at(k) - b.at(k));
    return ga - gb - inner;
  };
  auto kl = [&](const Tensor& a, const Tensor& b) {  // KL(p_a || p_b)
    Tensor pa = layer.LogPartitionGrad(Var(a), ctx).value();
    Tensor pb = layer.LogPartitionGrad(Var(b), ctx).value();
    double value = 0.0;
    for (int k = 0; k < 3; ++k) value += pa.at(k) * std::log(pa.at(k) / pb.at(k));
    return value;
  };
  EXPECT_NEAR(bregman(eta1, eta2), 1.0051261548, 1e-10);
  EXPECT_NEAR(bregman(eta2, eta1), 0.7491051196, 1e-10);
  EXPECT_NEAR(bregman(eta1, eta2), kl(eta2, eta1), 1e-12);
  EXPECT_NEAR(bregman(eta2, eta1), kl(eta1, eta2), 1e-12);
  EXPECT_GT(std::abs(bregman(eta1, eta2) - kl(eta1, eta2)), 0.2);  // the order matters
}

std::vector<ExpFamMeasure> AllMeasures() {
  return {ExpFamMeasure::kDiscrete, ExpFamMeasure::kGaussian, ExpFamMeasure::kMixture};
}

// The analytic gradient equals autodiff of the energy, CCCP never increases
// the energy, and the residual update is eta + grad G.
TEST(ExpFamAttentionTest, EnergyGradientCccpAndResidualForm) {
  for (ExpFamMeasure measure : AllMeasures()) {
    SCOPED_TRACE(ToString(measure));
    Rng rng(6);
    ExpFamAttentionOptions options = Options(measure, 6, 2);
    options.update = ExpFamUpdate::kCccp;
    options.beta = 1.3;
    ExpFamAttention layer(options, rng);
    Var patterns = measure == ExpFamMeasure::kDiscrete ? RandnVar({3, 5, 6}, rng) : Var();
    ExpFamContext ctx = layer.Prepare(patterns);
    Tensor eta = Randn({3, 4, 6}, rng);
    EXPECT_LT(MaxAbsDiff(layer.EnergyGrad(Var(eta), ctx).value(),
                         AutodiffEnergyGrad(layer, Var(eta), ctx).value()),
              1e-12);
    EXPECT_TRUE(layer.UpdateIsMonotone());
    EnergyTraceOptions trace_options;
    trace_options.max_steps = 40;
    EnergyTrace trace = TraceUpdates(layer, eta, ctx, trace_options);
    EXPECT_EQ(trace.CountIncreases(1e-12), 0) << trace.MaxIncrease();
    EXPECT_LT(trace.energies.back()[0], trace.energies.front()[0]);

    ExpFamAttentionOptions residual = options;
    residual.update = ExpFamUpdate::kResidual;
    Rng same(6);
    ExpFamAttention residual_layer(residual, same);
    EXPECT_FALSE(residual_layer.UpdateIsMonotone());
    Tensor expected = add(Var(eta), layer.LogPartitionGrad(Var(eta), ctx)).value();
    EXPECT_LT(MaxAbsDiff(residual_layer.Update(Var(eta), ctx).value(), expected), 1e-14);
  }
}

// S7b: with the Gaussian measure (mu = 0) and an exact layer norm, the
// residual update z <- LN((I + Sigma) z) is normalised power iteration on
// P (I + Sigma) P: its fixed point is the top eigenvector scaled to norm
// sqrt(D), reached at the rate lambda_2 / lambda_1, by plain iteration and by
// a forward solver (Anderson).
TEST(ExpFamAttentionTest, LayerNormEquilibriumIsTopEigenvector) {
  Rng rng(7);
  const int64_t D = 6;
  ExpFamAttentionOptions options = Options(ExpFamMeasure::kGaussian, D, 1);
  options.update = ExpFamUpdate::kResidual;
  options.layer_norm = true;
  options.layer_norm_eps = 0.0;
  options.layer_norm_affine = false;
  ExpFamAttention layer(options, rng);
  Var(layer.parameter("mu")).mutable_value().Fill(0.0);
  Tensor scale = Randn({1, D, D}, rng, 0.5);
  Var(layer.parameter("scale")).mutable_value().CopyFrom(scale);
  Eigen::MatrixXd l(D, D);
  for (int64_t r = 0; r < D; ++r) {
    for (int64_t c = 0; c < D; ++c) l(r, c) = scale.at(r * D + c);
  }

  Eigen::MatrixXd sigma = l * l.transpose();
  Eigen::MatrixXd p = Eigen::MatrixXd::Identity(D, D) - Eigen::MatrixXd::Constant(D, D, 1.0 / D);
  Eigen::MatrixXd m = p * (Eigen::MatrixXd::Identity(D, D) + sigma) * p;
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> eigen(m);
  const Eigen::VectorXd top = eigen.eigenvectors().col(D - 1) * std::sqrt(static_cast<double>(D));
  const double ratio = eigen.eigenvalues()(D - 2) / eigen.eigenvalues()(D - 1);
  ASSERT_LT(ratio, 0.9);
  auto distance_to_top = [&](const Tensor& z) {
    Eigen::VectorXd v = testing_energy::ToEigen(z);
    return std::min((v - top).norm(), (v + top).norm());
  };

  ExpFamContext ctx = layer.Prepare(Var());
  Tensor z0 = Randn({1, 1, D}, rng);
  EnergyTraceOptions trace_options;
  trace_options.max_steps = 400;
  trace_options.tolerance = 1e-13;
  EnergyTrace trace = TraceUpdates(layer, z0, ctx, trace_options);
  EXPECT_TRUE(trace.converged);
  EXPECT_LT(distance_to_top(trace.final_state), 1e-11);
  // Late in the iteration the steps shrink by lambda_2 / lambda_1 per step.
  const std::size_t t = trace.step_norms.size() / 2;
  EXPECT_NEAR(trace.step_norms[t][0] / trace.step_norms[t - 1][0], ratio, 1e-3);

  EnergySolveOptions solve;
  solve.mode = EnergySolveMode::kFixedPoint;
  solve.implicit.forward.type = ForwardSolverType::kAnderson;
  solve.implicit.forward.max_iterations = 200;
  solve.implicit.forward.stop_mode = StopMode::kAbsolute;
  solve.implicit.forward.absolute_tolerance = 1e-12;
  Tensor solved;
  {
    NoGrad no_grad;
    solved = layer.Solve(Var(layer.Update(Var(z0), ctx).value()), ctx, solve).value();
  }
  EXPECT_EQ(layer.last_solve().implicit.forward.termination_type, TerminationType::kConverged)
      << layer.last_solve().implicit.forward.BriefReport();
  EXPECT_LT(distance_to_top(solved), 1e-9);
}

TEST(ExpFamAttentionTest, GradcheckForward) {
  for (ExpFamMeasure measure : AllMeasures()) {
    SCOPED_TRACE(ToString(measure));
    Rng rng(8);
    ExpFamAttentionOptions options = Options(measure, 4, 2);
    options.components = 3;
    options.beta = 0.9;
    options.layer_norm = true;
    options.solve.steps = 2;
    ExpFamAttention layer(options, rng);
    testing_energy::RandomizeParameters(layer, rng, 0.4, [](const std::string& name) {
      return name == "beta" || name == "norm.gain";
    });
    const bool discrete = measure == ExpFamMeasure::kDiscrete;
    Var x = RandnVar({2, 3, 4}, rng), patterns = RandnVar({2, 4, 4}, rng);
    auto forward = [&](const Var& in, const Var& pats) {
      return discrete ? layer.Forward(in, pats) : layer.Forward(in);
    };
    auto r =
        CheckGradients([&](const VarList& in) { return forward(in[0], in[1]); }, {x, patterns});
    EXPECT_TRUE(r) << r;
    Tensor probe = Randn({2, 3, 4}, rng);
    auto p =
        CheckParameterGradients(layer, [&] { return sum(mul(forward(x, patterns), Var(probe))); });
    EXPECT_TRUE(p) << p;
  }
}

// Contraction c: each head's patterns have the norm sqrt(c / beta_h), and
// the CCCP update's Jacobian (beta Cov_p(X) per head, symmetric positive
// semi-definite) has its eigenvalues in [0, c] wherever it is taken, with
// large W_K, patterns and beta. The same layer without the rescaling
// expands (largest eigenvalue above 1), so the bound is the rescaling's.
TEST(ExpFamAttentionTest, ContractionBoundsTheUpdate) {
  const int64_t d = 6, heads = 2, dh = 3;
  const std::vector<double> betas = {5.0, 0.7};
  for (double c : {0.5, 0.9}) {
    SCOPED_TRACE("contraction " + std::to_string(c));
    double largest_unscaled = 0.0;
    for (double contraction : {c, 0.0}) {
      Rng rng(11);
      ExpFamAttentionOptions options = Options(ExpFamMeasure::kDiscrete, d, heads);
      options.update = ExpFamUpdate::kCccp;
      options.contraction = contraction;
      ExpFamAttention layer(options, rng);
      testing_energy::RandomizeParameters(layer, rng, 2.0,
                                          [](const std::string& name) { return name == "beta"; });
      Var(layer.parameter("beta"))
          .mutable_value()
          .CopyFrom(Tensor::FromVector({heads}, betas, DType::kFloat64));
      ExpFamContext ctx = layer.Prepare(RandnVar({1, 7, d}, rng, 3.0));
      if (contraction > 0.0) {
        const Tensor& x = ctx.patterns.value();  // [1, H, S, dh]
        for (int64_t h = 0; h < heads; ++h) {
          for (int64_t s = 0; s < 7; ++s) {
            double norm_sq = 0.0;
            for (int64_t k = 0; k < dh; ++k) norm_sq += std::pow(x.at((h * 7 + s) * dh + k), 2);
            EXPECT_NEAR(std::sqrt(norm_sq), std::sqrt(contraction / betas[h]), 1e-12);
          }
        }
      }
      for (double eta_scale : {0.0, 0.3, 1.0, 4.0}) {
        Tensor eta = Randn({1, 1, d}, rng, eta_scale);
        Eigen::MatrixXd jacobian =
            DenseJacobian([&](const Var& e) { return layer.Update(e, ctx); }, eta);
        EXPECT_LT((jacobian - jacobian.transpose()).cwiseAbs().maxCoeff(), 1e-12);
        Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> eigen(jacobian);
        EXPECT_GE(eigen.eigenvalues().minCoeff(), -1e-12);
        if (contraction > 0.0) {
          EXPECT_LE(eigen.eigenvalues().maxCoeff(), contraction + 1e-12)
              << "eta scale " << eta_scale;
        } else {
          largest_unscaled = std::max(largest_unscaled, eigen.eigenvalues().maxCoeff());
        }
      }
    }
    EXPECT_GT(largest_unscaled, 1.0);
  }
}

// Contraction is read by the discrete measure only, and must lie in [0, 1).
TEST(ExpFamAttentionTest, ContractionRange) {
  ExpFamAttentionOptions options = Options(ExpFamMeasure::kDiscrete, 4, 1);
  std::string error;
  for (double bad : {1.0, -0.1, 1.5, std::nan("")}) {
    options.contraction = bad;
    EXPECT_FALSE(options.IsValid(&error)) << bad;
    EXPECT_NE(error.find("contraction"), std::string::npos) << error;
  }
  options.contraction = 0.99;
  EXPECT_TRUE(options.IsValid(&error)) << error;
}

TEST(ExpFamAttentionTest, RejectsMisuse) {
  Rng rng(9);
  ExpFamAttention discrete(Options(ExpFamMeasure::kDiscrete, 4, 1), rng);
  EXPECT_THROW(discrete.Forward(RandnVar({1, 2, 4}, rng)), Error);
  ExpFamAttention gaussian(Options(ExpFamMeasure::kGaussian, 4, 1), rng);
  EXPECT_THROW(gaussian.Forward(RandnVar({1, 2, 4}, rng), RandnVar({1, 2, 4}, rng)), Error);
  EXPECT_THROW(ExpFamAttention(Options(ExpFamMeasure::kGaussian, 5, 2), rng), Error);
}

}  // namespace
}  // namespace stillpoint::energy_expfam_test
