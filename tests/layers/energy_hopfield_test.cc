// HopfieldAttention, HopfieldPooling and HopfieldLookup: the modern Hopfield
// energy, its CCCP update and the layer around it (docs/seeds.md,
// checks B1, T5, T6 and the Jacobian part of T10).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "framework/gradcheck.h"
#include "framework/ops.h"
#include "layers/attention.h"
#include "layers/hopfield.h"
#include "tests/layers/energy_test_util.h"

namespace stillpoint::energy_hopfield_test {
namespace {

using testing_energy::CheckParameterGradients;
using testing_energy::DenseHessian;
using testing_energy::DenseJacobian;
using testing_energy::Randn;
using testing_energy::RandnVar;

HopfieldOptions RawOptions(int64_t heads, int64_t head_dim, double beta) {
  HopfieldOptions options;
  options.state_size = heads * head_dim;
  options.heads = heads;
  options.head_dim = head_dim;
  options.beta = beta;
  options.dtype = DType::kFloat64;
  return options;
}

// Reference: softmax(beta xi K^T + mask) K per (sample, head, query), by loops.
// xi [B, H, N, d], keys [B, H, S, d], hidden(b, n, s) says whether the key is masked.
template <typename Hidden>
std::vector<double> ReferenceAttention(const Tensor& xi,
                                       const Tensor& keys,
                                       const std::vector<double>& beta,
                                       Hidden hidden) {
  const int64_t B = xi.dim(0), H = xi.dim(1), N = xi.dim(2), d = xi.dim(3), S = keys.dim(2);
  std::vector<double> out(xi.numel(), 0.0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t n = 0; n < N; ++n) {
        std::vector<double> logits(S, -INFINITY);
        double top = -INFINITY;
        for (int64_t s = 0; s < S; ++s) {
          if (hidden(b, n, s)) continue;
          double dot = 0.0;
          for (int64_t k = 0; k < d; ++k) {
            dot += xi.at(((b * H + h) * N + n) * d + k) * keys.at(((b * H + h) * S + s) * d + k);
          }
          logits[s] = beta[h] * dot;
          top = std::max(top, logits[s]);
        }
        double total = 0.0;
        for (int64_t s = 0; s < S; ++s) total += std::exp(logits[s] - top);
        for (int64_t s = 0; s < S; ++s) {
          const double p = std::exp(logits[s] - top) / total;
          for (int64_t k = 0; k < d; ++k) {
            out[((b * H + h) * N + n) * d + k] += p * keys.at(((b * H + h) * S + s) * d + k);
          }
        }
      }
    }
  }
  return out;
}

double MaxDiff(const std::vector<double>& a, const Tensor& b) {
  double worst = 0.0;
  for (int64_t i = 0; i < b.numel(); ++i) worst = std::max(worst, std::abs(a[i] - b.at(i)));
  return worst;
}

TEST(HopfieldEnergyTest, AnalyticGradientMatchesAutodiff) {
  Rng rng(1);
  HopfieldAttention layer(RawOptions(2, 3, 0.7), rng);
  Var(layer.beta()).mutable_value().CopyFrom(Tensor::FromVector({2}, {0.7, 2.5}, DType::kFloat64));
  HopfieldContext ctx{.keys = RandnVar({3, 2, 5, 3}, rng)};
  Var xi = RandnVar({3, 2, 4, 3}, rng);
  Var analytic = layer.EnergyGrad(xi, ctx);
  Var autodiff = AutodiffEnergyGrad(layer, xi, ctx);
  EXPECT_LT(MaxAbsDiff(analytic.value(), autodiff.value()), 1e-12);
}

