// Jacobian regularization, spectral radius and fixed-point correction.
#include "solvers/regularizers.h"

#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <cmath>
#include <vector>

#include "framework/gradcheck.h"
#include "framework/ops.h"
#include "tests/solvers/implicit_problems.h"

namespace stillpoint::regularizers_test {
namespace {

using implicit_test::AffineProblem;
using implicit_test::ImplicitProblem;
using implicit_test::TanhProblem;

double FrobeniusSquared(const Tensor& m) {
  double total = 0.0;
  for (double v : m.ToVector()) total += v * v;
  return total;
}

TEST(JacobianFrobeniusPenalty, EqualsTheHutchinsonFormula) {
  // For the affine map J_b = W: each probe gives sum_b ||v_b^T W||^2.
  ImplicitProblem p = AffineProblem(3, 5, 2, false, 1);
  const Tensor z = Tensor::Zeros(Shape{3, 5}, DType::kFloat64);
  Rng rng(7);
  const Var penalty = JacobianFrobeniusPenalty(p.cell, z, 4, rng);
  EXPECT_EQ(penalty.numel(), 1);

  Rng replay(7);
  const Tensor& w = p.params[0].value();
  Eigen::MatrixXd wm(5, 5);
  for (int i = 0; i < 5; ++i) {
    for (int j = 0; j < 5; ++j) wm(i, j) = w.at(i * 5 + j);
  }
  double expected = 0.0;
  for (int k = 0; k < 4; ++k) {
    const Tensor v = RandomNormal(Shape{3, 5}, 0.0, 1.0, DType::kFloat64, replay);
    for (int b = 0; b < 3; ++b) {
      Eigen::RowVectorXd vb(5);
      for (int i = 0; i < 5; ++i) vb(i) = v.at(b * 5 + i);
      expected += (vb * wm).squaredNorm();
    }
  }
  expected /= 4.0 * 15.0;
  EXPECT_NEAR(penalty.item(), expected, 1e-12 * expected);
}

TEST(JacobianFrobeniusPenalty, IsUnbiased) {
  // E ||v^T W||^2 = ||W||_F^2, so the estimate tends to ||W||_F^2 / n.
  ImplicitProblem p = AffineProblem(8, 6, 2, false, 2);
  const Tensor z = Tensor::Zeros(Shape{8, 6}, DType::kFloat64);
  Rng rng(3);
  const double estimate = JacobianFrobeniusPenalty(p.cell, z, 400, rng).item();
  const double exact = FrobeniusSquared(p.params[0].value()) / 6.0;
  EXPECT_NEAR(estimate, exact, 0.08 * exact);
}

TEST(JacobianFrobeniusPenalty, IsDifferentiableInTheParameters) {
  ImplicitProblem p = TanhProblem(2, 4, 3, 4);
  Rng z_rng(5);
  const Tensor z = RandomNormal(Shape{2, 4}, 0.0, 0.5, DType::kFloat64, z_rng);
  const Var u = p.params[1].detach();
  const Var b = p.params[2].detach();
  const Var x = p.params[3].detach();
  auto penalty_of = [&](const VarList& inputs) {
    const CellFn cell = implicit_test::TanhCell(inputs[0], u, b, x);
    Rng rng(11);  // the same probes at every evaluation
    return JacobianFrobeniusPenalty(cell, z, 3, rng);
  };
  GradCheckOptions options;
  options.relative_tolerance = 1e-5;
  const GradCheckResult r = CheckGradients(penalty_of, {p.params[0].detach()}, options);
  EXPECT_TRUE(r) << r;
}

TEST(JacobianFrobeniusPenalty, RejectsBadProbeCount) {
  ImplicitProblem p = AffineProblem(2, 3, 2, false, 6);
  Rng rng(1);
  EXPECT_THROW(JacobianFrobeniusPenalty(p.cell, p.z0, 0, rng), Error);
}

// Sets the affine problem's W (J_b = W) to S diag(eigenvalues) S^-1 with a
// random S, orthogonal when symmetric.
void SetKnownSpectrum(ImplicitProblem* p, const std::vector<double>& eigenvalues, bool symmetric,
                      uint64_t seed) {
  const int n = static_cast<int>(eigenvalues.size());
  Rng rng(seed);
  Eigen::MatrixXd m(n, n);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) m(i, j) = rng.Normal();
  }
  const Eigen::VectorXd d = Eigen::Map<const Eigen::VectorXd>(eigenvalues.data(), n);
  Eigen::MatrixXd w;
  if (symmetric) {
    const Eigen::MatrixXd q = Eigen::HouseholderQR<Eigen::MatrixXd>(m).householderQ();
    w = q * d.asDiagonal() * q.transpose();
  } else {
    const Eigen::MatrixXd s = m + 3.0 * Eigen::MatrixXd::Identity(n, n);  // well conditioned
    w = s * d.asDiagonal() * s.inverse();
  }
  Tensor& w_value = p->params[0].mutable_value();
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) w_value.set(i * n + j, w(i, j));
  }
}

