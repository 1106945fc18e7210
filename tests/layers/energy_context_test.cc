// Typed energy contexts (layers/energy_context.h): what a context's member
// list gives the solve (samples, selection, values, printout), the
// selection of the samples still iterating with gradients reaching the full
// members, and wrong use: a compile error where the types say it, else an
// Error naming the layer.

#include "layers/energy_context.h"

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "framework/ops.h"
#include "layers/energy_block.h"
#include "layers/energy_layer.h"
#include "layers/implicit_layer.h"
#include "tests/layers/energy_test_util.h"

namespace stillpoint::energy_context_test {
namespace {

using testing_energy::Randn;
using testing_energy::RandnVar;

struct KeysContext {
  Var keys;   // [B, S, d], per sample
  Var scale{};  // [d], shared
  Var mask{};   // [B, S], per sample, optional (read by nothing here)
  static const ContextFields<KeysContext>& Fields() {
    static const auto fields = ContextFields<KeysContext>("KeysContext")
                                   .PerSample("keys", &KeysContext::keys)
                                   .Shared("scale", &KeysContext::scale)
                                   .PerSample("mask", &KeysContext::mask);
    return fields;
  }
};

struct OtherContext {
  Var field;  // [B, d], per sample
  static const ContextFields<OtherContext>& Fields() {
    static const auto fields =
        ContextFields<OtherContext>("OtherContext").PerSample("field", &OtherContext::field);
    return fields;
  }
};

// E(z) = 1/2 |z|^2 - z . sum_s scale * k_s per sample; z [B, d].
class KeysEnergy : public EnergyLayer<KeysContext> {
 public:
  std::string Name() const override { return "KeysEnergy"; }
  Var Energy(const Var& z, const KeysContext& ctx) const override {
    const Var field = sum(mul(ctx.keys, reshape(ctx.scale, Shape{1, 1, z.dim(1)})), 1);
    return sub(mul_scalar(sum(square(z), -1), 0.5), sum(mul(z, field), -1));
  }
};

class OtherEnergy : public EnergyLayer<OtherContext> {
 public:
  std::string Name() const override { return "OtherEnergy"; }
  Var Energy(const Var& z, const OtherContext& ctx) const override {
    return sub(mul_scalar(sum(square(z), -1), 0.5), sum(mul(z, ctx.field), -1));
  }
};

// Binding a layer to another layer's context does not compile.
template <typename Layer, typename Context>
concept Bindable = requires(const Layer& layer, const Context& ctx) {
  Bind(layer, ctx);
};
static_assert(Bindable<KeysEnergy, KeysContext>);
static_assert(!Bindable<KeysEnergy, OtherContext>);
static_assert(!Bindable<OtherEnergy, KeysContext>);

KeysContext MakeKeys(Rng& rng, bool requires_grad = false) {
  return KeysContext{.keys = Var(Randn({4, 2, 3}, rng), requires_grad),
                     .scale = Var(Tensor::Full({3}, 2.0, DType::kFloat64))};
}

TEST(EnergyContextTest, MembersGiveSamplesValuesAndDescription) {
  Rng rng(1);
  const KeysContext ctx = MakeKeys(rng);
  const ContextFields<KeysContext>& fields = KeysContext::Fields();
  EXPECT_EQ(fields.BatchSize(ctx, "test"), 4);
  EXPECT_EQ(fields.BatchSize(KeysContext{}, "test"), -1);
  EXPECT_EQ(fields.BatchSize(KeysContext{.keys = {}, .scale = ctx.scale}, "test"), -1);
  // The undefined mask is absent: two values, in declaration order.
  const VarList values = fields.Values(ctx);
  ASSERT_EQ(values.size(), 2u);
  EXPECT_TRUE(values[0].value().SameStorage(ctx.keys.value()));
  EXPECT_TRUE(values[1].value().SameStorage(ctx.scale.value()));
  EXPECT_EQ(fields.Describe(ctx), "KeysContext {keys [4, 2, 3], scale (shared) [3]}");
}

TEST(EnergyContextTest, SelectionGathersPerSampleMembersOnly) {
  Rng rng(2);
  const KeysContext ctx = MakeKeys(rng, /*requires_grad=*/true);
  const ContextFields<KeysContext>& fields = KeysContext::Fields();
  const KeysContext same = fields.Select(ctx, {0, 1, 2, 3}, 4);
  EXPECT_TRUE(same.keys.value().SameStorage(ctx.keys.value()));
  const KeysContext sub = fields.Select(ctx, {1, 3}, 4);
  EXPECT_EQ(sub.keys.shape(), (Shape{2, 2, 3}));
  EXPECT_EQ(sub.keys.value().at(0), ctx.keys.value().at(6));
  EXPECT_EQ(sub.keys.value().at(6), ctx.keys.value().at(18));
  EXPECT_TRUE(sub.scale.value().SameStorage(ctx.scale.value()));
  EXPECT_FALSE(sub.mask.defined());
  // Gradients reach the full member through the selection.
  backward(sum(sub.keys));
  EXPECT_EQ(ctx.keys.grad().value().at(0), 0.0);
  EXPECT_EQ(ctx.keys.grad().value().at(6), 1.0);
}

// What a solver does with a bound energy: evaluate the unconverged samples
// only; the update and the gradient equal the full batch's rows, and the
// gradient reaches the rows of the full context members it read.
TEST(EnergyContextTest, BoundEnergySelectsSamplesAndGradientsReachTheFullMembers) {
  Rng rng(3);
  KeysEnergy layer;
  layer.set_gradient_step(1.0);  // Update(z) = the field
  const KeysContext ctx = MakeKeys(rng, /*requires_grad=*/true);
  const BoundEnergyPtr energy = Bind(layer, ctx);
  EXPECT_EQ(energy->batch_size(), 4);
  const Tensor z = Randn({4, 3}, rng);
  const Tensor full = layer.Update(Var(z), ctx).value();
  const std::vector<int64_t> ids = {1, 3};
  const Var rows = gather(Var(z), 0, ids);
  const BoundEnergyPtr selected = energy->Select(ids);
  EXPECT_EQ(selected->batch_size(), 2);
  const Tensor update = selected->Update(rows).value();
  for (int64_t c = 0; c < 3; ++c) {
    EXPECT_DOUBLE_EQ(update.at(c), full.at(3 + c));
    EXPECT_DOUBLE_EQ(update.at(3 + c), full.at(9 + c));
  }
  // The cell a solver iterates, on the same rows: z - f(z) = dE/dz = z -
  // field, whose derivative in each key of a selected sample is -scale = -2;
  // the other samples' keys get nothing.
  const CellFn cell = MakeUpdateCell(energy, Shape{3});
  backward(sum(sub(rows, cell(rows, ids))));
  const Tensor g = ctx.keys.grad().value();  // [4, 2, 3]
  for (int64_t c = 0; c < 3; ++c) {
    EXPECT_EQ(g.at(0 * 6 + c), 0.0);
    EXPECT_EQ(g.at(2 * 6 + 3 + c), 0.0);
    EXPECT_DOUBLE_EQ(g.at(1 * 6 + c), -2.0) << c;
    EXPECT_DOUBLE_EQ(g.at(3 * 6 + 3 + c), -2.0) << c;
  }
  EXPECT_EQ(ContextOf<KeysContext>(*selected).keys.shape(), (Shape{2, 2, 3}));
}

void ExpectErrorMentions(const std::function<void()>& call, const std::vector<std::string>& words) {
  try {
    call();
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    for (const std::string& word : words) {
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
  }
}

TEST(EnergyContextTest, WrongUseIsAnErrorNamingTheLayer) {
  Rng rng(4);
  auto layer = std::make_shared<KeysEnergy>();
  KeysContext ctx = MakeKeys(rng);
  // Per-sample members that disagree on the samples.
  KeysContext uneven = ctx;
  uneven.mask = RandnVar({3, 2}, rng);
  ExpectErrorMentions([&] { Bind(*layer, uneven); }, {"KeysEnergy", "KeysContext", "'mask'"});
  // A sample that is not there.
  ExpectErrorMentions([&] { Bind(*layer, ctx)->Select({4}); }, {"KeysEnergy", "sample id 4"});
  // An Implicit over one layer given another layer's context or energy.
  Implicit solved(layer);
  const Var z0 = RandnVar({4, 3}, rng);
  ExpectErrorMentions([&] { solved.Forward(OtherContext{.field = z0}, z0); },
                      {"KeysEnergy's energy reads a KeysContext, not a OtherContext"});
  OtherEnergy other;
  ExpectErrorMentions([&] { solved.Forward(Bind(other, OtherContext{.field = z0}), z0); },
                      {"KeysEnergy", "OtherEnergy"});
  ExpectErrorMentions(
      [&] {
        solved.Forward(ctx, RandnVar({3, 3}, rng));
      },
      {"KeysEnergy", "4 samples"});
  ExpectErrorMentions([&] { ContextOf<OtherContext>(*Bind(*layer, ctx)); },
                      {"KeysEnergy", "OtherContext"});
  // The solve itself works with the right context.
  EXPECT_EQ(solved.Forward(ctx, z0).shape(), (Shape{4, 3}));
}

TEST(EnergyContextTest, ABlockRefusesAnotherBlocksProblem) {
  Rng rng(5);
  EnergyBlockOptions options;
  options.dim = 8;
  options.heads = 2;
  options.dtype = DType::kFloat64;
  options.layer = "hopfield";
  const std::shared_ptr<EnergyBlock> hopfield = CreateEnergyBlock(options, rng);
  options.layer = "probabilistic";
  const std::shared_ptr<EnergyBlock> probabilistic = CreateEnergyBlock(options, rng);
  const Var u = RandnVar({2, 3, 8}, rng);
  const EnergyBlockProblemPtr problem = probabilistic->Prepare(u);
  EXPECT_EQ(probabilistic->Output(problem->initial_state, *problem).shape(), (Shape{2, 3, 8}));
  ExpectErrorMentions([&] { hopfield->Output(problem->initial_state, *problem); },
                      {"HopfieldBlock"});
}

}  // namespace
}  // namespace stillpoint::energy_context_test