// B1 / T5: one gradient step of size 1 on the energy is bare attention over
// the stored patterns; a step of 0.1 moves 10% of the way.
TEST(HopfieldEnergyTest, UnitGradientStepIsAttention) {
  Rng rng(2);
  const std::vector<double> beta = {0.5, 3.0};
  HopfieldAttention layer(RawOptions(2, 4, 1.0), rng);
  Var(layer.beta()).mutable_value().CopyFrom(Tensor::FromVector({2}, beta, DType::kFloat64));
  Tensor keys = Randn({2, 2, 6, 4}, rng);
  HopfieldContext ctx{.keys = Var(keys)};
  Tensor xi = Randn({2, 2, 3, 4}, rng);
  const std::vector<double> attention =
      ReferenceAttention(xi, keys, beta, [](int64_t, int64_t, int64_t) { return false; });

  // The gradient here is autodiff's, so this checks the energy, not the
  // hand-written gradient.
  Var unit_step = sub(Var(xi), AutodiffEnergyGrad(layer, Var(xi), ctx));
  EXPECT_LT(MaxDiff(attention, unit_step.value()), 1e-12);
  EXPECT_LT(MaxDiff(attention, layer.Update(Var(xi), ctx).value()), 1e-12);

  Tensor small_step = layer.GradientStep(Var(xi), ctx, 0.1).value();
  std::vector<double> tenth(xi.numel());
  for (int64_t i = 0; i < xi.numel(); ++i) tenth[i] = xi.at(i) + 0.1 * (attention[i] - xi.at(i));
  EXPECT_LT(MaxDiff(tenth, small_step), 1e-12);
}

// T5 with masks: hidden keys get no weight, in the update and the energy.
TEST(HopfieldEnergyTest, MaskedStepIsMaskedAttention) {
  Rng rng(3);
  const int64_t B = 2, N = 3, S = 5, d = 3;
  HopfieldAttention layer(RawOptions(1, d, 1.3), rng);
  Tensor keys = Randn({B, 1, S, d}, rng);
  Tensor xi = Randn({B, 1, N, d}, rng);
  AttentionMask mask;
  mask.key_mask = Tensor::FromVector({B, S}, {0, 0, 0, 1, 0, 1, 0, 0, 0, 0}, DType::kFloat64);
  HopfieldContext ctx{
      .keys = Var(keys),
      .mask = MakeAttentionMask(mask, /*causal=*/true, B, 1, N, S, DType::kFloat64)};
  auto hidden = [](int64_t b, int64_t n, int64_t s) {
    const bool padded = (b == 0 && s == 3) || (b == 1 && s == 0);
    const bool future = s > n + (S - N);
    return padded || future;
  };
  const std::vector<double> attention = ReferenceAttention(xi, keys, {1.3}, hidden);
  EXPECT_LT(MaxDiff(attention, layer.Update(Var(xi), ctx).value()), 1e-12);
  Var unit_step = sub(Var(xi), AutodiffEnergyGrad(layer, Var(xi), ctx));
  EXPECT_LT(MaxDiff(attention, unit_step.value()), 1e-12);

  // Moving a hidden key changes neither the energy nor the update.
  Tensor moved = keys.Clone();
  for (int64_t k = 0; k < d; ++k) moved.set((0 * S + 3) * d + k, 100.0 + k);
  HopfieldContext moved_ctx = ctx;
  moved_ctx.keys = Var(moved);
  EXPECT_LT(
      MaxAbsDiff(layer.Energy(Var(xi), ctx).value(), layer.Energy(Var(xi), moved_ctx).value()),
      1e-12);
  EXPECT_LT(
      MaxAbsDiff(layer.Update(Var(xi), ctx).value(), layer.Update(Var(xi), moved_ctx).value()),
      1e-12);
}

// T6: the CCCP update never increases the energy (100 random instances,
// d = 16, N = 32, each beta); steps shrink to zero; with Ramsauer's
// constants 0 <= E <= 2 M^2 after the first update.
TEST(HopfieldEnergyTest, CccpNeverIncreasesEnergyAcrossBeta) {
  for (double beta : {0.25, 1.0, 4.0, 16.0}) {
    SCOPED_TRACE(beta);
    Rng rng(static_cast<uint64_t>(100 * beta));
    HopfieldOptions options = RawOptions(1, 16, beta);
    options.energy_constants = true;
    HopfieldAttention layer(options, rng);
    Tensor keys = Randn({100, 1, 32, 16}, rng);
    HopfieldContext ctx{.keys = Var(keys)};
    EnergyTraceOptions trace_options;
    trace_options.max_steps = 60;
    EnergyTrace trace = TraceUpdates(layer, Randn({100, 1, 1, 16}, rng), ctx, trace_options);
    EXPECT_EQ(trace.CountIncreases(1e-12), 0) << "largest increase " << trace.MaxIncrease();
    for (int64_t b = 0; b < 100; ++b) {
      double max_norm_sq = 0.0;
      for (int64_t s = 0; s < 32; ++s) {
        double norm_sq = 0.0;
        for (int64_t k = 0; k < 16; ++k) norm_sq += std::pow(keys.at((b * 32 + s) * 16 + k), 2);
        max_norm_sq = std::max(max_norm_sq, norm_sq);
      }
      for (std::size_t t = 1; t < trace.energies.size(); ++t) {
        ASSERT_GE(trace.energies[t][b], -1e-12) << "sample " << b << " step " << t;
        ASSERT_LE(trace.energies[t][b], 2.0 * max_norm_sq + 1e-12) << "sample " << b;
      }
      // CCCP on E = 1/2 |xi|^2 - lse_b: the decrease is at least half the
      // squared step (the quadratic is 1-strongly convex), so the squared
      // steps are summable and the steps go to zero.
      for (std::size_t t = 0; t < trace.step_norms.size(); ++t) {
        ASSERT_GE(trace.energies[t][b] - trace.energies[t + 1][b],
                  0.5 * std::pow(trace.step_norms[t][b], 2) - 1e-12)
            << "sample " << b << " step " << t;
      }
      EXPECT_LT(trace.step_norms.back()[b], 0.1 * trace.step_norms.front()[b]) << "sample " << b;
    }
  }
}

