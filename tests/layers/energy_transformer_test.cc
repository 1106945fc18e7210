// EnergyTransformerBlock (Hoover et al.): the energy pieces, their
// gradients, and the Lyapunov property of both dynamics
// (docs/seeds.md, checks E1-E3).

#include "layers/energy_transformer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "framework/gradcheck.h"
#include "framework/ops.h"
#include "tests/layers/energy_test_util.h"

namespace stillpoint::energy_transformer_test {
namespace {

using testing_energy::CheckParameterGradients;
using testing_energy::Randn;
using testing_energy::RandnVar;

// The E1 configuration: N = 7 tokens, D = 12, 2 heads, Y = 4, 16 memories,
// weights N(0, 0.3^2).
EnergyTransformerOptions E1Options() {
  EnergyTransformerOptions options;
  options.dim = 12;
  options.heads = 2;
  options.head_dim = 4;
  options.memories = 16;
  options.weight_std = 0.3;
  options.memory_std = 0.3;
  options.dtype = DType::kFloat64;
  return options;
}

// Central differences of a scalar function [B] -> summed, at g.
double MaxFiniteDifferenceError(const std::function<Var(const Var&)>& energy,
                                const Tensor& g,
                                const Tensor& analytic,
                                double h = 1e-5) {
  double worst = 0.0;
  for (int64_t i = 0; i < g.numel(); ++i) {
    Tensor plus = g.Clone(), minus = g.Clone();
    plus.set(i, g.at(i) + h);
    minus.set(i, g.at(i) - h);
    const double numeric =
        (sum(energy(Var(plus))).item() - sum(energy(Var(minus))).item()) / (2.0 * h);
    worst = std::max(worst, std::abs(numeric - analytic.at(i)));
  }
  return worst;
}

// E1: finite differences of the two-term attention gradient, the memory
// gradients and the Lagrangian's gradient (which is the layer norm, E3).
TEST(EnergyTransformerTest, GradientsMatchFiniteDifferences) {
  for (bool exclude_self : {true, false}) {
    for (EnergyTransformerMemory memory :
         {EnergyTransformerMemory::kRelu2, EnergyTransformerMemory::kSoftmax}) {
      SCOPED_TRACE(std::string(ToString(memory)) + (exclude_self ? " exclude_self" : ""));
      Rng rng(1);
      EnergyTransformerOptions options = E1Options();
      options.exclude_self = exclude_self;
      options.memory = memory;
      options.memory_beta = 0.7;
      EnergyTransformerBlock block(options, rng);
      Var(block.parameter("delta")).mutable_value().CopyFrom(Randn({12}, rng, 0.3));
      Var(block.parameter("gamma")).mutable_value().Fill(1.3);
      Tensor x = Randn({2, 7, 12}, rng);
      EnergyTransformerContext ctx = block.Prepare(Var(x));
      Tensor g = block.Normalize(Var(x)).value();

      NoGrad no_grad;
      EXPECT_LT(
          MaxFiniteDifferenceError([&](const Var& v) { return block.AttentionEnergy(v, ctx); }, g,
                                   block.AttentionEnergyGrad(Var(g), ctx).value()),
          1e-8);
      EXPECT_LT(MaxFiniteDifferenceError([&](const Var& v) { return block.MemoryEnergy(v); }, g,
                                         block.MemoryEnergyGrad(Var(g)).value()),
                1e-8);
      EXPECT_LT(MaxFiniteDifferenceError([&](const Var& v) { return block.Lagrangian(v); }, x,
                                         block.Normalize(Var(x)).value()),
                1e-8);
    }
  }
}

// E3: the autodiff gradient of the Lagrangian is the energy layer norm.
TEST(EnergyTransformerTest, LagrangianGradientIsLayerNorm) {
  Rng rng(2);
  EnergyTransformerBlock block(E1Options(), rng);
  Var(block.parameter("delta")).mutable_value().CopyFrom(Randn({12}, rng));
  Var x(Randn({3, 5, 12}, rng), true);
  Var g = grad({sum(block.Lagrangian(x))}, {x})[0];
  EXPECT_LT(MaxAbsDiff(g.value(), block.Normalize(x).value()), 1e-12);
}

// key_grad = stop keeps only the query-side term: the gradient with the
// keys computed from a constant copy of g.
TEST(EnergyTransformerTest, StopKeyGradIsQuerySideTerm) {
  Rng rng(3);
  EnergyTransformerOptions options = E1Options();
  options.key_grad = KeyGrad::kStop;
  EnergyTransformerBlock block(options, rng);
  Tensor x = Randn({2, 7, 12}, rng);
  EnergyTransformerContext ctx = block.Prepare(Var(x));
  Tensor g = block.Normalize(Var(x)).value();
  // E_ATT with queries from g and keys from the constant g0.
  Var leaf(g.Clone(), true);
  Var wq = block.parameter("wq"), wk = block.parameter("wk");
  auto split = [](const Var& t) {
    return permute(reshape(t, Shape{t.dim(0), t.dim(1), 2, 4}), {0, 2, 1, 3});
  };
  Var q = split(matmul(leaf, wq)), k = split(matmul(Var(g), wk));
  Var scores = mul_scalar(matmul(q, k, false, true), 0.5);  // beta = 1/sqrt(4)
  scores = ApplyAttentionMask(scores, ctx.mask);
  Var energy = mul_scalar(sum(logsumexp(scores)), -2.0);
  Var expected = grad({energy}, {leaf})[0];
  EXPECT_LT(MaxAbsDiff(block.AttentionEnergyGrad(Var(g), ctx).value(), expected.value()), 1e-12);

  options.key_grad = KeyGrad::kFull;
  Rng same(3);
  EnergyTransformerBlock full(options, same);
  EXPECT_GT(MaxAbsDiff(full.AttentionEnergyGrad(Var(g), ctx).value(), expected.value()), 1e-3);
}

// The update is the Euler step of the flow that descends Energy():
// dE/dx = (dg/dx) dE/dg (non-leaky) and (dg/dx)(x + dE/dg) (leaky), so
// autodiff of the energy equals the layer norm's VJP of the update's force.
TEST(EnergyTransformerTest, UpdateForceIsConsistentWithEnergy) {
  for (auto dynamics : {EnergyTransformerDynamics::kNonLeaky, EnergyTransformerDynamics::kLeaky}) {
    SCOPED_TRACE(ToString(dynamics));
    Rng rng(4);
    EnergyTransformerOptions options = E1Options();
    options.dynamics = dynamics;
    options.step = 0.25;
    EnergyTransformerBlock block(options, rng);
    Tensor x = Randn({2, 7, 12}, rng);
    EnergyTransformerContext ctx = block.Prepare(Var(x));
    Tensor force = mul_scalar(sub(Var(x), block.Update(Var(x), ctx)), 1.0 / 0.25).value();
    Var leaf(x.Clone(), true);
    Var vjp = grad({block.Normalize(leaf)}, {leaf}, {Var(force)})[0];
    Var autodiff = AutodiffEnergyGrad(block, Var(x), ctx);
    EXPECT_LT(MaxAbsDiff(vjp.value(), autodiff.value()), 1e-12);
  }
}

// E2: 200 Euler steps at alpha = 0.1 and 1.0, both dynamics: the energy of
// the chosen dynamics never increases.
TEST(EnergyTransformerTest, NoEnergyIncreaseInEitherDynamics) {
  for (auto dynamics : {EnergyTransformerDynamics::kNonLeaky, EnergyTransformerDynamics::kLeaky}) {
    for (double step : {0.1, 1.0}) {
      SCOPED_TRACE(std::string(ToString(dynamics)) + " step " + std::to_string(step));
      Rng rng(5);
      EnergyTransformerOptions options = E1Options();
      options.dynamics = dynamics;
      options.step = step;
      EnergyTransformerBlock block(options, rng);
      Tensor x = Randn({4, 7, 12}, rng);
      EnergyTransformerContext ctx = block.Prepare(Var(x));
      EnergyTraceOptions trace_options;
      trace_options.max_steps = 200;
      EnergyTrace trace = TraceUpdates(block, x, ctx, trace_options);
      EXPECT_EQ(trace.CountIncreases(1e-10), 0) << trace.MaxIncrease();
      for (int64_t b = 0; b < 4; ++b) {
        EXPECT_LT(trace.energies.back()[b], trace.energies.front()[b] - 1.0) << b;
      }
    }
  }
}

TEST(EnergyTransformerTest, GradcheckForward) {
  for (auto dynamics : {EnergyTransformerDynamics::kNonLeaky, EnergyTransformerDynamics::kLeaky}) {
    SCOPED_TRACE(ToString(dynamics));
    Rng rng(6);
    EnergyTransformerOptions options;
    options.dim = 4;
    options.heads = 2;
    options.head_dim = 2;
    options.memories = 3;
    options.memory = EnergyTransformerMemory::kSoftmax;
    options.learn_beta = true;
    options.weight_std = 0.5;
    options.memory_std = 0.5;
    options.dynamics = dynamics;
    options.step = 0.3;
    options.solve.steps = 3;
    options.dtype = DType::kFloat64;
    EnergyTransformerBlock block(options, rng);
    AttentionMask mask;
    mask.key_mask = Tensor::FromVector({2, 3}, {0, 0, 0, 0, 1, 0}, DType::kFloat64);
    auto r = CheckGradients([&](const VarList& in) { return block.Forward(in[0], mask); },
                            {RandnVar({2, 3, 4}, rng)});
    EXPECT_TRUE(r) << r;
    Var x = RandnVar({2, 3, 4}, rng);
    Tensor probe = Randn({2, 3, 4}, rng);
    auto p = CheckParameterGradients(block,
                                     [&] { return sum(mul(block.Forward(x, mask), Var(probe))); });
    EXPECT_TRUE(p) << p;
  }
}

TEST(EnergyTransformerTest, RejectsMisuse) {
  Rng rng(7);
  EnergyTransformerBlock block(E1Options(), rng);
  EXPECT_THROW(block.Forward(RandnVar({1, 3, 5}, rng)), Error);
  EXPECT_THROW(block.Forward(RandnVar({1, 1, 12}, rng)), Error);  // exclude_self, one token
  EnergyTransformerOptions bad = E1Options();
  bad.step = 0.0;
  EXPECT_THROW(EnergyTransformerBlock(bad, rng), Error);
}

}  // namespace
}  // namespace stillpoint::energy_transformer_test
