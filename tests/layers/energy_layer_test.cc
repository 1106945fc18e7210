// The EnergyLayer interface: a layer written as an energy only (default
// autodiff gradient and gradient-step update), cells for the solvers,
// traces, masks, and the two solve modes (contexts and their selection:
// energy_context_test.cc).

#include "layers/energy_layer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "framework/gradcheck.h"
#include "framework/init.h"
#include "framework/ops.h"
#include "tests/layers/energy_test_util.h"

namespace stillpoint::energy_layer_test {
namespace {

using testing_energy::CheckParameterGradients;
using testing_energy::Randn;
using testing_energy::RandnVar;

// E(z) = 1/2 |z|^2 - sum_m softplus(z W + u)_m per sample: a Bernoulli
// cumulant (RBM) energy with a per-sample injection u from the context.
// Only the energy is written.
struct InjectionContext {
  Var injection;  // [B, M], per sample
  static const ContextFields<InjectionContext>& Fields() {
    static const auto fields = ContextFields<InjectionContext>("InjectionContext")
                                   .PerSample("injection", &InjectionContext::injection);
    return fields;
  }
};

class SoftplusMemory : public EnergyLayer<InjectionContext> {
 public:
  SoftplusMemory(int64_t dim, int64_t memories, Rng& rng) {
    weight_ = RegisterParameter("weight", Randn({dim, memories}, rng, 0.5));
  }
  std::string Name() const override { return "SoftplusMemory"; }
  Var Energy(const Var& z, const InjectionContext& ctx) const override {
    Var drive = add(matmul(z, weight_), ctx.injection);  // [B, M]
    return sub(mul_scalar(sum(square(z), -1), 0.5), sum(softplus(drive), -1));
  }
  const Var& weight() const { return weight_; }