TEST(SpectralRadius, FindsTheDominantEigenvalue) {
  // Affine map with W = Q diag(0.8, -0.5, 0.4, 0.3, -0.2) Q^T: rho = 0.8.
  ImplicitProblem p = AffineProblem(2, 5, 2, false, 8);
  SetKnownSpectrum(&p, {0.8, -0.5, 0.4, 0.3, -0.2}, /*symmetric=*/true, 9);
  SpectralRadiusOptions options;
  options.max_iterations = 100;
  options.tolerance = 1e-12;
  const SpectralRadiusResult result = EstimateSpectralRadius(p.cell, p.z0, options);
  ASSERT_EQ(result.radius.size(), 2u);
  for (int b = 0; b < 2; ++b) {
    EXPECT_NEAR(result.radius[b], 0.8, 1e-6) << b;
    EXPECT_TRUE(result.converged[b]);
    EXPECT_LT(result.iterations[b], 100);
  }
  EXPECT_NEAR(result.max_radius, 0.8, 1e-6);
}

// The Rayleigh quotient keeps the dominant eigenvalue's sign: an
// overshooting map (eigenvalue near -1) is told from an expanding one (near
// +1) of the same radius, for symmetric (energy) and non-symmetric Jacobians.
TEST(SpectralRadius, KeepsTheSignOfTheDominantEigenvalue) {
  struct Case {
    std::vector<double> eigenvalues;
    bool symmetric;
    double dominant;
  };
  const std::vector<Case> cases = {
      {{-0.95, 0.5, 0.4, -0.3, 0.1}, true, -0.95},  // overshooting step
      {{1.2, -0.6, 0.4, 0.3, -0.2}, true, 1.2},     // saddle of an energy
      {{-1.1, 0.7, 0.5, -0.2, 0.1}, false, -1.1},
      {{0.9, -0.6, 0.3, 0.2, -0.1}, false, 0.9},
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    ImplicitProblem p = AffineProblem(3, 5, 2, false, 30 + c);
    SetKnownSpectrum(&p, cases[c].eigenvalues, cases[c].symmetric, 40 + c);
    SpectralRadiusOptions options;
    options.max_iterations = 300;
    options.tolerance = 1e-12;
    const SpectralRadiusResult result = EstimateSpectralRadius(p.cell, p.z0, options);
    ASSERT_EQ(result.eigenvalue.size(), 3u);
    for (int b = 0; b < 3; ++b) {
      EXPECT_NEAR(result.radius[b], std::abs(cases[c].dominant), 1e-6) << c << " " << b;
      EXPECT_NEAR(result.eigenvalue[b], cases[c].dominant, 1e-6) << c << " " << b;
    }
    EXPECT_NEAR(result.dominant_eigenvalue, cases[c].dominant, 1e-6) << c;
    EXPECT_NEAR(result.max_radius, std::abs(cases[c].dominant), 1e-6) << c;
  }
}

