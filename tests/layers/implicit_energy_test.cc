// Implicit over an energy layer: the user writes an energy, Implicit solves
// its Update to the fixed point and differentiates it implicitly. Checked in
// float64 against central differences of the converged solve, for the
// Hopfield layer and for an energy-only layer defined here (autodiff
// EnergyGrad, default gradient-step Update); plus the energy trace, the
// summaries and misuse errors.

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "framework/buffer_pool.h"
#include "framework/gradcheck.h"
#include "framework/ops.h"
#include "layers/hopfield.h"
#include "layers/implicit_layer.h"
#include "tests/layers/energy_test_util.h"

namespace stillpoint::implicit_energy_test {
namespace {

using testing_energy::Randn;
using testing_energy::RandnVar;

ImplicitOptions TightOptions(ForwardSolverType forward = ForwardSolverType::kAnderson) {
  return testing_energy::TightImplicitOptions(forward);
}

GradCheckOptions SolveTolerances() { return testing_energy::SolveGradCheckOptions(1e-8); }

// Keys K [B, S, d], per sample.
struct KeysContext {
  Var keys;
  static const ContextFields<KeysContext>& Fields() {
    static const auto fields =
        ContextFields<KeysContext>("KeysContext").PerSample("keys", &KeysContext::keys);
    return fields;
  }
};

// A layer written as an energy only: per sample z [d] with keys K [S, d],
//   E(z) = a/2 |z|^2 - lse(K z) - b.z,
// a [1] and b [d] learnable. Its Hessian a I - Cov_p[K] is positive definite
// for a above the keys' spread, so the default gradient step contracts.
class QuadraticLseEnergy : public EnergyLayer<KeysContext> {
 public:
  explicit QuadraticLseEnergy(int64_t dim) {
    a_ = RegisterParameter("a", Tensor::Full({1}, 2.0, DType::kFloat64));
    b_ = RegisterParameter("b", Tensor::Full({dim}, 0.1, DType::kFloat64));
    set_gradient_step(0.3);
  }
  std::string Name() const override { return "QuadraticLseEnergy"; }

  Var Energy(const Var& z, const KeysContext& ctx) const override {
    const Var& keys = ctx.keys;  // [B, S, d]
    Var scores = reshape(matmul(keys, reshape(z, Shape{z.dim(0), z.dim(1), 1})),
                         Shape{z.dim(0), keys.dim(1)});
    Var quadratic = mul(mul_scalar(sum(square(z), 1), 0.5), a_);
    return sub(sub(quadratic, logsumexp(scores)), sum(mul(z, b_), 1));
  }