// T10, Jacobian part: for the CCCP map f, I - J_f is the Hessian of the
// energy, and J_f = beta Cov_p[k] is symmetric positive semidefinite.
TEST(HopfieldEnergyTest, OneMinusJacobianIsHessian) {
  Rng rng(4);
  HopfieldAttention layer(RawOptions(1, 5, 1.7), rng);
  HopfieldContext ctx{.keys = RandnVar({1, 1, 7, 5}, rng)};
  Tensor xi = Randn({1, 1, 2, 5}, rng);
  Eigen::MatrixXd jacobian = DenseJacobian([&](const Var& z) { return layer.Update(z, ctx); }, xi);
  Eigen::MatrixXd hessian =
      DenseHessian([&](const Var& z) { return sum(layer.Energy(z, ctx)); }, xi);
  const int64_t n = xi.numel();
  Eigen::MatrixXd identity = Eigen::MatrixXd::Identity(n, n);
  EXPECT_LT((identity - jacobian - hessian).cwiseAbs().maxCoeff(), 1e-12);
  EXPECT_LT((jacobian - jacobian.transpose()).cwiseAbs().maxCoeff(), 1e-12);
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> eigen(jacobian);
  EXPECT_GE(eigen.eigenvalues().minCoeff(), -1e-12);
}

// The contraction option bounds the CCCP map's Jacobian beta K^T Cov_p K
// below c at every state: with large stored patterns and a large beta the
// map expands without it, and its largest eigenvalue stays below c with it.
TEST(HopfieldAttentionTest, ContractionBoundsTheJacobianEverywhere) {
  const auto largest_eigenvalue = [](double contraction) {
    Rng rng(12);
    HopfieldOptions o = RawOptions(1, 4, 2.0);
    o.query_field = true;
    o.contraction = contraction;
    HopfieldAttention layer(o, rng);
    const Var x = RandnVar({1, 6, 4}, rng, 3.0);
    const HopfieldProblem problem = layer.Prepare(x, x, x);
    double largest = -std::numeric_limits<double>::infinity();
    for (int trial = 0; trial < 8; ++trial) {
      const Tensor xi = Randn(problem.initial_state.shape(), rng, 2.0);
      const Eigen::MatrixXd j =
          DenseJacobian([&](const Var& z) { return layer.Update(z, problem.context); }, xi);
      EXPECT_LT((j - j.transpose()).cwiseAbs().maxCoeff(), 1e-10);
      Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> eigen(0.5 * (j + j.transpose()));
      largest = std::max(largest, eigen.eigenvalues().cwiseAbs().maxCoeff());
    }
    return largest;
  };
  EXPECT_GT(largest_eigenvalue(0.0), 1.0);
  EXPECT_LT(largest_eigenvalue(0.9), 0.9);
}

