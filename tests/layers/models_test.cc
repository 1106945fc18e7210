// Sequence models and the classifier: shapes, kinds, parameter layout, and
// that every kind learns a toy task (the loss falls over a few plain SGD
// steps).
#include "layers/models.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "framework/gradcheck.h"
#include "framework/ops.h"
#include "framework/random.h"
#include "tests/layers/module_gradcheck.h"

namespace stillpoint::models_test {
namespace {

struct ToyBatch {
  std::vector<int64_t> x;
  std::vector<int64_t> reversed;  // per-token targets: the sequence reversed
  std::vector<int64_t> classes;   // per-sequence targets: first token mod 3
  Shape shape;
};

ToyBatch MakeBatch(int64_t batch, int64_t length, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  ToyBatch b;
  b.shape = Shape{batch, length};
  for (int64_t i = 0; i < batch * length; ++i) b.x.push_back(rng.UniformInt(vocab));
  for (int64_t s = 0; s < batch; ++s) {
    for (int64_t t = 0; t < length; ++t) b.reversed.push_back(b.x[s * length + length - 1 - t]);
    b.classes.push_back(b.x[s * length] % 3);
  }
  return b;
}

ModelOptions SmallOptions(ModelKind kind) {
  ModelOptions options;
  options.kind = kind;
  options.vocab_size = 6;
  options.max_length = 8;
  options.dim = 16;
  options.cell_options.heads = 2;
  options.cell_options.hidden = 32;
  options.num_layers = 2;
  options.unroll_steps = 4;
  options.seed = 11;
  if (kind == ModelKind::kEnergy) {
    options.energy.layer = "probabilistic";
    options.implicit.forward.max_iterations = 100;
  }
  return options;
}

// Plain SGD: p <- p - lr * dL/dp.
void SgdStep(Module& model, double learning_rate) {
  for (const Var& p : model.parameters()) {
    if (!p.has_grad()) continue;
    Var param = p;
    Tensor& value = param.mutable_value();
    const Tensor& g = p.grad().value();
    for (int64_t i = 0; i < value.numel(); ++i) value.set(i, value.at(i) - learning_rate * g.at(i));
  }
  model.ZeroGrad();
}

// Loss before training and after `steps` SGD steps on one fixed batch.
std::pair<double, double> Train(Model& model,
                                const ToyBatch& batch,
                                const std::vector<int64_t>& targets,
                                int steps,
                                double lr) {
  double first = 0, last = 0;
  for (int step = 0; step <= steps; ++step) {
    const Var loss = cross_entropy(model.Forward(batch.x, batch.shape), targets);
    if (step == 0) first = loss.item();
    last = loss.item();
    if (step == steps) break;
    backward(loss);
    SgdStep(model, lr);
  }
  return {first, last};
}

class ModelKindTest : public ::testing::TestWithParam<ModelKind> {};

TEST_P(ModelKindTest, SequenceModelReducesLossWithPlainSgd) {
  SequenceModel model(SmallOptions(GetParam()));
  const ToyBatch batch = MakeBatch(8, 6, 6, 3);
  const auto [first, last] = Train(model, batch, batch.reversed, 20, 0.2);
  EXPECT_LT(last, 0.8 * first) << "first " << first << ", last " << last;
  if (GetParam() == ModelKind::kImplicit || GetParam() == ModelKind::kEnergy) {
    EXPECT_TRUE(model.implicit()->forward_summary().IsUsable())
        << model.implicit()->forward_summary().FullReport();
  }
}

TEST_P(ModelKindTest, ClassifierReducesLossWithPlainSgd) {
  ModelOptions options = SmallOptions(GetParam());
  options.num_classes = 3;
  SequenceClassifier model(options);
  const ToyBatch batch = MakeBatch(12, 5, 6, 4);
  const Var logits = model.Forward(batch.x, batch.shape);
  EXPECT_EQ(logits.shape(), Shape({12, 3}));
  const auto [first, last] = Train(model, batch, batch.classes, 12, 0.1);
  EXPECT_LT(last, 0.8 * first) << "first " << first << ", last " << last;
}

TEST_P(ModelKindTest, ShapesNamesAndKind) {
  SequenceModel model(SmallOptions(GetParam()));
  const ToyBatch batch = MakeBatch(3, 7, 6, 5);
  EXPECT_EQ(model.Forward(batch.x, batch.shape).shape(), Shape({3, 7, 6}));
  EXPECT_EQ(model.Embed(batch.x, batch.shape).shape(), Shape({3, 7, 16}));
  const NamedVars named = model.named_parameters();
  ASSERT_GE(named.size(), 7u);
  EXPECT_EQ(named[0].first, "tok_emb");
  EXPECT_EQ(named[1].first, "pos_emb");
  EXPECT_EQ(named[2].first, "lnf.gain");
  EXPECT_EQ(named[4].first, "out.weight");
  const bool energy = GetParam() == ModelKind::kEnergy;
  const std::string first_cell = GetParam() == ModelKind::kExplicit ? "cells.0.wq.weight"
                                 : energy                          ? "block.layer.log_query_precision"
                                                                   : "cell.wq.weight";
  EXPECT_EQ(named[6].first, first_cell);
  EXPECT_EQ(model.num_cells(), GetParam() == ModelKind::kExplicit ? 2 : energy ? 0 : 1);
  EXPECT_EQ(model.implicit() != nullptr,
            GetParam() == ModelKind::kImplicit || GetParam() == ModelKind::kEnergy);
  EXPECT_EQ(model.energy_block() != nullptr, energy);
  if (energy) {
    EXPECT_EQ(named.back().first, "ffn.fc2.bias");
  }
  EXPECT_NE(model.Name().find(ToString(GetParam())), std::string::npos) << model.Name();
}

INSTANTIATE_TEST_SUITE_P(AllKinds,
                         ModelKindTest,
                         ::testing::Values(ModelKind::kExplicit,
                                           ModelKind::kTied,
                                           ModelKind::kImplicit,
                                           ModelKind::kEnergy),
                         [](const ::testing::TestParamInfo<ModelKind>& info) {
                           return std::string(ToString(info.param));
                         });

TEST(ModelTest, TiedModelEqualsExplicitModelWithIdenticalCells) {
  ModelOptions tied_options = SmallOptions(ModelKind::kTied);
  tied_options.dtype = DType::kFloat64;
  tied_options.unroll_steps = 3;
  SequenceModel tied(tied_options);
  ModelOptions explicit_options = tied_options;
  explicit_options.kind = ModelKind::kExplicit;
  explicit_options.num_layers = 3;
  SequenceModel explicit_model(explicit_options);
  // Copy the tied cell into every explicit cell ("cell.x" -> "cells.<l>.x").
  NamedTensors values;
  for (const auto& [name, value] : tied.NamedValues()) {
    if (name.rfind("cell.", 0) == 0) {
      for (int l = 0; l < 3; ++l) {
        values.emplace_back("cells." + std::to_string(l) + name.substr(4), value);
      }
    } else {
      values.emplace_back(name, value);
    }
  }
  explicit_model.LoadParameters(values);
  const ToyBatch batch = MakeBatch(2, 5, 6, 6);
  const Tensor a = tied.Forward(batch.x, batch.shape).value();
  const Tensor b = explicit_model.Forward(batch.x, batch.shape).value();
  EXPECT_LT(MaxAbsDiff(a, b), 1e-14);
}

TEST(ModelTest, Float64ImplicitModelIsAFixedPointOfItsCell) {
  ModelOptions options = SmallOptions(ModelKind::kImplicit);
  options.dtype = DType::kFloat64;
  options.implicit.forward.stop_mode = StopMode::kAbsolute;
  options.implicit.forward.absolute_tolerance = 1e-12;
  options.implicit.forward.max_iterations = 200;
  SequenceModel model(options);
  const ToyBatch batch = MakeBatch(2, 5, 6, 7);
  NoGrad no_grad;
  const Var u = model.Embed(batch.x, batch.shape);
  const Var z = model.Encode(batch.x, batch.shape);
  EXPECT_LT(MaxAbsDiff(model.cell(0)->Forward(z, u, {}).value(), z.value()), 1e-11);
}

TEST(ModelTest, W1SolverConfigurationRunsExactlySixteenIterationsEachWay) {
  ModelOptions options = SmallOptions(ModelKind::kImplicit);
  ImplicitOptions& o = options.implicit;
  o.forward.type = ForwardSolverType::kAnderson;
  o.forward.anderson_memory = 5;
  o.forward.anderson_lambda = 1e-4;
  o.forward.anderson_beta = 1.0;
  o.forward.max_iterations = 16;
  o.forward.absolute_tolerance = 0.0;
  o.forward.relative_tolerance = 0.0;
  o.backward.mode = BackwardMode::kIft;
  o.backward.solver = AdjointSolverType::kFixedPoint;
  o.backward.max_iterations = 16;
  o.backward.tolerance = 0.0;
  SequenceModel model(options);
  const ToyBatch batch = MakeBatch(4, 6, 6, 9);
  backward(cross_entropy(model.Forward(batch.x, batch.shape), batch.reversed));
  EXPECT_EQ(model.implicit()->forward_summary().iterations, 16);
  for (int iterations : model.implicit()->forward_summary().sample_iterations) {
    EXPECT_EQ(iterations, 16);
  }
  ASSERT_NE(model.implicit()->backward_summary(), nullptr);
  EXPECT_EQ(model.implicit()->backward_summary()->iterations, 16)
      << model.implicit()->backward_summary()->FullReport();
}

// backward.warm_start keeps the previous adjoint solution in the implicit
// layer instance, not in the options: two replicas built from one
// ModelOptions (as the data-parallel replica factory builds them) each keep
// their own, so one replica's backward never overwrites the other's start.
TEST(ModelTest, ReplicasFromOneOptionsKeepTheirOwnAdjointWarmStart) {
  ModelOptions options = SmallOptions(ModelKind::kImplicit);
  options.implicit.backward.warm_start = true;
  SequenceModel first(options);
  SequenceModel second(options);
  ASSERT_NE(first.implicit(), nullptr);
  ASSERT_NE(first.implicit()->adjoint_warm_start(), second.implicit()->adjoint_warm_start());

  // Different batch sizes: a shared buffer would hold the other replica's
  // [B, n] solution, which does not fit, and the next solve would start cold.
  const ToyBatch two = MakeBatch(2, 5, 6, 21);
  const ToyBatch three = MakeBatch(3, 5, 6, 22);
  backward(cross_entropy(first.Forward(two.x, two.shape), two.reversed));
  const Tensor first_solution = first.implicit()->adjoint_warm_start()->solution.Clone();
  ASSERT_TRUE(first_solution.defined());
  EXPECT_FALSE(first.implicit()->backward_summary()->warm_started);
  backward(cross_entropy(second.Forward(three.x, three.shape), three.reversed));
  EXPECT_FALSE(second.implicit()->backward_summary()->warm_started);
  EXPECT_TRUE(BitwiseEqual(first.implicit()->adjoint_warm_start()->solution, first_solution));
  EXPECT_NE(second.implicit()->adjoint_warm_start()->solution.dim(0), first_solution.dim(0));

  backward(cross_entropy(first.Forward(two.x, two.shape), two.reversed));
  EXPECT_TRUE(first.implicit()->backward_summary()->warm_started)
      << first.implicit()->backward_summary()->BriefReport();
}

TEST(ModelTest, MisuseIsAnError) {
  ModelOptions options = SmallOptions(ModelKind::kTied);
  SequenceModel model(options);
  const ToyBatch too_long = MakeBatch(1, 9, 6, 8);  // max_length 8
  EXPECT_THROW(model.Forward(too_long.x, too_long.shape), Error);
  EXPECT_THROW(model.Forward({0, 1, 2}, Shape{3}), Error);                  // not [B, T]
  EXPECT_THROW(SequenceClassifier(SmallOptions(ModelKind::kTied)), Error);  // num_classes 0
  ModelOptions no_layers = SmallOptions(ModelKind::kExplicit);
  no_layers.num_layers = 0;
  EXPECT_THROW(SequenceModel{no_layers}, Error);
  ModelOptions bad_solver = SmallOptions(ModelKind::kImplicit);
  bad_solver.implicit.forward.max_iterations = -1;
  EXPECT_THROW(SequenceModel{bad_solver}, Error);
  ModelOptions pooled = SmallOptions(ModelKind::kExplicit);
  pooled.pooling = "hopfield";  // a per-token model pools nothing
  EXPECT_THROW(SequenceModel{pooled}, Error);
  pooled.pooling = "max";
  pooled.num_classes = 3;
  EXPECT_THROW(SequenceClassifier{pooled}, Error);
  ModelOptions lookup = SmallOptions(ModelKind::kExplicit);
  lookup.lookup = "hopfield";
  lookup.lookup_size = 0;
  EXPECT_THROW(SequenceModel{lookup}, Error);
}

ModelOptions HopfieldReadoutOptions(ModelKind kind) {
  ModelOptions options = SmallOptions(kind);
  options.num_classes = 3;
  options.pooling = "hopfield";
  options.pooling_patterns = 2;
  options.lookup = "hopfield";
  options.lookup_size = 5;
  return options;
}

// model.pooling: hopfield and model.lookup: hopfield learn, in every kind,
// with their inner solves converged and their parameters named.
TEST_P(ModelKindTest, HopfieldPoolingAndLookupLearn) {
  SequenceClassifier model(HopfieldReadoutOptions(GetParam()));
  const auto named = model.named_parameters();
  for (const char* name : {"pool.state_patterns", "pool.hopfield.wq.weight",
                           "lookup.stored_patterns", "lookup.targets"}) {
    EXPECT_TRUE(std::any_of(named.begin(), named.end(),
                            [&](const auto& p) { return p.first == name; }))
        << name;
  }
  const ToyBatch batch = MakeBatch(12, 5, 6, 4);
  const auto [first, last] = Train(model, batch, batch.classes, 12, 0.1);
  EXPECT_LT(last, 0.8 * first) << "first " << first << ", last " << last;
  const auto readouts = model.HopfieldReadouts();
  ASSERT_EQ(readouts.size(), 2u);
  for (const auto& [name, hopfield] : readouts) {
    const EnergySolveReport& report = hopfield->last_solve();
    EXPECT_EQ(report.mode, EnergySolveMode::kFixedPoint) << name;
    EXPECT_TRUE(report.implicit.forward.IsUsable())
        << name << ": " << report.implicit.forward.FullReport();
  }
}

// The pooling and the lookup draw their parameters after the rest of the
// model, so adding them leaves every other initial value as it was.
TEST(ModelTest, HopfieldReadoutsKeepTheOtherParametersInitialValues) {
  ModelOptions plain = SmallOptions(ModelKind::kImplicit);
  plain.num_classes = 3;
  SequenceClassifier without(plain);
  SequenceClassifier with(HopfieldReadoutOptions(ModelKind::kImplicit));
  const auto reference = without.named_parameters();
  const auto extended = with.named_parameters();
  ASSERT_GT(extended.size(), reference.size());
  for (std::size_t i = 0; i < reference.size(); ++i) {
    ASSERT_EQ(reference[i].first, extended[i].first);
    EXPECT_EQ(MaxAbsDiff(reference[i].second.value(), extended[i].second.value()), 0.0)
        << reference[i].first;
  }
}

// The whole classifier's gradient, through the Hopfield lookup's and
// pooling's implicit nodes (tight inner solves), against central finite
// differences in float64.
TEST(ModelTest, HopfieldReadoutGradientsMatchFiniteDifferences) {
  ModelOptions options = HopfieldReadoutOptions(ModelKind::kExplicit);
  options.dtype = DType::kFloat64;
  options.dim = 8;
  options.num_layers = 1;
  ImplicitOptions inner;
  inner.forward.max_iterations = 300;
  inner.forward.relative_tolerance = 1e-13;
  inner.backward.solver = AdjointSolverType::kGmres;
  inner.backward.tolerance = 1e-13;
  inner.backward.max_iterations = 200;
  options.cell_options.attention_solver = inner;
  SequenceClassifier model(options);
  const ToyBatch batch = MakeBatch(2, 3, 6, 9);
  auto forward = [&](const VarList&) {
    return cross_entropy(model.Forward(batch.x, batch.shape), batch.classes);
  };
  const GradCheckResult r = testing_support::CheckModuleGradients(model, forward, {});
  EXPECT_TRUE(r) << r;
}

TEST(ModelTest, KindNamesRoundTrip) {
  for (ModelKind kind :
       {ModelKind::kExplicit, ModelKind::kTied, ModelKind::kImplicit, ModelKind::kEnergy}) {
    ModelKind parsed = ModelKind::kExplicit;
    ASSERT_TRUE(StringToModelKind(ToString(kind), &parsed));
    EXPECT_EQ(parsed, kind);
  }
  ModelKind parsed = ModelKind::kExplicit;
  EXPECT_TRUE(StringToModelKind("Implicit", &parsed));
  EXPECT_EQ(parsed, ModelKind::kImplicit);
  EXPECT_FALSE(StringToModelKind("deep", &parsed));
  EXPECT_EQ(parsed, ModelKind::kImplicit);
}

}  // namespace
}  // namespace stillpoint::models_test