// A complex dominant pair has no real eigenvalue to converge to: the
// quotient then stays below the radius in modulus, which says so.
TEST(SpectralRadius, ComplexPairGivesAQuotientBelowTheRadius) {
  ImplicitProblem p = AffineProblem(2, 4, 2, false, 50);
  // W = 0.9 R(1 rad) (+) diag(0.2, -0.1): eigenvalues 0.9 e^(+-i), 0.2, -0.1.
  Tensor& w = p.params[0].mutable_value();
  for (int64_t i = 0; i < w.numel(); ++i) w.set(i, 0.0);
  w.set(0, 0.9 * std::cos(1.0));
  w.set(1, -0.9 * std::sin(1.0));
  w.set(4, 0.9 * std::sin(1.0));
  w.set(5, 0.9 * std::cos(1.0));
  w.set(10, 0.2);
  w.set(15, -0.1);
  SpectralRadiusOptions options;
  options.max_iterations = 200;
  options.tolerance = 1e-13;
  const SpectralRadiusResult result = EstimateSpectralRadius(p.cell, p.z0, options);
  for (int b = 0; b < 2; ++b) {
    EXPECT_NEAR(result.radius[b], 0.9, 1e-6) << b;  // a rotation keeps the norm
    EXPECT_NEAR(result.eigenvalue[b], 0.9 * std::cos(1.0), 1e-6) << b;
  }
}

// A strongly non-normal Jacobian (triangular, eigenvalues 0.6 ... 0.2,
// off-diagonal entries 3): ||J^T v|| grows for many steps before it decays,
// so power iteration reads far above the radius at a budget where Arnoldi,
// whose Krylov space of dimension 5 is invariant, is exact.
TEST(SpectralRadius, ArnoldiIsExactWherePowerIterationReadsHigh) {
  ImplicitProblem p = AffineProblem(2, 5, 2, false, 60);
  Tensor& w = p.params[0].mutable_value();
  const std::vector<double> diagonal = {0.6, 0.5, 0.4, 0.3, 0.2};
  for (int i = 0; i < 5; ++i) {
    for (int j = 0; j < 5; ++j) w.set(i * 5 + j, i == j ? diagonal[i] : (j > i ? 3.0 : 0.0));
  }
  SpectralRadiusOptions options;
  options.max_iterations = 8;
  options.tolerance = 1e-10;
  const SpectralRadiusResult arnoldi = EstimateSpectralRadius(p.cell, p.z0, options);
  for (int b = 0; b < 2; ++b) {
    EXPECT_NEAR(arnoldi.radius[b], 0.6, 1e-8) << b;
    EXPECT_NEAR(arnoldi.eigenvalue[b], 0.6, 1e-8) << b;
    EXPECT_TRUE(arnoldi.converged[b]) << b;
    EXPECT_LE(arnoldi.iterations[b], 5) << b;
  }
  // Along its direction, an eigenvector of J^T, the norm is the radius (the
  // spectral-radius penalty's premise).
  const double penalty = SpectralRadiusPenalty(p.cell, p.z0, arnoldi.directions, 0.0).item();
  EXPECT_NEAR(penalty, 0.36, 1e-8);
  options.method = SpectralRadiusMethod::kPowerIteration;
  const SpectralRadiusResult power = EstimateSpectralRadius(p.cell, p.z0, options);
  EXPECT_GT(power.max_radius, 0.75);  // 0.6 is the radius
}

TEST(SpectralRadius, ContractionIsBelowOne) {
  ImplicitProblem p = TanhProblem(3, 6, 2, 10);
  const SpectralRadiusResult result = EstimateSpectralRadius(p.cell, p.z0);
  EXPECT_GT(result.max_radius, 0.0);
  EXPECT_LE(result.max_radius, 0.6 + 1e-9);  // ||diag(tanh') W|| <= ||W|| <= 0.6
}