// update_steps = 0 is multi-head attention with scale beta: compare with a
// direct float64 computation of softmax(beta Q K^T) V W_O and with
// MultiHeadAttention holding the same weights.
TEST(HopfieldAttentionTest, ZeroStepsIsOneStepAttention) {
  Rng rng(5);
  const int64_t B = 2, N = 3, S = 4, D = 6, H = 2;
  HopfieldOptions options = RawOptions(H, D / H, 0.0);  // default beta 1/sqrt(3)
  options.solve.steps = 0;
  HopfieldAttention hopfield(options, rng);
  AttentionOptions mha_options;
  mha_options.bias = false;
  mha_options.dtype = DType::kFloat64;
  MultiHeadAttention mha(D, H, rng, mha_options);
  hopfield.LoadParameters({{"beta", hopfield.beta().value()},
                           {"wq.weight", mha.wq()->weight().value()},
                           {"wk.weight", mha.wk()->weight().value()},
                           {"wv.weight", mha.wv()->weight().value()},
                           {"wo.weight", mha.wo()->weight().value()}});
  Var x = RandnVar({B, N, D}, rng);
  Var context = RandnVar({B, S, D}, rng);
  Tensor out = hopfield.Forward(context, x).value();
  EXPECT_LT(MaxAbsDiff(out, mha.Forward(x, context).value()), 1e-12);

  // Direct reference.
  const double beta = 1.0 / std::sqrt(3.0);
  Tensor wq = mha.wq()->weight().value(), wk = mha.wk()->weight().value();
  Tensor wv = mha.wv()->weight().value(), wo = mha.wo()->weight().value();
  auto project = [&](const Tensor& in, const Tensor& w, int64_t rows) {
    std::vector<double> result(B * rows * D, 0.0);
    for (int64_t r = 0; r < B * rows; ++r) {
      for (int64_t j = 0; j < D; ++j) {
        for (int64_t k = 0; k < D; ++k) result[r * D + j] += in.at(r * D + k) * w.at(k * D + j);
      }
    }
    return result;
  };
  std::vector<double> q = project(x.value(), wq, N), k = project(context.value(), wk, S);
  std::vector<double> v = project(context.value(), wv, S);
  std::vector<double> heads(B * N * D, 0.0);
  const int64_t dh = D / H;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < N; ++i) {
        std::vector<double> w(S);
        double total = 0.0;
        for (int64_t j = 0; j < S; ++j) {
          double dot = 0.0;
          for (int64_t c = 0; c < dh; ++c) {
            dot += q[(b * N + i) * D + h * dh + c] * k[(b * S + j) * D + h * dh + c];
          }
          w[j] = std::exp(beta * dot);
          total += w[j];
        }
        for (int64_t j = 0; j < S; ++j) {
          for (int64_t c = 0; c < dh; ++c) {
            heads[(b * N + i) * D + h * dh + c] += w[j] / total * v[(b * S + j) * D + h * dh + c];
          }
        }
      }
    }
  }
  std::vector<double> reference(B * N * D, 0.0);
  for (int64_t r = 0; r < B * N; ++r) {
    for (int64_t j = 0; j < D; ++j) {
      for (int64_t c = 0; c < D; ++c) reference[r * D + j] += heads[r * D + c] * wo.at(c * D + j);
    }
  }
  EXPECT_LT(MaxDiff(reference, out), 1e-12);
}

TEST(HopfieldAttentionTest, StepsIterateInKeySpaceBeforeReadingValues) {
  Rng rng(6);
  HopfieldOptions options = RawOptions(1, 3, 2.0);
  options.solve.steps = 3;
  HopfieldAttention layer(options, rng);
  Var stored = RandnVar({1, 4, 3}, rng), state = RandnVar({1, 2, 3}, rng);
  HopfieldProblem problem = layer.Prepare(stored, state, stored);
  Var xi = problem.initial_state;
  for (int t = 0; t < 3; ++t) xi = layer.Update(xi, problem.context);
  EXPECT_LT(MaxAbsDiff(layer.Forward(stored, state).value(), layer.Readout(xi, problem).value()),
            1e-14);
}

HopfieldOptions FullOptions() {
  HopfieldOptions options;
  options.state_size = 4;
  options.stored_size = 3;
  options.value_size = 5;
  options.heads = 2;
  options.head_dim = 2;
  options.value_head_dim = 3;
  options.output_size = 2;
  options.beta = 0.8;
  options.normalize_stored = true;
  options.normalize_state = true;
  options.projection_bias = true;
  options.solve.steps = 2;
  options.dtype = DType::kFloat64;
  return options;
}

TEST(HopfieldAttentionTest, GradcheckForwardInputs) {
  Rng rng(7);
  HopfieldAttention layer(FullOptions(), rng);
  AttentionMask mask;
  mask.key_mask = Tensor::FromVector({2, 3}, {0, 0, 1, 0, 0, 0}, DType::kFloat64);
  auto f = [&](const VarList& in) { return layer.Forward(in[0], in[1], in[2], mask); };
  auto r = CheckGradients(
      f, {RandnVar({2, 3, 3}, rng), RandnVar({2, 2, 4}, rng), RandnVar({2, 3, 5}, rng)});
  EXPECT_TRUE(r) << r;
}