 private:
  Var weight_;
};

struct Fixture {
  Rng rng{1};
  SoftplusMemory layer{3, 5, rng};
  Tensor injection = Randn({4, 5}, rng);
  Tensor z = Randn({4, 3}, rng);
  InjectionContext Context(const Var& u) const { return InjectionContext{.injection = u}; }
};

TEST(EnergyLayerTest, DefaultGradientIsAutodiffOfTheEnergy) {
  Fixture f;
  InjectionContext ctx = f.Context(Var(f.injection));
  // dE/dz = z - sigmoid(z W + u) W^T.
  Var w = f.layer.weight();
  Tensor expected =
      sub(Var(f.z), matmul(sigmoid(add(matmul(Var(f.z), w), Var(f.injection))), w, false, true))
          .value();
  EXPECT_LT(MaxAbsDiff(f.layer.EnergyGrad(Var(f.z), ctx).value(), expected), 1e-12);
  // With the tape off the gradient is a plain value.
  NoGrad no_grad;
  Var g = f.layer.EnergyGrad(Var(f.z), ctx);
  EXPECT_FALSE(g.requires_grad());
  EXPECT_LT(MaxAbsDiff(g.value(), expected), 1e-12);
}

TEST(EnergyLayerTest, DefaultUpdateIsGradientStep) {
  Fixture f;
  InjectionContext ctx = f.Context(Var(f.injection));
  Tensor g = f.layer.EnergyGrad(Var(f.z), ctx).value();
  EXPECT_DOUBLE_EQ(f.layer.gradient_step(), 0.1);
  f.layer.set_gradient_step(0.5);
  Tensor expected = sub(Var(f.z), mul_scalar(Var(g), 0.5)).value();
  EXPECT_LT(MaxAbsDiff(f.layer.Update(Var(f.z), ctx).value(), expected), 1e-14);
  EXPECT_FALSE(f.layer.UpdateIsMonotone());
  EXPECT_THROW(f.layer.set_gradient_step(0.0), Error);
}

// The default update is differentiable (it records the gradient with
// create_graph), so fixed-step solves backpropagate to the initial state,
// the context and the parameters: second derivatives of the energy.
TEST(EnergyLayerTest, UnrolledUpdatesAreDifferentiable) {
  Fixture f;
  auto r = CheckGradients(
      [&](const VarList& in) { return UnrollUpdates(f.layer, in[0], f.Context(in[1]), 3); },
      {Var(f.z), Var(f.injection)});
  EXPECT_TRUE(r) << r;
  Tensor probe = Randn({4, 3}, f.rng);
  auto p = CheckParameterGradients(f.layer, [&] {
    return sum(mul(UnrollUpdates(f.layer, Var(f.z), f.Context(Var(f.injection)), 3), Var(probe)));
  });
  EXPECT_TRUE(p) << p;
}

// Cells evaluate the samples a solver names, in either state layout.
TEST(EnergyLayerTest, CellsAndBatchedEnergyFollowSampleIds) {
  Fixture f;
  InjectionContext ctx = f.Context(Var(f.injection));
  Tensor full = f.layer.Update(Var(f.z), ctx).value();
  CellFn cell = MakeUpdateCell(f.layer, ctx, Shape{3});
  Var rows = gather(Var(f.z), 0, {1, 3});
  Tensor out = cell(rows, {1, 3}).value();
  for (int64_t k = 0; k < 3; ++k) {
    EXPECT_DOUBLE_EQ(out.at(k), full.at(3 + k));
    EXPECT_DOUBLE_EQ(out.at(3 + k), full.at(9 + k));
  }
  CellFn step_cell = MakeGradientStepCell(f.layer, ctx, Shape{3}, 0.25);
  Tensor step = step_cell(Var(f.z), {0, 1, 2, 3}).value();
  EXPECT_LT(MaxAbsDiff(step, f.layer.GradientStep(Var(f.z), ctx, 0.25).value()), 1e-15);
  EXPECT_THROW(cell(RandnVar({2, 4}, f.rng), {0, 1}), Error);  // wrong state size

  BatchedEnergy energy = MakeBatchedEnergy(f.layer, ctx, Shape{3});
  Tensor e(Shape{2}, DType::kFloat64), g(Shape{2, 3}, DType::kFloat64);
  ASSERT_TRUE(energy(rows.value(), {1, 3}, &e, &g));
  Tensor all_e = f.layer.Energy(Var(f.z), ctx).value();
  Tensor all_g = f.layer.EnergyGrad(Var(f.z), ctx).value();
  EXPECT_DOUBLE_EQ(e.at(0), all_e.at(1));
  EXPECT_DOUBLE_EQ(e.at(1), all_e.at(3));
  EXPECT_DOUBLE_EQ(g.at(3), all_g.at(9));
}

TEST(EnergyLayerTest, TraceRecordsEnergiesAndStops) {
  Fixture f;
  InjectionContext ctx = f.Context(Var(f.injection));
  f.layer.set_gradient_step(0.2);
  EnergyTraceOptions options;
  options.max_steps = 500;
  options.tolerance = 1e-10;
  EnergyTrace trace = TraceUpdates(f.layer, f.z, ctx, options);
  EXPECT_TRUE(trace.converged);
  EXPECT_LT(trace.steps, 500);
  EXPECT_EQ(trace.energies.size(), static_cast<std::size_t>(trace.steps + 1));
  EXPECT_EQ(trace.energies[0].size(), 4u);
  EXPECT_EQ(trace.CountIncreases(1e-12), 0);
  EXPECT_LE(trace.MaxIncrease(), 1e-12);  // rounding at convergence
  // At the end the gradient vanishes.
  Tensor g = f.layer.EnergyGrad(Var(trace.final_state), ctx).value();
  EXPECT_LT(testing_energy::MaxAbs(g), 1e-9);
  // The input is not modified.
  EXPECT_EQ(MaxAbsDiff(f.z, Fixture().z), 0.0);
}

// A user layer solved to its fixed point: the implicit gradient with respect
// to the injection and the weights matches finite differences of the solve.
TEST(EnergyLayerTest, FixedPointModeHasImplicitGradient) {
  Fixture f;
  f.layer.set_gradient_step(0.5);
  EnergySolveOptions solve;
  solve.mode = EnergySolveMode::kFixedPoint;
  solve.implicit.forward.max_iterations = 200;
  solve.implicit.forward.stop_mode = StopMode::kAbsolute;
  solve.implicit.forward.absolute_tolerance = 1e-13;
  solve.implicit.backward.solver = AdjointSolverType::kGmres;
  solve.implicit.backward.tolerance = 1e-12;
  solve.trace_energy = true;
  GradCheckOptions tolerances;
  tolerances.step = 1e-5;
  tolerances.relative_tolerance = 1e-5;
  tolerances.absolute_tolerance = 1e-7;
  auto r = CheckGradients(
      [&](const VarList& in) { return f.layer.Solve(Var(f.z), f.Context(in[0]), solve); },
      {Var(f.injection)}, tolerances);
  EXPECT_TRUE(r) << r;
  const EnergySolveReport& report = f.layer.last_solve();
  EXPECT_EQ(report.implicit.forward.termination_type, TerminationType::kConverged);
  ASSERT_EQ(report.energies.size(), 2u);
  EXPECT_LT(report.energies[1][0], report.energies[0][0]);

  Tensor probe = Randn({4, 3}, f.rng);
  auto p = CheckParameterGradients(
      f.layer,
      [&] {
        return sum(mul(f.layer.Solve(Var(f.z), f.Context(Var(f.injection)), solve), Var(probe)));
      },
      1e-5, 1e-5, 1e-7);
  EXPECT_TRUE(p) << p;

  // Fixed steps record their energies after every step.
  EnergySolveOptions steps = FixedSteps(4);
  steps.trace_energy = true;
  f.layer.Solve(Var(f.z), f.Context(Var(f.injection)), steps);
  EXPECT_EQ(f.layer.last_solve().steps, 4);
  EXPECT_EQ(f.layer.last_solve().energies.size(), 5u);
}

TEST(EnergyLayerTest, AttentionMaskConventions) {
  AttentionMask mask;
  mask.key_mask = Tensor::FromVector({2, 3}, {0, 1, 0, 0, 0, 0}, DType::kFloat64);
  mask.additive = Tensor::FromVector({2, 3}, {0.5, 0, 0, 0, 0, -1}, DType::kFloat64);
  const Tensor m = MakeAttentionMask(mask, /*causal=*/true, 2, 4, 2, 3, DType::kFloat64).value();
  ASSERT_EQ(m.shape(), (Shape{2, 1, 2, 3}));
  // Sample 0: key 1 hidden; query 0 (offset S - N = 1) sees keys 0, 1.
  const std::vector<double> expected0 = {0.5, -INFINITY, -INFINITY, 0, -INFINITY, -1};
  const std::vector<double> expected1 = {0.5, 0, -INFINITY, 0, 0, -1};
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(m.at(i), expected0[i]) << i;
    EXPECT_EQ(m.at(6 + i), expected1[i]) << i;
  }
  EXPECT_FALSE(MakeAttentionMask({}, false, 2, 4, 2, 3, DType::kFloat64).defined());
  AttentionMask bad;
  bad.key_mask = Tensor::Zeros({2, 4}, DType::kFloat64);
  EXPECT_THROW(MakeAttentionMask(bad, false, 2, 4, 2, 3, DType::kFloat64), Error);
}

TEST(EnergyLayerTest, EnumStrings) {
  KeyGrad key_grad;
  ASSERT_TRUE(StringToKeyGrad("stop", &key_grad));
  EXPECT_EQ(key_grad, KeyGrad::kStop);
  EXPECT_STREQ(ToString(KeyGrad::kFull), "full");
  EXPECT_FALSE(StringToKeyGrad("partial", &key_grad));
  EnergySolveMode mode;
  ASSERT_TRUE(StringToEnergySolveMode("fixed_point", &mode));
  EXPECT_EQ(mode, EnergySolveMode::kFixedPoint);
  EXPECT_STREQ(ToString(EnergySolveMode::kFixedSteps), "fixed_steps");
  EXPECT_FALSE(StringToEnergySolveMode("fixed", &mode));
}

// An Energy that returns one number for the whole batch (a sum over the
// samples) instead of [B] is refused, naming the layer.
class BatchSummedEnergy : public EnergyLayer<NoContext> {
 public:
  std::string Name() const override { return "BatchSummedEnergy"; }
  Var Energy(const Var& z, const NoContext&) const override {
    return mul_scalar(sum(square(z)), 0.5);
  }
};

TEST(EnergyLayerTest, AnEnergyNotShapedBatchIsRefused) {
  BatchSummedEnergy layer;
  Rng rng(3);
  const Var z(RandomNormal({4, 2}, 0, 1, DType::kFloat64, rng));
  try {
    layer.EnergyGrad(z, NoContext());
    ADD_FAILURE() << "a scalar energy was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("BatchSummedEnergy::Energy returned shape []"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("it must return [4]"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace stillpoint::energy_layer_test