TEST(SpectralRadiusPenalty, IsTheHingeOnTheEstimate) {
  // Per sample along the estimate's own directions the norm is the estimate,
  // so the penalty is the mean of max(0, radius_b - target)^2.
  ImplicitProblem p = TanhProblem(3, 6, 2, 21, 0.9);
  SpectralRadiusOptions options;
  options.max_iterations = 200;
  options.tolerance = 1e-13;
  const SpectralRadiusResult estimate = EstimateSpectralRadius(p.cell, p.z0, options);
  for (const double target : {0.0, 0.5 * estimate.max_radius}) {
    double expected = 0.0;
    for (double radius : estimate.radius) {
      expected += std::pow(std::max(0.0, radius - target), 2) / 3.0;
    }
    const double penalty = SpectralRadiusPenalty(p.cell, p.z0, estimate.directions, target).item();
    EXPECT_NEAR(penalty, expected, 1e-12 * expected) << target;
  }
  // Above every sample's radius the penalty and its gradient are zero.
  const Var above = SpectralRadiusPenalty(p.cell, p.z0, estimate.directions,
                                          1.01 * estimate.max_radius);
  EXPECT_EQ(above.item(), 0.0);
  VarList grads = grad({above}, {p.params[0]});
  EXPECT_TRUE(!grads[0].defined() || FrobeniusSquared(grads[0].value()) == 0.0);
}

TEST(SpectralRadiusPenalty, IsDifferentiableInTheParameters) {
  // Directions held fixed, as the trainer holds them: the parameter gradient
  // matches central finite differences in float64.
  ImplicitProblem p = TanhProblem(2, 4, 3, 22, 0.9);
  Rng z_rng(23);
  const Tensor z = RandomNormal(Shape{2, 4}, 0.0, 0.5, DType::kFloat64, z_rng);
  const Tensor directions = EstimateSpectralRadius(p.cell, z).directions;
  const Var u = p.params[1].detach();
  const Var b = p.params[2].detach();
  const Var x = p.params[3].detach();
  auto penalty_of = [&](const VarList& inputs) {
    const CellFn cell = implicit_test::TanhCell(inputs[0], u, b, x);
    return SpectralRadiusPenalty(cell, z, directions, 0.1);
  };
  GradCheckOptions options;
  options.relative_tolerance = 1e-5;
  const GradCheckResult r = CheckGradients(penalty_of, {p.params[0].detach()}, options);
  EXPECT_TRUE(r) << r;
}

TEST(SpectralRadiusPenalty, DescentLowersTheRadius) {
  // Plain gradient steps on the penalty alone (directions re-estimated each
  // step) bring a map with radius above 0.8 below the target. Its dominant
  // eigenvalues are a complex pair (real part -0.35 at radius 0.95): along
  // the real part of the Ritz vector alone the penalty stalled at 0.60.
  ImplicitProblem p = TanhProblem(4, 6, 2, 24, 3.2);
  const double before = EstimateSpectralRadius(p.cell, p.z0).max_radius;
  ASSERT_GT(before, 0.8);
  for (int step = 0; step < 200; ++step) {
    const SpectralRadiusResult estimate = EstimateSpectralRadius(p.cell, p.z0);
    const Var penalty = SpectralRadiusPenalty(p.cell, p.z0, estimate.directions, 0.5);
    VarList grads = grad({penalty}, {p.params[0]});
    Tensor& w = p.params[0].mutable_value();
    for (int64_t i = 0; i < w.numel(); ++i) w.set(i, w.at(i) - 0.5 * grads[0].value().at(i));
  }
  const double after = EstimateSpectralRadius(p.cell, p.z0).max_radius;
  EXPECT_LT(after, 0.52) << "before " << before;
}