TEST(HopfieldAttentionTest, GradcheckForwardParameters) {
  Rng rng(8);
  HopfieldAttention layer(FullOptions(), rng);
  testing_energy::RandomizeParameters(layer, rng, 0.5,
                                      [](const std::string& name) { return name == "beta"; });
  Var stored = RandnVar({2, 3, 3}, rng), state = RandnVar({2, 2, 4}, rng);
  Var values = RandnVar({2, 3, 5}, rng);
  Tensor probe = Randn({2, 2, 2}, rng);
  auto loss = [&] { return sum(mul(layer.Forward(stored, state, values), Var(probe))); };
  auto r = CheckParameterGradients(layer, loss);
  EXPECT_TRUE(r) << r;
}

TEST(HopfieldPoolingTest, PermutationInvariantAndDifferentiable) {
  Rng rng(9);
  HopfieldOptions options = FullOptions();
  options.value_size = 0;  // pooling reads the input as values
  HopfieldPooling pooling(options, /*quantity=*/2, rng);
  Tensor input = Randn({1, 3, 3}, rng);
  Tensor permuted = input.Clone();
  const std::vector<int64_t> order = {2, 0, 1};
  for (int64_t s = 0; s < 3; ++s) {
    for (int64_t k = 0; k < 3; ++k) permuted.set(s * 3 + k, input.at(order[s] * 3 + k));
  }
  Tensor out = pooling.Forward(Var(input)).value();
  EXPECT_EQ(out.shape(), (Shape{1, 2, 2}));
  EXPECT_LT(MaxAbsDiff(out, pooling.Forward(Var(permuted)).value()), 1e-12);

  Tensor probe = Randn({1, 2, 2}, rng);
  auto loss = [&] { return sum(mul(pooling.Forward(Var(input)), Var(probe))); };
  auto r = CheckParameterGradients(pooling, loss);
  EXPECT_TRUE(r) << r;
  auto g = CheckGradients([&](const VarList& in) { return pooling.Forward(in[0]); }, {Var(input)});
  EXPECT_TRUE(g) << g;
}

// With identity projections and a large beta, a noisy query retrieves the
// target of its nearest stored pattern.
TEST(HopfieldLookupTest, RetrievesTargetOfNearestPattern) {
  Rng rng(10);
  HopfieldOptions options = RawOptions(1, 4, 20.0);
  options.value_size = 2;
  options.value_head_dim = 2;
  options.output_size = 2;
  options.solve.steps = 3;
  HopfieldLookup lookup(options, /*quantity=*/3, rng);
  auto eye = [](int64_t n) {
    Tensor t = Tensor::Zeros({n, n}, DType::kFloat64);
    for (int64_t i = 0; i < n; ++i) t.set(i * n + i, 1.0);
    return t;
  };
  lookup.LoadParameters(
      {{"stored_patterns",
        Tensor::FromVector({3, 4}, {1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0, -1}, DType::kFloat64)},
       {"targets", Tensor::FromVector({3, 2}, {1, 2, 3, 4, 5, 6}, DType::kFloat64)},
       {"hopfield.beta", Tensor::Full({1}, 20.0, DType::kFloat64)},
       {"hopfield.wq.weight", eye(4)},
       {"hopfield.wk.weight", eye(4)},
       {"hopfield.wv.weight", eye(2)},
       {"hopfield.wo.weight", eye(2)}});
  Var query(
      Tensor::FromVector({1, 2, 4}, {0.1, 0.2, 0.9, 1.2, 0.8, 0.1, 0.2, -0.7}, DType::kFloat64));
  Tensor out = lookup.Forward(query).value();
  EXPECT_NEAR(out.at(0), 3.0, 1e-6);
  EXPECT_NEAR(out.at(1), 4.0, 1e-6);
  EXPECT_NEAR(out.at(2), 5.0, 1e-6);
  EXPECT_NEAR(out.at(3), 6.0, 1e-6);

  Tensor probe = Randn({1, 2, 2}, rng);
  testing_energy::RandomizeParameters(
      lookup, rng, 0.5, [](const std::string& name) { return name == "hopfield.beta"; });
  Var(lookup.hopfield()->beta()).mutable_value().Fill(0.7);
  auto loss = [&] { return sum(mul(lookup.Forward(query), Var(probe))); };
  auto r = CheckParameterGradients(lookup, loss);
  EXPECT_TRUE(r) << r;
}

