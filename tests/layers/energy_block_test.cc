// Energy attention blocks and the energy model kind: the block registry,
// each built-in block's problem and readout, float64 gradient checks of the
// whole energy model (implicit gradient against finite differences of the
// converged solve) for every built-in block, and the depth override.

#include "layers/energy_block.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "framework/gradcheck.h"
#include "framework/ops.h"
#include "layers/hopfield.h"
#include "layers/models.h"
#include "tests/layers/energy_test_util.h"

namespace stillpoint::energy_block_test {
namespace {

using testing_energy::Randn;
using testing_energy::RandnVar;

const std::vector<std::string>& BuiltinBlocks() {
  static const std::vector<std::string> names = {"energy_transformer", "expfam", "hopfield",
                                                 "probabilistic"};
  return names;
}

TEST(EnergyBlockRegistryTest, ListsTheBuiltinsAndNamesThemOnAnUnknownName) {
  for (const std::string& name : BuiltinBlocks()) {
    EXPECT_TRUE(EnergyBlockRegistry().Has(name)) << name;
    EXPECT_FALSE(EnergyBlockRegistry().Description(name).empty()) << name;
  }
  Rng rng(0);
  EnergyBlockOptions options;
  options.layer = "hopfeld";
  try {
    CreateEnergyBlock(options, rng);
    FAIL() << "an unknown block must throw";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("unknown energy block 'hopfeld'"), std::string::npos) << message;
    EXPECT_NE(message.find("energy_transformer, expfam, hopfield, probabilistic"),
              std::string::npos)
        << message;
  }
  options.layer = "hopfield";
  options.heads = 3;  // 64 % 3 != 0
  EXPECT_THROW(CreateEnergyBlock(options, rng), Error);
  EXPECT_EQ(EnergyBlockOptions().layer, "probabilistic");
}

// A user block registered next to the built-ins is usable by the model.
class ScaledHopfieldBlock : public EnergyBlock {
 public:
  ScaledHopfieldBlock(const EnergyBlockOptions& options, Rng& rng) {
    EnergyBlockOptions inner = options;
    inner.layer = "hopfield";
    inner_ = RegisterModule("inner", CreateEnergyBlock(inner, rng));
  }
  std::string Name() const override { return "ScaledHopfieldBlock"; }
  const std::shared_ptr<EnergyLayerBase>& layer() const override { return inner_->layer(); }
  EnergyBlockProblemPtr Prepare(const Var& u) const override { return inner_->Prepare(u); }
  Var Output(const Var& state, const EnergyBlockProblem& problem) const override {
    return mul_scalar(inner_->Output(state, problem), 0.5);
  }