TEST(SpectralRadiusPenalty, RejectsMisuse) {
  ImplicitProblem p = TanhProblem(2, 4, 3, 25);
  const Tensor directions = EstimateSpectralRadius(p.cell, p.z0).directions;
  EXPECT_THROW(SpectralRadiusPenalty(p.cell, p.z0, Tensor::Zeros(Shape{2, 3}, DType::kFloat64), 0),
               Error);
  EXPECT_THROW(SpectralRadiusPenalty(p.cell, p.z0, directions, -1.0), Error);
}

TEST(FixedPointCorrection, WeightsTheCorrectedIterates) {
  ImplicitProblem p = TanhProblem(2, 4, 3, 12);
  Rng rng(13);
  std::vector<Tensor> iterates;
  for (int i = 0; i < 3; ++i) {
    iterates.push_back(RandomNormal(Shape{2, 4}, 0.0, 0.5, DType::kFloat64, rng));
  }
  auto loss = [](const Var& z) { return sum(square(z)); };
  FixedPointCorrectionOptions options;
  options.steps = 2;
  options.tau = 0.5;
  options.gamma = 0.5;
  const Var total = FixedPointCorrectionLoss(p.cell, iterates, loss, options);

  double expected = 0.0;
  {
    NoGrad no_grad;
    for (int i = 0; i < 3; ++i) {
      Var z(iterates[i]);
      for (int k = 0; k < 2; ++k) z = add(mul_scalar(z, 0.5), mul_scalar(p.cell(z, {0, 1}), 0.5));
      expected += std::pow(0.5, 2 - i) * loss(z).item();
    }
  }
  EXPECT_NEAR(total.item(), expected, 1e-12);

  // The gradient reaches the parameters, and matches finite differences.
  auto loss_of = [&](const VarList& inputs) {
    const Var w = inputs[0];
    const Var u = p.params[1].detach();
    const Var b = p.params[2].detach();
    const Var x = p.params[3].detach();
    CellFn cell = [w, u, b, x](const Var& state, const std::vector<int64_t>& ids) {
      return tanh(
          add(add(matmul(state, w, false, true), matmul(gather(x, 0, ids), u, false, true)), b));
    };
    return FixedPointCorrectionLoss(cell, iterates, loss, options);
  };
  const GradCheckResult r = CheckGradients(loss_of, {p.params[0].detach()});
  EXPECT_TRUE(r) << r;
}

TEST(FixedPointCorrection, WorksOnSampledIterates) {
  ImplicitProblem p = TanhProblem(2, 4, 3, 14, 0.9);
  ImplicitOptions options;
  options.forward.type = ForwardSolverType::kPicard;
  options.forward.max_iterations = 12;
  options.forward.stop_mode = StopMode::kAbsolute;
  options.forward.absolute_tolerance = 0.0;
  options.sampled_iterates = 3;
  ImplicitResult result = SolveImplicit(p.cell, p.z0, options);
  ASSERT_EQ(result.sampled_iterates.size(), 3u);
  const Var loss = FixedPointCorrectionLoss(p.cell, result.sampled_iterates,
                                            [](const Var& z) { return mean(square(z)); });
  VarList grads = grad({loss}, p.params);
  ASSERT_TRUE(grads[0].defined());
  EXPECT_GT(FrobeniusSquared(grads[0].value()), 0.0);
}

TEST(FixedPointCorrection, RejectsMisuse) {
  ImplicitProblem p = TanhProblem(2, 4, 3, 15);
  auto loss = [](const Var& z) { return sum(z); };
  EXPECT_THROW(FixedPointCorrectionLoss(p.cell, {}, loss), Error);
  FixedPointCorrectionOptions options;
  options.gamma = 0.0;
  EXPECT_THROW(FixedPointCorrectionLoss(p.cell, {p.z0}, loss, options), Error);
}

}  // namespace
}  // namespace stillpoint::regularizers_test