// Fixed-point mode, solved and differentiated tightly, so that the implicit
// gradient can be compared with finite differences.
HopfieldOptions FixedPointOptions(bool query_field) {
  HopfieldOptions options = FullOptions();
  options.value_size = 0;
  options.stored_size = 4;
  options.query_field = query_field;
  options.solve.mode = EnergySolveMode::kFixedPoint;
  options.solve.implicit.forward.max_iterations = 200;
  options.solve.implicit.forward.relative_tolerance = 1e-13;
  options.solve.implicit.backward.solver = AdjointSolverType::kGmres;
  options.solve.implicit.backward.tolerance = 1e-13;
  options.solve.implicit.backward.max_iterations = 200;
  return options;
}

double GradientNorm(const Var& parameter) {
  if (!parameter.has_grad()) return 0.0;
  const Tensor& g = parameter.grad().value();
  double sq = 0.0;
  for (int64_t i = 0; i < g.numel(); ++i) sq += g.at(i) * g.at(i);
  return std::sqrt(sq);
}

// In fixed-point mode without the field, the fixed point does not move when
// the state patterns (the queries) do, so they get no gradient; with the
// query as an external field they learn through the implicit gradient, which
// agrees with finite differences (model.pooling: hopfield).
TEST(HopfieldPoolingTest, FixedPointStatePatternsLearnOnlyThroughTheField) {
  for (bool field : {false, true}) {
    Rng rng(21);
    HopfieldPooling pooling(FixedPointOptions(field), /*quantity=*/2, rng);
    testing_energy::RandomizeParameters(pooling, rng, 0.5, [](const std::string& name) {
      return name == "hopfield.beta";
    });
    Var input = RandnVar({2, 3, 4}, rng);
    Tensor probe = Randn({2, 2, 2}, rng);
    auto loss = [&] { return sum(mul(pooling.Forward(input), Var(probe))); };
    pooling.ZeroGrad();
    backward(loss());
    const double norm = GradientNorm(pooling.state_patterns());
    if (!field) {
      EXPECT_LT(norm, 1e-9) << "without the field the fixed point ignores the queries";
      continue;
    }
    EXPECT_GT(norm, 1e-3);
    auto r = CheckParameterGradients(pooling, loss);
    EXPECT_TRUE(r) << r;
  }
}

// The lookup's query side (its input) learns through the fixed point only
// with the field, and then the implicit gradient agrees with finite
// differences (model.lookup: hopfield).
TEST(HopfieldLookupTest, FixedPointQueriesLearnOnlyThroughTheField) {
  for (bool field : {false, true}) {
    Rng rng(22);
    HopfieldLookup lookup(FixedPointOptions(field), /*quantity=*/5, rng);
    testing_energy::RandomizeParameters(
        lookup, rng, 0.5, [](const std::string& name) { return name == "hopfield.beta"; });
    Tensor probe = Randn({2, 3, 2}, rng);
    auto forward = [&](const VarList& in) { return mul(lookup.Forward(in[0]), Var(probe)); };
    Var query(Randn({2, 3, 4}, rng), true);
    backward(sum(forward({query})));
    const double norm = GradientNorm(query);
    if (!field) {
      EXPECT_LT(norm, 1e-9) << "without the field the fixed point ignores the query";
      continue;
    }
    EXPECT_GT(norm, 1e-3);
    auto g = CheckGradients(forward, {Var(query.value())});
    EXPECT_TRUE(g) << g;
    auto loss = [&] { return sum(forward({Var(query.value())})); };
    auto r = CheckParameterGradients(lookup, loss);
    EXPECT_TRUE(r) << r;
  }
}

TEST(HopfieldAttentionTest, RejectsMismatchedInputs) {
  Rng rng(11);
  HopfieldAttention layer(FullOptions(), rng);
  EXPECT_THROW(layer.Forward(RandnVar({2, 3, 4}, rng), RandnVar({2, 2, 4}, rng)), Error);
  EXPECT_THROW(
      layer.Forward(RandnVar({2, 3, 3}, rng), RandnVar({1, 2, 4}, rng), RandnVar({2, 3, 5}, rng)),
      Error);
}

}  // namespace
}  // namespace stillpoint::energy_hopfield_test
