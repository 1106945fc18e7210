// Energy layers solved to their fixed point with the implicit backward
// (docs/seeds.md T10): the implicit gradient of the Hopfield fixed
// point against central differences of the full solve, its independence of
// the step s of f_s = xi - s grad E and of the forward/adjoint solvers, and
// a gradient check of each catalogue layer's forward in fixed-point mode.

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "framework/gradcheck.h"
#include "framework/ops.h"
#include "layers/energy_layer.h"
#include "layers/energy_solve.h"
#include "layers/energy_transformer.h"
#include "layers/expfam_attention.h"
#include "layers/hopfield.h"
#include "layers/probabilistic_attention.h"
#include "solvers/implicit_solve.h"
#include "tests/layers/energy_test_util.h"

namespace stillpoint::energy_implicit_test {
namespace {

using testing_energy::DenseHessian;
using testing_energy::DenseJacobian;
using testing_energy::Randn;
using testing_energy::RandnVar;

ImplicitOptions TightOptions(ForwardSolverType forward, AdjointSolverType adjoint) {
  return testing_energy::TightImplicitOptions(forward, adjoint);
}

// The T10 problem: a raw Hopfield layer (one head, d = 4), beta = 16, five
// random stored patterns and two queries per sample.
struct HopfieldFixture {
  Rng rng{1};
  HopfieldAttention layer{[] {
                            HopfieldOptions options;
                            options.state_size = 4;
                            options.head_dim = 4;
                            options.beta = 16.0;
                            options.dtype = DType::kFloat64;
                            return options;
                          }(),
                          rng};
  Tensor keys = Randn({2, 1, 5, 4}, rng, 0.5);
  Tensor xi0 = Randn({2, 1, 2, 4}, rng, 0.5);
  Tensor probe = Randn({2, 1, 2, 4}, rng);

  // L = <c, xi*> for the keys given and the cell built by make_cell.
  double Loss(const Tensor& k, const Tensor& start, const ImplicitOptions& options) {
    NoGrad no_grad;
    const HopfieldContext ctx{.keys = Var(k)};
    EnergySolveOptions solve;
    solve.mode = EnergySolveMode::kFixedPoint;
    solve.implicit = options;
    return sum(mul(SolveEnergy(layer, Var(start), ctx, solve), Var(probe))).item();
  }

