// The Implicit wrapper: implicit gradients against finite differences of the
// converged solve (function cells and Module cells), agreement with unrolled
// backprop, per-sample independence, the backward modes, frozen dropout and
// the exposed solver summaries.
#include "layers/implicit_layer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "framework/gradcheck.h"
#include "framework/ops.h"
#include "framework/random.h"
#include "layers/deq_cell.h"
#include "tests/layers/module_gradcheck.h"

namespace stillpoint::implicit_test {
namespace {

constexpr DType kF64 = DType::kFloat64;

// Forward and adjoint solves far below the finite-difference noise.
ImplicitOptions TightOptions() {
  ImplicitOptions options;
  options.forward.type = ForwardSolverType::kAnderson;
  options.forward.stop_mode = StopMode::kAbsolute;
  options.forward.absolute_tolerance = 1e-13;
  options.forward.max_iterations = 200;
  options.forward.stagnation_window = 0;
  options.backward.solver = AdjointSolverType::kGmres;
  options.backward.tolerance = 1e-13;
  options.backward.max_iterations = 200;
  return options;
}

// f(z; u) = tanh(z W + u): a contraction for ||W|| < 1.
Implicit::Function TanhCell(const Var& w) {
  return [w](const Var& z, const Var& u, const std::vector<int64_t>&) {
    return tanh(add(matmul(z, w), u));
  };
}

Tensor SmallWeight(int64_t n, Rng& rng) {
  return RandomNormal({n, n}, 0.0, 0.4 / std::sqrt(static_cast<double>(n)), kF64, rng);
}

TEST(ImplicitTest, FunctionCellGradientMatchesFiniteDifferencesOfTheSolve) {
  Rng rng(1);
  const Var u(RandomNormal({3, 5}, 0.0, 1.0, kF64, rng));
  const Var w(SmallWeight(5, rng));
  auto r = CheckGradients(
      [](const VarList& in) {
        Implicit layer(TanhCell(in[1]), TightOptions());
        return layer.Forward(in[0]);
      },
      {u, w});
  EXPECT_TRUE(r) << r;
}

TEST(ImplicitTest, FixedPointSatisfiesTheCellAndSummariesAreExposed) {
  Rng rng(2);
  const Var u(RandomNormal({4, 6}, 0.0, 1.0, kF64, rng), true);
  const Var w(SmallWeight(6, rng), true);
  Implicit layer(TanhCell(w), TightOptions());
  const Var z_star = layer.Forward(u);
  ASSERT_EQ(z_star.shape(), Shape({4, 6}));
  {
    NoGrad no_grad;
    const Tensor again = tanh(add(matmul(Var(z_star.value()), w), u)).value();
    EXPECT_LT(MaxAbsDiff(again, z_star.value()), 1e-12);
  }
  EXPECT_EQ(layer.forward_summary().termination_type, TerminationType::kConverged);
  EXPECT_EQ(layer.forward_summary().batch_size, 4);
  EXPECT_GT(layer.forward_summary().iterations, 0);
  ASSERT_NE(layer.backward_summary(), nullptr);
  backward(sum(z_star));
  EXPECT_EQ(layer.backward_summary()->termination_type, TerminationType::kConverged)
      << layer.backward_summary()->FullReport();
  EXPECT_GT(layer.backward_summary()->vjp_evaluations, 0);
  EXPECT_TRUE(u.has_grad());
  EXPECT_TRUE(w.has_grad());
}

TEST(ImplicitTest, SamplesAreSolvedIndependently) {
  // Samples converge at different iterations, so the solver evaluates
  // subsets of rows; each must see its own injection row.
  Rng rng(3);
  Tensor u_value = RandomNormal({3, 4}, 0.0, 1.0, kF64, rng);
  for (int64_t j = 0; j < 4; ++j) u_value.set(2 * 4 + j, 6.0 * u_value.at(2 * 4 + j));
  const Var w(SmallWeight(4, rng));
  ImplicitOptions options = TightOptions();
  Implicit layer(TanhCell(w), options);
  NoGrad no_grad;
  const Tensor batch = layer.Forward(Var(u_value)).value();
  const std::vector<int>& iterations = layer.forward_summary().sample_iterations;
  ASSERT_EQ(iterations.size(), 3u);
  // Otherwise this test would not exercise subsets.
  EXPECT_TRUE(iterations[0] != iterations[2] || iterations[1] != iterations[2])
      << iterations[0] << " " << iterations[1] << " " << iterations[2];
  for (int64_t b = 0; b < 3; ++b) {
    const Tensor alone = layer.Forward(Var(u_value.SliceRows(b, b + 1).Clone())).value();
    for (int64_t j = 0; j < 4; ++j) EXPECT_NEAR(batch.at(b * 4 + j), alone.at(j), 1e-12);
  }
}

TEST(ImplicitTest, ImplicitGradientEqualsUnrolledBackprop) {
  Rng rng(4);
  const Tensor u_value = RandomNormal({2, 5}, 0.0, 1.0, kF64, rng);
  const Tensor w_value = SmallWeight(5, rng);
  auto gradients = [&](const ImplicitOptions& options) {
    const Var u(u_value.Clone(), true);
    const Var w(w_value.Clone(), true);
    Implicit layer(TanhCell(w), options);
    backward(sum(square(layer.Forward(u))));
    return std::make_pair(u.grad().value(), w.grad().value());
  };
  const auto ift = gradients(TightOptions());
  ImplicitOptions unrolled = TightOptions();
  unrolled.backward.mode = BackwardMode::kUnrolled;
  unrolled.backward.unrolled_steps = 80;
  const auto reference = gradients(unrolled);
  EXPECT_LT(MaxAbsDiff(ift.first, reference.first), 1e-11);
  EXPECT_LT(MaxAbsDiff(ift.second, reference.second), 1e-11);
}

TEST(ImplicitTest, EveryBackwardModeReportsAndGivesAGradient) {
  Rng rng(5);
  const Tensor u_value = RandomNormal({2, 4}, 0.0, 1.0, kF64, rng);
  const Tensor w_value = SmallWeight(4, rng);
  for (BackwardMode mode :
       {BackwardMode::kIft, BackwardMode::kJfb, BackwardMode::kPhantom, BackwardMode::kUnrolled}) {
    ImplicitOptions options = TightOptions();
    options.backward.mode = mode;
    const Var u(u_value.Clone(), true);
    const Var w(w_value.Clone(), true);
    Implicit layer(TanhCell(w), options);
    backward(sum(layer.Forward(u)));
    ASSERT_NE(layer.backward_summary(), nullptr) << ToString(mode);
    EXPECT_EQ(layer.backward_summary()->mode, mode);
    ASSERT_TRUE(w.has_grad()) << ToString(mode);
    EXPECT_FALSE(HasNonFinite(w.grad().value())) << ToString(mode);
  }
}

TEST(ImplicitTest, WithoutTapeReturnsTheFixedPointOnly) {
  Rng rng(6);
  const Var u(RandomNormal({2, 3}, 0.0, 1.0, kF64, rng), true);
  const Var w(SmallWeight(3, rng), true);
  Implicit layer(TanhCell(w), TightOptions());
  NoGrad no_grad;
  const Var z_star = layer.Forward(u);
  EXPECT_FALSE(z_star.requires_grad());
  EXPECT_EQ(layer.backward_summary(), nullptr);
  EXPECT_EQ(layer.forward_summary().termination_type, TerminationType::kConverged);
}

TEST(ImplicitTest, ModuleCellGradientsWrtInjectionAndParameters) {
  Rng rng(7);
  auto cell =
      std::make_shared<DEQCell>(CellOptions{.dim = 4, .heads = 2, .hidden = 6, .dtype = kF64}, rng);
  Implicit layer(cell, TightOptions());
  // The cell is this layer's child: its parameters are "cell.*".
  EXPECT_TRUE(layer.HasParameter("cell.wq.weight"));
  EXPECT_EQ(layer.parameters().size(), cell->parameters().size());
  const Var u(RandomNormal({2, 3, 4}, 0.0, 1.0, kF64, rng));
  GradCheckOptions check;
  check.relative_tolerance = 1e-5;
  auto r = testing_support::CheckModuleGradients(
      layer, [&](const VarList& in) { return layer.Forward(in[0]); }, {u}, check);
  EXPECT_TRUE(r) << r;
}

TEST(ImplicitTest, AcceptsAnyModuleWithForwardOfStateAndInjection) {
  // Not a Cell: just a Module with Forward(z, u).
  class Affine : public Module {
   public:
    Affine() { scale_ = RegisterParameter("scale", Tensor::Full({}, 0.5, kF64)); }
    Var Forward(const Var& z, const Var& u) const { return add(mul(z, scale_), u); }

   private:
    Var scale_;
  };
  auto cell = std::make_shared<Affine>();
  Implicit layer(cell, TightOptions());
  const Var u(Tensor::FromVector({2, 1}, {1.0, -3.0}, kF64), true);
  const Var z_star = layer.Forward(u);
  // z = 0.5 z + u  =>  z* = 2 u.
  EXPECT_NEAR(z_star.value().at(0), 2.0, 1e-12);
  EXPECT_NEAR(z_star.value().at(1), -6.0, 1e-12);
  backward(sum(z_star));
  // dz*/du = 1 / (1 - 0.5) = 2; dz*/dscale = z* / (1 - 0.5) summed = 2 (2 - 6) = -8.
  EXPECT_NEAR(u.grad().value().at(0), 2.0, 1e-10);
  EXPECT_NEAR(cell->parameter("scale").grad().item(), -8.0, 1e-10);
}

// Second derivatives through the solve, in closed form: z = s z + u gives
// z* = u / (1 - s), so d sum(z*)/ds = sum(u) / (1 - s)^2,
// d^2 sum(z*)/ds^2 = 2 sum(u) / (1 - s)^3 and d^2 sum(z*)/(ds du_i) =
// 1 / (1 - s)^2. The first needs z*'s own dependence on s, the others the
// adjoint's (an implicit node of its own under create_graph).
TEST(ImplicitTest, SecondDerivativesThroughTheSolveMatchTheClosedForm) {
  class Affine : public Module {
   public:
    Affine() { scale_ = RegisterParameter("scale", Tensor::Full({}, 0.5, kF64)); }
    Var Forward(const Var& z, const Var& u) const { return add(mul(z, scale_), u); }
    const Var& scale() const { return scale_; }

   private:
    Var scale_;
  };
  for (AdjointSolverType solver : {AdjointSolverType::kGmres, AdjointSolverType::kFixedPoint}) {
    SCOPED_TRACE(ToString(solver));
    auto cell = std::make_shared<Affine>();
    ImplicitOptions options = TightOptions();
    options.backward.solver = solver;
    Implicit layer(cell, options);
    const Var u(Tensor::FromVector({2, 1}, {1.0, -3.0}, kF64), true);
    const Var z_star = layer.Forward(u);
    const VarList first =
        grad({sum(z_star)}, {cell->scale()}, {}, {.retain_graph = true, .create_graph = true});
    EXPECT_NEAR(first[0].item(), -8.0, 1e-10);  // sum(u) / 0.25
    const VarList second = grad({first[0]}, {cell->scale(), u});
    EXPECT_NEAR(second[0].item(), -32.0, 1e-8);  // 2 sum(u) / 0.125
    EXPECT_NEAR(second[1].value().at(0), 4.0, 1e-9);
    EXPECT_NEAR(second[1].value().at(1), 4.0, 1e-9);
  }
}

// The same for a transformer cell, checked against finite differences of
// the first-order implicit gradient: <d, dL/dtheta> + <e, dL/du> as a
// function of u and of every parameter, L = <c, z*>.
TEST(ImplicitTest, GradientOfTheImplicitGradientMatchesFiniteDifferences) {
  Rng rng(12);
  auto cell =
      std::make_shared<DEQCell>(CellOptions{.dim = 4, .heads = 2, .hidden = 6, .dtype = kF64}, rng);
  Implicit layer(cell, TightOptions());
  const Var u(RandomNormal({2, 3, 4}, 0.0, 1.0, kF64, rng));
  const Var c(RandomNormal({2, 3, 4}, 0.0, 1.0, kF64, rng));
  const Var e(RandomNormal({2, 3, 4}, 0.0, 1.0, kF64, rng));
  std::vector<Var> d;
  for (const Var& p : cell->parameters()) d.emplace_back(RandomNormal(p.shape(), 0.0, 1.0, kF64, rng));
  auto forward = [&](const VarList& in) {
    GradModeGuard tape_on(true);
    const Var input = in[0].requires_grad() ? in[0] : Var(in[0].value(), true);
    const Var loss = sum(mul(layer.Forward(input), c));
    VarList targets = cell->parameters();
    targets.push_back(input);
    const VarList g = grad({loss}, targets, {}, {.retain_graph = true, .create_graph = true});
    Var out = sum(mul(g.back(), e));
    for (std::size_t k = 0; k < d.size(); ++k) out = add(out, sum(mul(g[k], d[k])));
    return out;
  };
  GradCheckOptions check;
  check.relative_tolerance = 1e-5;
  check.absolute_tolerance = 1e-7;
  auto r = testing_support::CheckModuleGradients(layer, forward, {u}, check);
  EXPECT_TRUE(r) << r;
}

TEST(ImplicitTest, DropoutMasksAreFrozenForEachSolve) {
  Rng rng(8);
  auto cell = std::make_shared<DEQCell>(
      CellOptions{.dim = 4, .heads = 2, .hidden = 6, .dropout = 0.2, .dtype = kF64}, rng);
  Implicit layer(cell, TightOptions());
  const Var u(RandomNormal({3, 2, 4}, 0.0, 1.0, kF64, rng));
  NoGrad no_grad;
  const Tensor first = layer.Forward(u).value();
  // One fixed map per solve: it converged, and z* is a fixed point of the
  // cell with the masks still frozen.
  EXPECT_EQ(layer.forward_summary().termination_type, TerminationType::kConverged)
      << layer.forward_summary().FullReport();
  EXPECT_LT(MaxAbsDiff(cell->Forward(Var(first), u, {}).value(), first), 1e-11);
  // The next solve draws new masks, so it finds another fixed point.
  const Tensor second = layer.Forward(u).value();
  EXPECT_GT(MaxAbsDiff(first, second), 1e-6);
  // In evaluation mode there is no dropout: the same fixed point every time.
  layer.Eval();
  EXPECT_LT(MaxAbsDiff(layer.Forward(u).value(), layer.Forward(u).value()), 1e-15);
}

TEST(ImplicitTest, RejectsMismatchedInitialState) {
  Rng rng(9);
  const Var w(SmallWeight(3, rng));
  Implicit layer(TanhCell(w), TightOptions());
  const Var u(RandomNormal({2, 3}, 0.0, 1.0, kF64, rng));
  EXPECT_THROW(layer.Forward(u, Tensor::Zeros({3, 3}, kF64)), Error);
  EXPECT_THROW(layer.Forward(u, Tensor::Zeros({2, 3}, DType::kFloat32)), Error);
}

}  // namespace
}  // namespace stillpoint::implicit_test
