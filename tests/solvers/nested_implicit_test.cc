// An implicit layer nested in another one's cell, as the inner solve of an
// energy attention nests in a DEQ cell: the outer adjoint's VJPs each pass
// through the inner implicit node, which solves its own adjoint every time.
// With ImplicitOptions::nested_adjoint_warm_start those inner solves start
// from the previous one of the same outer adjoint solve: the gradient is
// still the finite-difference one, the inner adjoint needs fewer VJPs, and a
// second backward pass gives bitwise the same gradient (each outer adjoint
// solve starts its inner ones afresh).
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "framework/autograd.h"
#include "framework/ops.h"
#include "framework/random.h"
#include "solvers/implicit_solve.h"
#include "tests/solvers/implicit_problems.h"

namespace stillpoint::nested_implicit_test {
namespace {

using implicit_test::ImplicitProblem;
using implicit_test::Leaf;
using implicit_test::NumericGradients;
using implicit_test::ProbeLoss;
using implicit_test::RandomMatrix;
using implicit_test::RelativeError;
using implicit_test::TightForward;

// Identity whose backward counts its calls: inside the inner cell it is
// passed once by every VJP of the inner adjoint solve (and once by the
// final pass that carries its solution on).
Var CountBackward(const Var& x, std::shared_ptr<int64_t> calls) {
  return RecordOp("count_backward", x.value().Clone(), {x},
                  [calls](const VarList&, const Var&, const Var& g) -> VarList {
                    ++*calls;
                    return {g};
                  });
}

ImplicitOptions Tight() {
  ImplicitOptions options;
  options.forward = TightForward(ForwardSolverType::kAnderson);
  options.backward.solver = AdjointSolverType::kFixedPoint;
  options.backward.tolerance = 1e-11;
  options.backward.max_iterations = 300;
  return options;
}

// Outer cell f(z) = tanh(z W^T + y*(z) P^T + x U^T + b), where the inner
// state y*(z) [k, m] is the fixed point of y = tanh(y A^T + z V^T + c),
// solved by SolveImplicit inside the cell. Both maps contract.
struct NestedProblem {
  ImplicitProblem problem;
  std::shared_ptr<int64_t> inner_vjps = std::make_shared<int64_t>(0);
};

NestedProblem MakeNested(bool nested_warm_start) {
  const int64_t batch = 3, n = 5, m = 4, d = 3;
  Rng rng(21);
  NestedProblem nested;
  ImplicitProblem& p = nested.problem;
  p.name = "nested_tanh";
  Var w = Leaf(RandomMatrix(n, n, 0.5, false, rng));
  Var pm = Leaf(RandomMatrix(n, m, 0.6, false, rng));
  Var u = Leaf(RandomNormal(Shape{n, d}, 0.0, 0.5, DType::kFloat64, rng));
  Var b = Leaf(RandomNormal(Shape{n}, 0.0, 0.3, DType::kFloat64, rng));
  Var x = Leaf(RandomNormal(Shape{batch, d}, 0.0, 1.0, DType::kFloat64, rng));
  // The inner map contracts by 0.8 so its adjoint takes many iterations
  // from g and few from a nearby solution.
  Var a = Leaf(RandomMatrix(m, m, 0.8, false, rng));
  Var v = Leaf(RandomMatrix(m, n, 0.7, false, rng));
  Var c = Leaf(RandomNormal(Shape{m}, 0.0, 0.3, DType::kFloat64, rng));
  p.params = {w, pm, u, b, x, a, v, c};
  p.param_names = {"W", "P", "U", "b", "x", "A", "V", "c"};
  ImplicitOptions inner = Tight();
  inner.nested_adjoint_warm_start = nested_warm_start;
  std::shared_ptr<int64_t> calls = nested.inner_vjps;
  p.cell = [=](const Var& z, const std::vector<int64_t>& ids) {
    const Var drive = add(matmul(z, v, false, true), c);
    CellFn inner_cell = [a, drive, calls](const Var& y, const std::vector<int64_t>& rows) {
      const Var y_counted = CountBackward(y, calls);
      return tanh(add(matmul(y_counted, a, false, true), gather(drive, 0, rows)));
    };
    const Tensor y0 = Tensor::Zeros(Shape{z.dim(0), m}, DType::kFloat64);
    const Var y_star = SolveImplicit(inner_cell, y0, inner).z_star;
    return tanh(add(add(matmul(z, w, false, true), matmul(y_star, pm, false, true)),
                    add(matmul(gather(x, 0, ids), u, false, true), b)));
  };
  p.z0 = Tensor::Zeros(Shape{batch, n}, DType::kFloat64);
  return nested;
}

Tensor Probe() {
  Rng rng(5);
  return RandomNormal(Shape{3, 5}, 0.0, 1.0, DType::kFloat64, rng);
}

std::vector<Tensor> Values(const VarList& grads) {
  std::vector<Tensor> out;
  for (const Var& g : grads) out.push_back(g.value().Clone());
  return out;
}

TEST(NestedImplicit, WarmStartedInnerAdjointsKeepTheGradientWithFewerVjps) {
  NestedProblem cold = MakeNested(false);
  NestedProblem warm = MakeNested(true);
  const Tensor probe = Probe();
  const ImplicitOptions outer = Tight();

  const ImplicitResult cold_result = SolveImplicit(cold.problem.cell, cold.problem.z0, outer);
  const std::vector<Tensor> cold_grads =
      Values(grad({ProbeLoss(cold_result.z_star, probe)}, cold.problem.params));
  const ImplicitResult warm_result = SolveImplicit(warm.problem.cell, warm.problem.z0, outer);
  const std::vector<Tensor> warm_grads =
      Values(grad({ProbeLoss(warm_result.z_star, probe)}, warm.problem.params));
  ASSERT_EQ(cold_result.backward->termination_type, TerminationType::kConverged)
      << cold_result.backward->FullReport();
  ASSERT_EQ(warm_result.backward->termination_type, TerminationType::kConverged)
      << warm_result.backward->FullReport();

  // Every inner adjoint stops at a relative residual of 1e-11: the two
  // gradients agree far below the finite-difference error, and both match
  // central differences of the whole nested solve.
  EXPECT_LT(RelativeError(warm_grads, cold_grads), 1e-9);
  const std::vector<Tensor> numeric =
      NumericGradients(warm.problem, warm.problem.cell, outer.forward, probe);
  EXPECT_LT(RelativeError(warm_grads, numeric), 1e-6);

  // The outer adjoint took more than a few iterations, so there were inner
  // solves to start warm, and they needed clearly fewer VJPs.
  ASSERT_GT(warm_result.backward->iterations, 5);
  EXPECT_LT(*warm.inner_vjps * 10, *cold.inner_vjps * 7)
      << "inner VJPs with warm starts " << *warm.inner_vjps << ", without " << *cold.inner_vjps;
}

TEST(NestedImplicit, EachBackwardPassStartsItsInnerAdjointsAfresh) {
  NestedProblem warm = MakeNested(true);
  const Tensor probe = Probe();
  const ImplicitResult result = SolveImplicit(warm.problem.cell, warm.problem.z0, Tight());
  const Var loss = ProbeLoss(result.z_star, probe);
  const std::vector<Tensor> first =
      Values(grad({loss}, warm.problem.params, {}, {.retain_graph = true}));
  const int64_t first_vjps = *warm.inner_vjps;
  const std::vector<Tensor> second = Values(grad({loss}, warm.problem.params));
  // Bitwise the same gradient and the same work: the second pass did not
  // start from the first pass's inner solutions.
  EXPECT_EQ(*warm.inner_vjps, 2 * first_vjps);
  for (size_t k = 0; k < first.size(); ++k) {
    EXPECT_EQ(first[k].ToVector(), second[k].ToVector()) << warm.problem.param_names[k];
  }
}

TEST(NestedImplicit, OutsideAnOuterAdjointSolveTheOptionChangesNothing) {
  // A layer that is not nested sees no enclosing adjoint solve: with the
  // option on, two backward passes each start from g, as without it.
  implicit_test::ImplicitProblem p = implicit_test::TanhProblem(2, 4, 3, 13);
  Rng rng(6);
  const Tensor probe = RandomNormal(p.z0.shape(), 0.0, 1.0, DType::kFloat64, rng);
  ImplicitOptions options = Tight();
  std::vector<std::vector<Tensor>> grads;
  std::vector<int64_t> vjps;
  for (bool on : {false, true}) {
    options.nested_adjoint_warm_start = on;
    const ImplicitResult result = SolveImplicit(p.cell, p.z0, options);
    grads.push_back(Values(grad({ProbeLoss(result.z_star, probe)}, p.params)));
    vjps.push_back(result.backward->vjp_evaluations);
    EXPECT_FALSE(result.backward->warm_started);
  }
  EXPECT_EQ(vjps[0], vjps[1]);
  for (size_t k = 0; k < grads[0].size(); ++k) {
    EXPECT_EQ(grads[0][k].ToVector(), grads[1][k].ToVector());
  }
}

}  // namespace
}  // namespace stillpoint::nested_implicit_test