 private:
  std::shared_ptr<EnergyBlock> inner_;
};

TEST(EnergyBlockRegistryTest, UserBlocksPlugIntoTheModel) {
  EnergyBlockRegistry().Register(
      "scaled_hopfield_test",
      [](const EnergyBlockOptions& options, Rng& rng) -> std::shared_ptr<EnergyBlock> {
        return std::make_shared<ScaledHopfieldBlock>(options, rng);
      },
      "half a Hopfield block", /*replace=*/true);
  ModelOptions options;
  options.kind = ModelKind::kEnergy;
  options.vocab_size = 5;
  options.max_length = 6;
  options.dim = 8;
  options.energy.heads = 2;
  options.energy.layer = "scaled_hopfield_test";
  SequenceModel model(options);
  EXPECT_EQ(model.named_parameters()[6].first, "block.inner.layer.beta");
  const Var logits = model.Forward({1, 2, 3, 4, 0, 1}, Shape{2, 3});
  EXPECT_EQ(logits.shape(), Shape({2, 3, 5}));
  EXPECT_GT(model.implicit()->forward_summary().iterations, 0);
}

TEST(EnergyBlockTest, EveryBuiltinReadsOutTokensAndItsProblemIsAFixedPoint) {
  for (const std::string& name : BuiltinBlocks()) {
    SCOPED_TRACE(name);
    Rng rng(1);
    EnergyBlockOptions options;
    options.layer = name;
    options.dim = 8;
    options.heads = 2;
    options.memories = 6;
    options.dtype = DType::kFloat64;
    std::shared_ptr<EnergyBlock> block = CreateEnergyBlock(options, rng);
    ImplicitOptions solver;
    solver.forward.max_iterations = 200;
    solver.forward.stop_mode = StopMode::kAbsolute;
    solver.forward.absolute_tolerance = 1e-11;
    Implicit implicit(block->layer(), solver);
    const Var u = RandnVar({2, 5, 8}, rng);
    NoGrad no_grad;
    const EnergyBlockProblemPtr problem = block->Prepare(u);
    EXPECT_EQ(problem->energy->batch_size(), 2);
    const Var z = implicit.Forward(problem->energy, problem->initial_state);
    EXPECT_EQ(implicit.forward_summary().termination_type, TerminationType::kConverged)
        << implicit.forward_summary().BriefReport();
    EXPECT_LT(MaxAbsDiff(problem->energy->Update(z).value(), z.value()), 1e-10);
    const Var out = block->Readout(z, *problem);
    EXPECT_EQ(out.shape(), Shape({2, 5, 8}));
    // The output depends on the input beyond the residual: another u of the
    // same first sample but a different second sample leaves sample 0 alone
    // and changes sample 1.
    Tensor other = u.value().Clone();
    for (int64_t i = 40; i < 80; ++i) other.set(i, -other.at(i));
    const EnergyBlockProblemPtr p2 = block->Prepare(Var(other));
    const Var out2 = block->Readout(implicit.Forward(p2->energy, p2->initial_state), *p2);
    EXPECT_LT(MaxAbsDiff(out2.value().SliceRows(0, 1), out.value().SliceRows(0, 1)), 1e-9);
    EXPECT_GT(MaxAbsDiff(out2.value().SliceRows(1, 2), out.value().SliceRows(1, 2)), 1e-3);
  }
}

// The Energy Transformer's external current (its context's input): both dynamics still
// descend their Lyapunov function, whose gradient is (dg/dx) times the
// force; and the stationary state follows the input.
TEST(EnergyBlockTest, EnergyTransformerInputCurrentKeepsTheLyapunovFunction) {
  for (EnergyTransformerDynamics dynamics :
       {EnergyTransformerDynamics::kLeaky, EnergyTransformerDynamics::kNonLeaky}) {
    SCOPED_TRACE(ToString(dynamics));
    Rng rng(3);
    EnergyTransformerOptions options;
    options.dim = 6;
    options.heads = 2;
    options.head_dim = 3;
    options.memories = 5;
    options.weight_std = 0.4;
    options.memory_std = 0.4;
    options.dynamics = dynamics;
    options.step = 0.05;
    options.dtype = DType::kFloat64;
    EnergyTransformerBlock block(options, rng);
    const Var x = RandnVar({2, 4, 6}, rng);
    EnergyTransformerContext ctx = block.Prepare(x);
    ctx.input = RandnVar({2, 4, 6}, rng);
    const EnergyTrace trace = TraceUpdates(block, x.value(), ctx, {.max_steps = 100});
    EXPECT_EQ(trace.CountIncreases(1e-12), 0);
    EXPECT_LT(trace.energies.back()[0], trace.energies.front()[0] - 1e-3);
    // Update(x) = x - step * (force), and grad E = (dg/dx) force: compare
    // <grad E, v> with <force, (dg/dx) v> for a random v (dg/dx symmetric).
    Var leaf(x.value().Clone(), true);
    Var energy = sum(block.Energy(leaf, ctx));
    const Tensor grad_e = grad({energy}, {leaf})[0].value();
    const Tensor force =
        mul_scalar(sub(Var(x.value()), block.Update(Var(x.value()), ctx)), 1.0 / options.step)
            .value();
    const Var v(Randn({2, 4, 6}, rng));
    Var leaf2(x.value().Clone(), true);
    const Tensor jv = grad({sum(mul(block.Normalize(leaf2), v))}, {leaf2})[0].value();  // (dg/dx)^T v
    const double lhs = sum(mul(Var(grad_e), v)).item();
    const double rhs = sum(mul(Var(force), Var(jv))).item();
    EXPECT_NEAR(lhs, rhs, 1e-9 * (1.0 + std::abs(lhs)));
  }
}

// The Energy Transformer block's solve (the leaky Euler step iterated with
// the default step 1, accelerated by Anderson) lands where the energy's
// descent ends: small Euler steps of the same dynamics from the same start
// lower the Lyapunov function at every step and arrive at the state the
// solver found. The step only changes how the solver gets there.
TEST(EnergyBlockTest, EnergyTransformerSolveIsWhereTheEnergyDescentEnds) {
  Rng rng(4);
  EnergyBlockOptions options;
  options.layer = "energy_transformer";
  options.dim = 16;
  options.heads = 4;
  options.memories = 8;
  options.dtype = DType::kFloat64;
  ASSERT_EQ(options.step, 1.0);
  std::shared_ptr<EnergyBlock> block = CreateEnergyBlock(options, rng);
  Implicit implicit(block->layer(), testing_energy::TightImplicitOptions());
  NoGrad no_grad;
  const EnergyBlockProblemPtr problem = block->Prepare(RandnVar({2, 5, 16}, rng));
  const Tensor solved = implicit.Forward(problem->energy, problem->initial_state).value();
  ASSERT_EQ(implicit.forward_summary().termination_type, TerminationType::kConverged)
      << implicit.forward_summary().BriefReport();
  // The move is not negligible: the stationary state is not the start.
  EXPECT_GT(MaxAbsDiff(solved, problem->initial_state.value()), 0.1);
  const BoundEnergy& layer = *problem->energy;
  Tensor x = problem->initial_state.value().Clone();
  std::vector<double> previous = layer.SampleEnergies(Var(x)).value().ToVector();
  const double alpha = 0.05;
  int increases = 0;
  for (int t = 0; t < 1500; ++t) {
    // With step 1, Update(x) = x - force: an Euler step of size alpha.
    const Var force = sub(Var(x), layer.Update(Var(x)));
    x = sub(Var(x), mul_scalar(force, alpha)).value();
    const std::vector<double> energy = layer.SampleEnergies(Var(x)).value().ToVector();
    for (std::size_t b = 0; b < energy.size(); ++b) {
      if (energy[b] > previous[b] + 1e-12 * (1.0 + std::abs(previous[b]))) ++increases;
    }
    previous = energy;
  }
  EXPECT_EQ(increases, 0);
  EXPECT_LT(MaxAbsDiff(x, solved), 1e-8);
}

ModelOptions TinyEnergyModel(const std::string& layer) {
  ModelOptions options;
  options.kind = ModelKind::kEnergy;
  options.vocab_size = 3;
  options.feature_dim = 3;
  options.max_length = 4;
  options.dim = 4;
  options.cell_options.hidden = 4;
  options.energy.layer = layer;
  options.energy.heads = 2;
  options.energy.memories = 3;
  options.dtype = DType::kFloat64;
  options.seed = 5;
  options.implicit = testing_energy::TightImplicitOptions();
  options.implicit.forward.max_iterations = 400;
  return options;
}

class EnergyModelGradientTest : public ::testing::TestWithParam<std::string> {};

// The whole model (embedding, block solved by Implicit, FFN, head): the
// implicit gradient w.r.t. the inputs and every parameter matches central
// differences of the converged solve.
TEST_P(EnergyModelGradientTest, MatchesFiniteDifferencesOfTheConvergedSolve) {
  SequenceModel model(TinyEnergyModel(GetParam()));
  if (GetParam() == "energy_transformer") {
    // Larger weights than the block's initialisation exercise the attention
    // and memory terms harder.
    Rng init(9);
    for (auto& [name, p] : model.named_parameters()) {
      if (name == "block.layer.wq" || name == "block.layer.wk" || name == "block.layer.memories") {
        p.mutable_value().CopyFrom(Randn(p.shape(), init, 0.4));
      }
    }
  }
  Rng rng(6);
  const Var features = RandnVar({2, 3, 3}, rng);
  GradCheckOptions tolerances;
  tolerances.step = 1e-5;
  tolerances.relative_tolerance = 1e-5;
  tolerances.absolute_tolerance = 1e-8;
  // relu^2 memories: the energy's second derivative jumps where a memory
  // switches on, which costs central differences O(h) accuracy.
  const bool kinked = GetParam() == "energy_transformer";
  if (kinked) tolerances.absolute_tolerance = 5e-7;
  auto r = CheckGradients([&](const VarList& in) { return model.ForwardFeatures(in[0]); },
                          {features}, tolerances);
  EXPECT_TRUE(r) << r;
  EXPECT_EQ(model.implicit()->forward_summary().termination_type, TerminationType::kConverged)
      << model.implicit()->forward_summary().BriefReport();
  const Tensor probe = Randn({2, 3, 3}, rng);
  auto p = testing_energy::CheckParameterGradients(
      model, [&] { return sum(mul(model.ForwardFeatures(features), Var(probe))); }, 1e-5, 1e-5,
      tolerances.absolute_tolerance);
  EXPECT_TRUE(p) << p;
  // The energy layer's own parameters receive a gradient through the
  // implicit backward.
  model.ZeroGrad();
  backward(sum(mul(model.ForwardFeatures(features), Var(probe))));
  double layer_grad = 0.0;
  for (const auto& [name, param] : model.named_parameters()) {
    if (name.rfind("block.layer.", 0) == 0 && param.has_grad()) {
      layer_grad = std::max(layer_grad, testing_energy::MaxAbs(param.grad().value()));
    }
  }
  EXPECT_GT(layer_grad, 1e-4);
  ASSERT_NE(model.implicit()->backward_summary(), nullptr);
  EXPECT_EQ(model.implicit()->backward_summary()->termination_type, TerminationType::kConverged);
}

INSTANTIATE_TEST_SUITE_P(Builtins,
                         EnergyModelGradientTest,
                         ::testing::Values("hopfield", "probabilistic", "expfam",
                                           "energy_transformer"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// Depth override: k of the layer's updates from the block's initial state,
// backpropagated (the tied unroll), and more updates approach the fixed
// point the implicit solve finds.
TEST(EnergyModelTest, DepthOverrideUnrollsTheUpdates) {
  ModelOptions options = TinyEnergyModel("probabilistic");
  SequenceModel model(options);
  Rng rng(7);
  const Var features = RandnVar({2, 3, 3}, rng);
  const Tensor solved = model.ForwardFeatures(features).value();
  const int64_t iterations = model.implicit()->forward_summary().iterations;
  double previous = 1e300;
  for (int64_t k : {1, 3, 30}) {
    model.SetDepthOverride(k);
    Var logits = model.ForwardFeatures(features);
    const double gap = MaxAbsDiff(logits.value(), solved);
    EXPECT_LT(gap, previous) << k;
    previous = gap;
  }
  EXPECT_LT(previous, 1e-8);
  // The solve was not run again during the override.
  EXPECT_EQ(model.implicit()->forward_summary().iterations, iterations);
  model.SetDepthOverride(0);
  EXPECT_LT(MaxAbsDiff(model.ForwardFeatures(features).value(), solved), 1e-12);
}

// Hopfield: the block puts the queries on the state as an external field,
// so the fixed point depends on them and W_Q learns through the implicit
// gradient; the same layer without the field gives W_Q nothing at its fixed
// point (the queries only pick the basin).
TEST(EnergyModelTest, HopfieldQueriesLearnThroughTheFixedPoint) {
  SequenceModel model(TinyEnergyModel("hopfield"));
  Rng rng(8);
  const Var features = RandnVar({2, 3, 3}, rng);
  model.ZeroGrad();
  backward(sum(model.ForwardFeatures(features)));
  const Var wq = model.parameter("block.layer.wq.weight");
  ASSERT_TRUE(wq.has_grad());
  EXPECT_GT(testing_energy::MaxAbs(wq.grad().value()), 1e-6);

  HopfieldOptions options;
  options.state_size = 4;
  options.heads = 2;
  options.dtype = DType::kFloat64;
  options.solve.mode = EnergySolveMode::kFixedPoint;
  options.solve.implicit = testing_energy::TightImplicitOptions();
  for (bool field : {false, true}) {
    SCOPED_TRACE(field ? "with the field" : "without the field");
    options.query_field = field;
    Rng init(3);
    HopfieldAttention layer(options, init);
    const Var x = RandnVar({2, 3, 4}, rng);
    layer.ZeroGrad();
    backward(sum(layer.Forward(x, x)));
    const double g = layer.parameter("wq.weight").has_grad()
                         ? testing_energy::MaxAbs(layer.parameter("wq.weight").grad().value())
                         : 0.0;
    if (field) {
      EXPECT_GT(g, 1e-6);
    } else {
      EXPECT_LT(g, 1e-12);
    }
  }
}

}  // namespace
}  // namespace stillpoint::energy_block_test