 private:
  Var a_, b_;
};

HopfieldOptions RawHopfield() {
  HopfieldOptions options;
  options.state_size = 4;
  options.head_dim = 4;
  options.beta = 16.0;
  options.dtype = DType::kFloat64;
  return options;
}

TEST(ImplicitEnergyTest, HopfieldGradientMatchesFiniteDifferencesOfTheSolve) {
  Rng rng(1);
  auto layer = std::make_shared<HopfieldAttention>(RawHopfield(), rng);
  Implicit solved(layer, TightOptions());
  const Tensor xi0 = Randn({2, 1, 2, 4}, rng, 0.5);
  // Context: the stored patterns.
  auto r = CheckGradients(
      [&](const VarList& in) {
        const HopfieldContext ctx{.keys = in[0]};
        return solved.Forward(ctx, Var(xi0));
      },
      {RandnVar({2, 1, 5, 4}, rng, 0.5)}, SolveTolerances());
  EXPECT_TRUE(r) << r;
  EXPECT_GT(r.entries_checked, 0);
  // Parameters: beta, reached through the implicit backward only. A small
  // beta (a strongly convex energy, one smooth fixed point) so that it gets
  // a sizeable gradient; at beta = 16 the association is saturated.
  Var beta = layer->beta();
  beta.mutable_value().Fill(1.0);
  const Var keys = RandnVar({2, 1, 5, 4}, rng, 0.5);
  const Tensor probe = Randn({2, 1, 2, 4}, rng);
  auto p = testing_energy::CheckParameterGradients(
      solved,
      [&] {
        const HopfieldContext ctx{.keys = keys};
        return sum(mul(solved.Forward(ctx, Var(xi0)), Var(probe)));
      },
      1e-5, 1e-5, 1e-8);
  EXPECT_TRUE(p) << p;
  solved.ZeroGrad();
  const HopfieldContext ctx{.keys = keys};
  backward(sum(mul(solved.Forward(ctx, Var(xi0)), Var(probe))));
  ASSERT_TRUE(layer->beta().has_grad());
  EXPECT_GT(testing_energy::MaxAbs(layer->beta().grad().value()), 1e-3);
}

TEST(ImplicitEnergyTest, EnergyOnlyLayerGradientMatchesFiniteDifferences) {
  Rng rng(2);
  auto layer = std::make_shared<QuadraticLseEnergy>(3);
  Implicit solved(layer, TightOptions());
  const Tensor z0 = Randn({3, 3}, rng);
  auto r = CheckGradients(
      [&](const VarList& in) {
        const KeysContext ctx{.keys = in[0]};
        return solved.Forward(ctx, Var(z0));
      },
      {RandnVar({3, 4, 3}, rng, 0.5)}, SolveTolerances());
  EXPECT_TRUE(r) << r;
  const Var keys = RandnVar({3, 4, 3}, rng, 0.5);
  const Tensor probe = Randn({3, 3}, rng);
  auto p = testing_energy::CheckParameterGradients(
      solved,
      [&] {
        const KeysContext ctx{.keys = keys};
        return sum(mul(solved.Forward(ctx, Var(z0)), Var(probe)));
      },
      1e-5, 1e-5, 1e-8);
  EXPECT_TRUE(p) << p;
  // The solution is a stationary point: the energy's gradient vanishes.
  const KeysContext ctx{.keys = keys};
  NoGrad no_grad;
  const Var z_star = solved.Forward(ctx, Var(z0));
  EXPECT_LT(testing_energy::MaxAbs(layer->EnergyGrad(z_star, ctx).value()), 1e-10);
  const NamedVars params = solved.named_parameters();
  ASSERT_EQ(params.size(), 2u);
  EXPECT_EQ(params[0].first, "layer.a");
  EXPECT_EQ(params[1].first, "layer.b");
}

// The CCCP Hopfield update never increases the energy: with the plain
// (Picard) solver the trace is non-increasing, starts at E(xi0) and ends at
// the energy of the returned state.
TEST(ImplicitEnergyTest, HopfieldEnergyTraceIsNonIncreasing) {
  Rng rng(3);
  HopfieldOptions options = RawHopfield();
  options.beta = 2.0;  // metastable: takes a few iterations
  auto layer = std::make_shared<HopfieldAttention>(options, rng);
  ImplicitOptions implicit = TightOptions(ForwardSolverType::kPicard);
  implicit.forward.absolute_tolerance = 1e-10;
  Implicit solved(layer, implicit, EnergyImplicitOptions{.trace_energy = true});
  const HopfieldContext ctx{.keys = RandnVar({3, 1, 6, 4}, rng)};
  const Var xi0 = RandnVar({3, 1, 2, 4}, rng);
  const Var z_star = solved.Forward(ctx, xi0);
  const std::vector<std::vector<double>>& trace = solved.energy_trace();
  ASSERT_EQ(trace.size(), 3u);
  NoGrad no_grad;
  const std::vector<double> start = layer->Energy(xi0, ctx).value().ToVector();
  const std::vector<double> end = layer->Energy(Var(z_star.value()), ctx).value().ToVector();
  for (std::size_t b = 0; b < trace.size(); ++b) {
    SCOPED_TRACE(b);
    ASSERT_GE(trace[b].size(), 3u);
    EXPECT_NEAR(trace[b].front(), start[b], 1e-12);
    EXPECT_DOUBLE_EQ(trace[b].back(), end[b]);
    for (std::size_t t = 0; t + 1 < trace[b].size(); ++t) {
      EXPECT_LE(trace[b][t + 1], trace[b][t] + 1e-12) << "step " << t;
    }
    EXPECT_LT(trace[b].back(), trace[b].front());
  }
  // One entry per iteration the sample took part in, plus the final one.
  int64_t entries = 0;
  for (const auto& sample : trace) entries += static_cast<int64_t>(sample.size());
  EXPECT_EQ(entries, solved.forward_summary().function_evaluations + 3);
}

TEST(ImplicitEnergyTest, TraceIsEmptyWhenOff) {
  Rng rng(4);
  auto layer = std::make_shared<HopfieldAttention>(RawHopfield(), rng);
  Implicit solved(layer, TightOptions());
  const HopfieldContext ctx{.keys = RandnVar({1, 1, 3, 4}, rng)};
  solved.Forward(ctx, RandnVar({1, 1, 2, 4}, rng));
  EXPECT_TRUE(solved.energy_trace().empty());
  solved.mutable_energy_options().trace_energy = true;
  solved.Forward(ctx, RandnVar({1, 1, 2, 4}, rng));
  EXPECT_EQ(solved.energy_trace().size(), 1u);
}

TEST(ImplicitEnergyTest, SummariesAreFilled) {
  Rng rng(5);
  auto layer = std::make_shared<HopfieldAttention>(RawHopfield(), rng);
  Implicit solved(layer, TightOptions());
  Var keys = RandnVar({2, 1, 5, 4}, rng);
  keys.set_requires_grad(true);
  const HopfieldContext ctx{.keys = keys};
  Var z_star = solved.Forward(ctx, RandnVar({2, 1, 2, 4}, rng, 0.5));
  EXPECT_EQ(solved.forward_summary().termination_type, TerminationType::kConverged)
      << solved.forward_summary().BriefReport();
  EXPECT_GT(solved.forward_summary().iterations, 0);
  EXPECT_EQ(solved.forward_summary().batch_size, 2);
  ASSERT_NE(solved.backward_summary(), nullptr);
  backward(sum(z_star));
  EXPECT_EQ(solved.backward_summary()->termination_type, TerminationType::kConverged);
  EXPECT_GT(solved.backward_summary()->iterations, 0);
  EXPECT_TRUE(keys.has_grad());
  EXPECT_NE(solved.Name().find("HopfieldAttention"), std::string::npos) << solved.Name();
}

// What the layer keeps of its last solve is z*'s value: once the caller lets
// the returned z* go, the recorded evaluation (here the attention weights
// the backward pass needs, [2, 1, 2, 4000]) goes with it, rather than living
// on until the next Forward has finished (two recordings at once, for a
// layer nested in another's map).
TEST(ImplicitEnergyTest, TheLayerKeepsTheSolutionsValueNotItsGraph) {
  Rng rng(8);
  auto layer = std::make_shared<HopfieldAttention>(RawHopfield(), rng);
  Implicit solved(layer, TightOptions());
  Var keys = RandnVar({2, 1, 4000, 4}, rng, 0.1);
  keys.set_requires_grad(true);
  const HopfieldContext ctx{.keys = keys};
  const Var z0 = RandnVar({2, 1, 2, 4}, rng, 0.5);
  const int64_t before = GetBufferPoolStats().bytes_in_use;
  int64_t while_held = 0;
  {
    const Var z_star = solved.Forward(ctx, z0);
    EXPECT_TRUE(z_star.requires_grad());
    while_held = GetBufferPoolStats().bytes_in_use;
  }
  const int64_t after = GetBufferPoolStats().bytes_in_use;
  const int64_t weights_bytes = 2 * 2 * 4000 * static_cast<int64_t>(sizeof(double));
  EXPECT_GE(while_held - before, weights_bytes);  // the recording holds the weights
  EXPECT_LT(after - before, weights_bytes / 4) << "before " << before << ", after " << after;
  EXPECT_FALSE(solved.last_result().z_star.requires_grad());
  EXPECT_EQ(solved.last_result().z_star.shape(), z0.shape());
}

// The energy is handed to the solver: ceres_lbfgs minimises it directly and
// reaches the fixed point the update iteration finds.
TEST(ImplicitEnergyTest, CeresLbfgsMinimisesTheEnergy) {
  Rng rng(6);
  auto layer = std::make_shared<QuadraticLseEnergy>(3);
  const KeysContext ctx{.keys = RandnVar({2, 4, 3}, rng, 0.5)};
  const Var z0 = RandnVar({2, 3}, rng);
  NoGrad no_grad;
  Implicit anderson(layer, TightOptions());
  const Tensor reference = anderson.Forward(ctx, z0).value();
  ImplicitOptions lbfgs = TightOptions(ForwardSolverType::kCeresLbfgs);
  lbfgs.forward.absolute_tolerance = 1e-9;
  Implicit ceres(layer, lbfgs, EnergyImplicitOptions{.trace_energy = true});
  const Tensor solution = ceres.Forward(ctx, z0).value();
  EXPECT_LT(MaxAbsDiff(solution, reference), 1e-7) << ceres.forward_summary().BriefReport();
  ASSERT_EQ(ceres.energy_trace().size(), 2u);
  EXPECT_GE(ceres.energy_trace()[0].size(), 2u);
  EXPECT_LT(ceres.energy_trace()[0].back(), ceres.energy_trace()[0].front());
}

TEST(ImplicitEnergyTest, MisuseIsAnError) {
  Rng rng(7);
  auto layer = std::make_shared<QuadraticLseEnergy>(3);
  Implicit solved(layer);
  EXPECT_THROW(solved.Forward(RandnVar({2, 3}, rng)), Error);
  const KeysContext ctx{.keys = RandnVar({2, 4, 3}, rng)};
  EXPECT_THROW(solved.Forward(ctx, RandnVar({3, 3}, rng)), Error);  // batch mismatch
  Implicit plain([](const Var& z, const Var& u, const std::vector<int64_t>&) {
    return add(mul_scalar(z, 0.5), u);
  });
  EXPECT_THROW(plain.Forward(ctx, RandnVar({2, 3}, rng)), Error);
  EXPECT_THROW(Implicit(std::shared_ptr<EnergyLayerBase>()), Error);
}

}  // namespace
}  // namespace stillpoint::implicit_energy_test