  // dL/dkeys through the implicit node of the cell f_s (s = 0: the layer's
  // CCCP update).
  Tensor ImplicitGradient(const ImplicitOptions& options,
                          double step,
                          AdjointSummary* backward_summary = nullptr) {
    Var k(keys.Clone(), true);
    const HopfieldContext ctx{.keys = k};
    const Shape state{1, 2, 4};
    CellFn cell = step > 0.0 ? MakeGradientStepCell(layer, ctx, state, step)
                             : MakeUpdateCell(layer, ctx, state);
    ImplicitResult result = SolveImplicit(cell, xi0, options);
    EXPECT_EQ(result.forward.termination_type, TerminationType::kConverged)
        << result.forward.BriefReport();
    backward(sum(mul(result.z_star, Var(probe))));
    if (backward_summary != nullptr && result.backward) *backward_summary = *result.backward;
    return k.grad().value().Clone();
  }
};

// T10: the implicit gradient w.r.t. the stored patterns matches central
// differences of the full solve; the fixed point does not depend on xi0.
TEST(EnergyImplicitTest, HopfieldImplicitGradientMatchesFiniteDifferences) {
  HopfieldFixture f;
  const ImplicitOptions options =
      TightOptions(ForwardSolverType::kAnderson, AdjointSolverType::kGmres);
  AdjointSummary summary;
  Tensor analytic = f.ImplicitGradient(options, 0.0, &summary);
  EXPECT_EQ(summary.termination_type, TerminationType::kConverged) << summary.BriefReport();
  const double h = 1e-5;
  double worst = 0.0, scale = 0.0;
  for (int64_t i = 0; i < f.keys.numel(); ++i) {
    Tensor plus = f.keys.Clone(), minus = f.keys.Clone();
    plus.set(i, f.keys.at(i) + h);
    minus.set(i, f.keys.at(i) - h);
    const double numeric = (f.Loss(plus, f.xi0, options) - f.Loss(minus, f.xi0, options)) / (2 * h);
    worst = std::max(worst, std::abs(numeric - analytic.at(i)));
    scale = std::max(scale, std::abs(numeric));
  }
  EXPECT_GT(scale, 0.1);
  EXPECT_LT(worst, 1e-6 * scale);
  for (int64_t i = 0; i < f.xi0.numel(); ++i) {
    Tensor plus = f.xi0.Clone(), minus = f.xi0.Clone();
    plus.set(i, f.xi0.at(i) + h);
    minus.set(i, f.xi0.at(i) - h);
    EXPECT_LT(std::abs(f.Loss(f.keys, plus, options) - f.Loss(f.keys, minus, options)) / (2 * h),
              1e-6);
  }
}

// T10: f_s = xi - s grad E gives the same implicit gradient for every s
// (I - J_s = s H and df_s/dtheta = -s d(grad E)/dtheta), equal to the CCCP
// map's (s = 1), with the forward solvers Anderson and Picard and with the
// symmetric adjoint solvers (I - J = s H is symmetric positive definite at
// a minimum).
TEST(EnergyImplicitTest, HopfieldGradientIndependentOfStepAndSolvers) {
  HopfieldFixture f;
  const Tensor reference = f.ImplicitGradient(
      TightOptions(ForwardSolverType::kAnderson, AdjointSolverType::kDense), 0.0);
  ASSERT_GT(testing_energy::MaxAbs(reference), 0.1);
  for (double s : {0.25, 0.5, 1.0}) {
    SCOPED_TRACE(s);
    Tensor g = f.ImplicitGradient(
        TightOptions(ForwardSolverType::kAnderson, AdjointSolverType::kGmres), s);
    EXPECT_LT(MaxAbsDiff(g, reference), 1e-9 * testing_energy::MaxAbs(reference));
  }
  for (AdjointSolverType adjoint : {AdjointSolverType::kConjugateGradient,
                                    AdjointSolverType::kMinres, AdjointSolverType::kFixedPoint}) {
    SCOPED_TRACE(ToString(adjoint));
    Tensor g = f.ImplicitGradient(TightOptions(ForwardSolverType::kPicard, adjoint), 0.5);
    EXPECT_LT(MaxAbsDiff(g, reference), 1e-9 * testing_energy::MaxAbs(reference));
  }
}

// T10: at the fixed point, I - J_f equals the Hessian of the energy and is
// positive definite (a minimum).
TEST(EnergyImplicitTest, HopfieldOneMinusJacobianIsHessianAtFixedPoint) {
  HopfieldFixture f;
  const HopfieldContext ctx{.keys = Var(f.keys.SliceRows(0, 1).Clone())};
  EnergySolveOptions solve;
  solve.mode = EnergySolveMode::kFixedPoint;
  solve.implicit = TightOptions(ForwardSolverType::kAnderson, AdjointSolverType::kGmres);
  Tensor xi_star;
  {
    NoGrad no_grad;
    xi_star = SolveEnergy(f.layer, Var(f.xi0.SliceRows(0, 1).Clone()), ctx, solve).value();
  }
  Eigen::MatrixXd jacobian =
      DenseJacobian([&](const Var& z) { return f.layer.Update(z, ctx); }, xi_star);
  Eigen::MatrixXd hessian =
      DenseHessian([&](const Var& z) { return sum(f.layer.Energy(z, ctx)); }, xi_star);
  const int64_t n = xi_star.numel();
  EXPECT_LT((Eigen::MatrixXd::Identity(n, n) - jacobian - hessian).cwiseAbs().maxCoeff(), 1e-12);
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> eigen(hessian);
  EXPECT_GT(eigen.eigenvalues().minCoeff(), 1e-3);
}

EnergySolveOptions FixedPoint() {
  EnergySolveOptions solve;
  solve.mode = EnergySolveMode::kFixedPoint;
  solve.implicit = TightOptions(ForwardSolverType::kAnderson, AdjointSolverType::kGmres);
  solve.trace_energy = true;
  return solve;
}

GradCheckOptions SolveTolerances() { return testing_energy::SolveGradCheckOptions(1e-7); }

// Each layer's forward in fixed-point mode: the implicit gradient w.r.t. its
// inputs matches finite differences of the converged solve.
TEST(EnergyImplicitTest, GradcheckHopfieldAttentionFixedPoint) {
  Rng rng(2);
  HopfieldOptions options;
  options.state_size = 4;
  options.heads = 2;
  // Well-separated stored patterns (large beta |k|^2), so every query
  // converges quickly to one pattern and a small perturbation of the inputs
  // cannot move it to another basin.
  options.beta = 8.0;
  options.solve = FixedPoint();
  options.dtype = DType::kFloat64;
  HopfieldAttention layer(options, rng);
  auto r = CheckGradients([&](const VarList& in) { return layer.Forward(in[0], in[1]); },
                          {RandnVar({1, 4, 4}, rng, 2.0), RandnVar({1, 2, 4}, rng, 2.0)},
                          SolveTolerances());
  EXPECT_TRUE(r) << r;
  const EnergySolveReport& report = layer.last_solve();
  EXPECT_EQ(report.mode, EnergySolveMode::kFixedPoint);
  EXPECT_EQ(report.implicit.forward.termination_type, TerminationType::kConverged)
      << report.implicit.forward.BriefReport();
  ASSERT_EQ(report.energies.size(), 2u);
  for (std::size_t b = 0; b < report.energies[0].size(); ++b) {
    EXPECT_LE(report.energies[1][b], report.energies[0][b] + 1e-12);  // CCCP from xi_0 descends
  }
}

// The adjoint warm start of an energy layer is the layer object's own
// runtime state: two layers built from one options struct keep separate
// previous solutions, and each one's next backward starts from its own.
TEST(EnergyImplicitTest, EachLayerKeepsItsOwnAdjointWarmStart) {
  HopfieldOptions options;
  options.state_size = 4;
  options.heads = 2;
  options.beta = 8.0;
  options.solve = FixedPoint();
  options.solve.implicit.backward.warm_start = true;
  options.dtype = DType::kFloat64;
  Rng rng(4);
  HopfieldAttention first(options, rng);
  HopfieldAttention second(options, rng);
  ASSERT_NE(first.adjoint_warm_start(), second.adjoint_warm_start());
  const Var x1 = RandnVar({1, 4, 4}, rng, 2.0), y1 = RandnVar({1, 2, 4}, rng, 2.0);
  const Var x2 = RandnVar({2, 4, 4}, rng, 2.0), y2 = RandnVar({2, 2, 4}, rng, 2.0);
  auto step = [](HopfieldAttention& layer, const Var& x, const Var& y) {
    backward(sum(layer.Forward(x, y)));
    return layer.last_solve().implicit.backward;
  };
  EXPECT_FALSE(step(first, x1, y1)->warm_started);
  const Tensor first_solution = first.adjoint_warm_start()->solution.Clone();
  ASSERT_TRUE(first_solution.defined());
  EXPECT_FALSE(step(second, x2, y2)->warm_started);
  EXPECT_TRUE(BitwiseEqual(first.adjoint_warm_start()->solution, first_solution));
  EXPECT_TRUE(step(first, x1, y1)->warm_started);
}

TEST(EnergyImplicitTest, GradcheckProbabilisticAttentionFixedPoint) {
  Rng rng(3);
  ProbabilisticAttentionOptions options;
  options.dim = 4;
  options.heads = 2;
  options.value_precision = 0.8;
  options.solve = FixedPoint();
  options.dtype = DType::kFloat64;
  ProbabilisticAttention layer(options, rng);
  auto r = CheckGradients([&](const VarList& in) { return layer.Forward(in[0], in[1]); },
                          {RandnVar({2, 3, 4}, rng), RandnVar({2, 5, 4}, rng)}, SolveTolerances());
  EXPECT_TRUE(r) << r;
}

TEST(EnergyImplicitTest, GradcheckExpFamAttentionFixedPoint) {
  Rng rng(4);
  ExpFamAttentionOptions options;
  options.measure = ExpFamMeasure::kMixture;
  options.dim = 4;
  options.heads = 2;
  options.components = 3;
  options.update = ExpFamUpdate::kCccp;
  options.solve = FixedPoint();
  options.dtype = DType::kFloat64;
  ExpFamAttention layer(options, rng);
  // Without an injection the fixed point does not depend on the input, only
  // on the parameters.
  Var x = RandnVar({2, 3, 4}, rng);
  Tensor probe = Randn({2, 3, 4}, rng);
  auto p = testing_energy::CheckParameterGradients(
      layer, [&] { return sum(mul(layer.Forward(x), Var(probe))); }, 1e-5, 1e-5, 1e-7);
  EXPECT_TRUE(p) << p;
}

// The discrete measure with rescaled patterns (contraction, as the expfam
// energy block uses it) and the query field: the implicit gradients with
// respect to the queries, the stored patterns and every parameter (beta
// enters both the scores and the patterns' norm sqrt(c / beta)) match
// central differences of the converged solve. W_K and W_Q are drawn large
// (std 1.5), where the unrescaled map would not contract.
TEST(EnergyImplicitTest, GradcheckExpFamAttentionContractionFixedPoint) {
  Rng rng(6);
  ExpFamAttentionOptions options;
  options.dim = 4;
  options.heads = 2;
  options.beta = 3.0;
  options.contraction = 0.5;
  options.update = ExpFamUpdate::kCccp;
  options.query_field = true;
  options.solve = FixedPoint();
  options.dtype = DType::kFloat64;
  ExpFamAttention layer(options, rng);
  testing_energy::RandomizeParameters(layer, rng, 1.5,
                                      [](const std::string& name) { return name == "beta"; });
  Var x = RandnVar({2, 3, 4}, rng), patterns = RandnVar({2, 5, 4}, rng);
  auto r = CheckGradients([&](const VarList& in) { return layer.Forward(in[0], in[1]); },
                          {x, patterns}, SolveTolerances());
  EXPECT_TRUE(r) << r;
  Tensor probe = Randn({2, 3, 4}, rng);
  auto p = testing_energy::CheckParameterGradients(
      layer, [&] { return sum(mul(layer.Forward(x, patterns), Var(probe))); }, 1e-5, 1e-5, 1e-7);
  EXPECT_TRUE(p) << p;
  EXPECT_EQ(layer.last_solve().implicit.forward.termination_type, TerminationType::kConverged);
}

TEST(EnergyImplicitTest, GradcheckEnergyTransformerFixedPoint) {
  Rng rng(5);
  EnergyTransformerOptions options;
  options.dim = 4;
  options.heads = 2;
  options.head_dim = 2;
  options.memories = 3;
  options.weight_std = 0.3;
  options.memory_std = 0.3;
  options.dynamics = EnergyTransformerDynamics::kLeaky;
  options.step = 0.5;
  options.solve = FixedPoint();
  options.dtype = DType::kFloat64;
  EnergyTransformerBlock block(options, rng);
  // The stationary state does not depend on where the dynamics start: check
  // the parameters' gradients.
  Var x = RandnVar({2, 3, 4}, rng);
  Tensor probe = Randn({2, 3, 4}, rng);
  auto p = testing_energy::CheckParameterGradients(
      block, [&] { return sum(mul(block.Forward(x), Var(probe))); }, 1e-5, 1e-5, 1e-7);
  EXPECT_TRUE(p) << p;
  EXPECT_EQ(block.last_solve().implicit.forward.termination_type, TerminationType::kConverged);
}

}  // namespace
}  // namespace stillpoint::energy_implicit_test
