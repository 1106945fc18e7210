// Gradient checks (float64, central differences) of every explicit building
// block's forward with respect to its inputs and all of its parameters, plus
// the shape contracts and the errors for misuse.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "framework/gradcheck.h"
#include "framework/ops.h"
#include "framework/random.h"
#include "layers/attention.h"
#include "layers/deq_cell.h"
#include "layers/dropout.h"
#include "layers/embedding.h"
#include "layers/layer_norm.h"
#include "layers/linear.h"
#include "layers/mlp.h"
#include "tests/layers/module_gradcheck.h"

namespace stillpoint::building_blocks_test {
namespace {

using testing_support::CheckModuleGradients;
constexpr DType kF64 = DType::kFloat64;

Var RandomVar(const Shape& shape, Rng& rng, double stddev = 1.0) {
  return Var(RandomNormal(shape, 0.0, stddev, kF64, rng));
}

// Moves every parameter away from its initial value (biases start at 0,
// gains at 1), so the check exercises generic parameter values.
void Perturb(Module& module, Rng& rng, double stddev = 0.3) {
  for (Var& p : module.parameters()) {
    Tensor noise = RandomNormal(p.shape(), 0.0, stddev, p.dtype(), rng);
    Tensor& value = p.mutable_value();
    for (int64_t i = 0; i < value.numel(); ++i) value.set(i, value.at(i) + noise.at(i));
  }
}

TEST(LinearTest, GradientsWrtInputAndParameters) {
  Rng rng(1);
  Linear layer(4, 3, rng, {.dtype = kF64});
  Perturb(layer, rng);
  const Var x = RandomVar({2, 5, 4}, rng);
  auto r =
      CheckModuleGradients(layer, [&](const VarList& in) { return layer.Forward(in[0]); }, {x});
  EXPECT_TRUE(r) << r;
  EXPECT_EQ(r.entries_checked, 2 * 5 * 4 + 4 * 3 + 3);
}

TEST(LinearTest, ComputesXTimesWPlusB) {
  Rng rng(2);
  Linear layer(2, 3, rng, {.dtype = kF64});
  Var weight = layer.weight();
  Var bias = layer.bias();
  weight.mutable_value().CopyFrom(Tensor::FromVector({2, 3}, {1, 2, 3, 4, 5, 6}, kF64));
  bias.mutable_value().CopyFrom(Tensor::FromVector({3}, {0.5, -1, 2}, kF64));
  const Var x(Tensor::FromVector({1, 2}, {1.0, -2.0}, kF64));
  const Tensor y = layer.Forward(x).value();
  ASSERT_EQ(y.shape(), Shape({1, 3}));
  // [1, -2] @ [[1,2,3],[4,5,6]] + b = [-7, -8, -9] + [0.5, -1, 2]
  EXPECT_DOUBLE_EQ(y.at(0), -6.5);
  EXPECT_DOUBLE_EQ(y.at(1), -9.0);
  EXPECT_DOUBLE_EQ(y.at(2), -7.0);
}

TEST(LinearTest, ForwardGeluIsGeluOfForwardBitwise) {
  Rng rng(6);
  for (DType dtype : {kF64, DType::kFloat32}) {
    Linear layer(4, 3, rng, {.dtype = dtype});
    Perturb(layer, rng);
    const Var x(RandomNormal(Shape{2, 5, 4}, 0.0, 1.0, dtype, rng), true);
    const Var fused = layer.ForwardGelu(x);
    const Var unfused = gelu(layer.Forward(x));
    ASSERT_EQ(fused.shape(), Shape({2, 5, 3}));
    EXPECT_EQ(MaxAbsDiff(fused.value(), unfused.value()), 0.0) << ToString(dtype);
    const VarList wrt{x, layer.weight(), layer.bias()};
    const VarList fused_grads = grad({sum(fused)}, wrt);
    const VarList unfused_grads = grad({sum(unfused)}, wrt);
    for (std::size_t i = 0; i < wrt.size(); ++i) {
      EXPECT_EQ(MaxAbsDiff(fused_grads[i].value(), unfused_grads[i].value()), 0.0)
          << ToString(dtype) << ", gradient " << i;
    }
  }
}

TEST(LinearTest, ForwardGeluThenIsTheNextLayerOfForwardGeluBitwise) {
  Rng rng(7);
  for (DType dtype : {kF64, DType::kFloat32}) {
    Linear first(4, 6, rng, {.dtype = dtype});
    Linear second(6, 3, rng, {.bias = false, .dtype = dtype});
    Perturb(first, rng);
    Perturb(second, rng);
    const Var x(RandomNormal(Shape{2, 5, 4}, 0.0, 1.0, dtype, rng), true);
    const Var fused = first.ForwardGeluThen(second, x);
    const Var unfused = second.Forward(first.ForwardGelu(x));
    ASSERT_EQ(fused.shape(), Shape({2, 5, 3}));
    EXPECT_EQ(MaxAbsDiff(fused.value(), unfused.value()), 0.0) << ToString(dtype);
    const VarList wrt{x, first.weight(), first.bias(), second.weight()};
    const VarList fused_grads = grad({sum(square(fused))}, wrt);
    const VarList unfused_grads = grad({sum(square(unfused))}, wrt);
    for (std::size_t i = 0; i < wrt.size(); ++i) {
      EXPECT_EQ(MaxAbsDiff(fused_grads[i].value(), unfused_grads[i].value()), 0.0)
          << ToString(dtype) << ", gradient " << i;
    }
  }
  Linear first(4, 6, rng), wrong(5, 3, rng);
  const Var x(Tensor::Zeros(Shape{2, 4}, DType::kFloat32));
  try {
    first.ForwardGeluThen(wrong, x);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the layer after it takes 5 features"), std::string::npos)
        << e.what();
  }
}

TEST(LinearTest, NamesAndInitialisation) {
  Rng rng(3);
  Linear layer(16, 8, rng);
  const NamedVars named = layer.named_parameters();
  ASSERT_EQ(named.size(), 2u);
  EXPECT_EQ(named[0].first, "weight");
  EXPECT_EQ(named[1].first, "bias");
  EXPECT_EQ(named[0].second.shape(), Shape({16, 8}));
  const double bound = 1.0 / std::sqrt(16.0);
  for (double w : layer.weight().value().ToVector()) {
    EXPECT_LE(std::abs(w), bound);
  }
  for (double b : layer.bias().value().ToVector()) EXPECT_EQ(b, 0.0);
  Linear no_bias(4, 2, rng, {.bias = false});
  EXPECT_EQ(no_bias.parameters().size(), 1u);
}

TEST(LinearTest, RejectsWrongWidthWithShapesInMessage) {
  Rng rng(4);
  Linear layer(4, 3, rng, {.dtype = kF64});
  const Var x = RandomVar({2, 5}, rng);
  try {
    layer.Forward(x);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 5]"), std::string::npos) << e.what();
  }
}

TEST(EmbeddingTest, TokenGradientAndLookup) {
  Rng rng(5);
  TokenEmbedding table(6, 3, rng, {.dtype = kF64});
  const std::vector<int64_t> ids = {0, 5, 2, 2};
  const Var rows = table.Forward(ids, Shape{2, 2});
  ASSERT_EQ(rows.shape(), Shape({2, 2, 3}));
  for (int64_t j = 0; j < 3; ++j) {
    EXPECT_EQ(rows.value().at(1 * 3 + j), table.weight().value().at(5 * 3 + j));
  }
  auto r = CheckModuleGradients(table,
                                [&](const VarList&) {
                                  return table.Forward(ids, Shape{2, 2});
                                },
                                {});
  EXPECT_TRUE(r) << r;
  EXPECT_THROW(table.Forward({6}, Shape{1}), Error);
}

TEST(EmbeddingTest, PositionalGradientAndBroadcast) {
  Rng rng(6);
  PositionalEmbedding positions(7, 3, rng, {.dtype = kF64});
  const Var x = RandomVar({2, 4, 3}, rng);
  const Tensor y = positions.Forward(x).value();
  // Both samples get the same P[t].
  for (int64_t t = 0; t < 4; ++t) {
    for (int64_t j = 0; j < 3; ++j) {
      const double p = positions.weight().value().at(t * 3 + j);
      EXPECT_DOUBLE_EQ(y.at(t * 3 + j), x.value().at(t * 3 + j) + p);
      EXPECT_DOUBLE_EQ(y.at(12 + t * 3 + j), x.value().at(12 + t * 3 + j) + p);
    }
  }
  auto r = CheckModuleGradients(positions,
                                [&](const VarList& in) { return positions.Forward(in[0]); }, {x});
  EXPECT_TRUE(r) << r;
  EXPECT_THROW(positions.Positions(8), Error);
}

TEST(LayerNormTest, GradientsAndNormalisation) {
  Rng rng(7);
  LayerNorm norm(5, {.dtype = kF64});
  const Var x = RandomVar({3, 2, 5}, rng, 2.0);
  {
    // With gain 1 and bias 0 every row has mean 0 and variance ~1.
    const Tensor y = norm.Forward(x).value();
    for (int64_t row = 0; row < 6; ++row) {
      double mean = 0, var = 0;
      for (int64_t j = 0; j < 5; ++j) mean += y.at(row * 5 + j) / 5;
      for (int64_t j = 0; j < 5; ++j) var += std::pow(y.at(row * 5 + j) - mean, 2) / 5;
      EXPECT_NEAR(mean, 0.0, 1e-12);
      EXPECT_NEAR(var, 1.0, 1e-4);  // eps = 1e-5 shrinks it slightly
    }
  }
  Perturb(norm, rng);
  auto r = CheckModuleGradients(norm, [&](const VarList& in) { return norm.Forward(in[0]); }, {x});
  EXPECT_TRUE(r) << r;
  const NamedVars named = norm.named_parameters();
  ASSERT_EQ(named.size(), 2u);
  EXPECT_EQ(named[0].first, "gain");
  EXPECT_EQ(named[1].first, "bias");
}

TEST(LayerNormTest, ForwardOfPartsNormalisesTheirSum) {
  Rng rng(16);
  LayerNorm norm(6, {.dtype = kF64});
  Perturb(norm, rng);
  const Var a = RandomVar({2, 3, 6}, rng);
  const Var b = RandomVar({2, 3, 6}, rng);
  const Var c = RandomVar({2, 3, 6}, rng);
  EXPECT_EQ(
      MaxAbsDiff(norm.Forward(VarList{a, b, c}).value(), norm.Forward(add(add(a, b), c)).value()),
      0.0);
  auto r = CheckModuleGradients(norm,
                                [&](const VarList& in) {
                                  return norm.Forward(VarList{in[0], in[1], in[2]});
                                },
                                {a, b, c});
  EXPECT_TRUE(r) << r;
  EXPECT_THROW(norm.Forward(VarList{}), Error);
  EXPECT_THROW(norm.Forward(VarList{a, RandomVar({2, 3, 5}, rng)}), Error);
}

TEST(MLPTest, GradientsAndNames) {
  Rng rng(8);
  MLP mlp(4, 6, rng, {.dtype = kF64});
  Perturb(mlp, rng);
  const Var x = RandomVar({2, 3, 4}, rng);
  auto r = CheckModuleGradients(mlp, [&](const VarList& in) { return mlp.Forward(in[0]); }, {x});
  EXPECT_TRUE(r) << r;
  const NamedVars named = mlp.named_parameters();
  ASSERT_EQ(named.size(), 4u);
  EXPECT_EQ(named[0].first, "fc1.weight");
  EXPECT_EQ(named[3].first, "fc2.bias");
  EXPECT_EQ(named[2].second.shape(), Shape({6, 4}));
}

class AttentionGradientTest : public ::testing::TestWithParam<bool> {};

TEST_P(AttentionGradientTest, GradientsWrtInputAndParameters) {
  const bool causal = GetParam();
  Rng rng(9);
  MultiHeadAttention attention(6, 2, rng, {.causal = causal, .dtype = kF64});
  Perturb(attention, rng);
  const Var x = RandomVar({2, 4, 6}, rng);
  auto r = CheckModuleGradients(attention,
                                [&](const VarList& in) { return attention.Forward(in[0]); }, {x});
  EXPECT_TRUE(r) << r;
}

INSTANTIATE_TEST_SUITE_P(CausalAndNot,
                         AttentionGradientTest,
                         ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Causal" : "NonCausal";
                         });

// Self-attention of a zero input, computed as one row, against the full
// computation on zeros: values and every parameter's gradient, with and
// without the causal mask and the projections' biases.
class AttentionAtZeroTest : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(AttentionAtZeroTest, OneRowMatchesTheFullComputationOnZeros) {
  const auto [causal, bias] = GetParam();
  Rng rng(21);
  MultiHeadAttention attention(6, 2, rng, {.causal = causal, .bias = bias, .dtype = kF64});
  Perturb(attention, rng);
  const Var zeros(Tensor::Zeros({2, 5, 6}, kF64));
  const Var full = attention.Forward(zeros);
  const Var one_row = attention.ForwardAtZero(2, 5);
  ASSERT_EQ(one_row.shape(), full.shape());
  EXPECT_LT(MaxAbsDiff(one_row.value(), full.value()), 1e-13);
  // With biases the row is wo(bv), not zero; without, attention of zeros is 0.
  const double size = MaxAbsDiff(one_row.value(), Tensor::Zeros({2, 5, 6}, kF64));
  if (bias) {
    EXPECT_GT(size, 1e-2);
  } else {
    EXPECT_EQ(size, 0.0);
  }

  const VarList parameters = attention.parameters();
  const Var probe(RandomNormal({2, 5, 6}, 0.0, 1.0, kF64, rng));
  const VarList full_grads = grad({sum(mul(full, probe))}, parameters);
  const VarList row_grads = grad({sum(mul(one_row, probe))}, parameters);
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    ASSERT_TRUE(row_grads[i].defined()) << "parameter " << i;
    EXPECT_LT(MaxAbsDiff(row_grads[i].value(), full_grads[i].value()), 1e-12) << "parameter " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(CausalAndBias,
                         AttentionAtZeroTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<bool, bool>>& info) {
                           return std::string(std::get<0>(info.param) ? "Causal" : "NonCausal") +
                                  (std::get<1>(info.param) ? "WithBias" : "NoBias");
                         });

TEST(AttentionTest, GradientsOfCrossAttentionWithMasks) {
  Rng rng(10);
  MultiHeadAttention attention(4, 2, rng, {.dtype = kF64});
  Perturb(attention, rng);
  const Var x = RandomVar({2, 3, 4}, rng);
  const Var context = RandomVar({2, 5, 4}, rng);
  AttentionMask mask;
  mask.key_mask = Tensor::FromVector({2, 5}, {0, 0, 1, 0, 0, 1, 0, 0, 0, 1}, kF64);
  mask.additive = RandomNormal({3, 5}, 0.0, 0.5, kF64, rng);
  auto r = CheckModuleGradients(
      attention, [&](const VarList& in) { return attention.Forward(in[0], in[1], mask); },
      {x, context});
  EXPECT_TRUE(r) << r;
}

TEST(AttentionTest, RejectsBadShapes) {
  Rng rng(11);
  EXPECT_THROW(MultiHeadAttention(6, 4, rng), Error);  // 6 is not a multiple of 4
  MultiHeadAttention attention(4, 2, rng, {.dtype = kF64});
  EXPECT_THROW(attention.Forward(RandomVar({2, 3, 5}, rng)), Error);
  AttentionMask mask;
  mask.key_mask = Tensor::Zeros({2, 4}, kF64);  // 4 keys, but T = 3
  EXPECT_THROW(attention.Forward(RandomVar({2, 3, 4}, rng), mask), Error);
}

TEST(DEQCellTest, GradientsWrtStateInjectionAndParameters) {
  Rng rng(12);
  CellOptions options{.dim = 4, .heads = 2, .hidden = 6, .dtype = kF64};
  DEQCell cell(options, rng);
  Perturb(cell, rng);
  const Var z = RandomVar({2, 3, 4}, rng);
  const Var u = RandomVar({2, 3, 4}, rng);
  auto r = CheckModuleGradients(cell, [&](const VarList& in) { return cell.Forward(in[0], in[1]); },
                                {z, u});
  EXPECT_TRUE(r) << r;
}

// The cell's fused norms of residual sums give exactly the values and
// gradients of the written-out formula with add and layer_norm.
TEST(DEQCellTest, FusedNormsMatchTheUnfusedFormulaBitwise) {
  Rng rng(17);
  const CellOptions options{.dim = 16, .heads = 2, .hidden = 24, .dtype = DType::kFloat32};
  DEQCell cell(options, rng);
  Perturb(cell, rng);
  const Var z(RandomNormal({3, 5, 16}, 0.0, 1.0, DType::kFloat32, rng), true);
  const Var u(RandomNormal({3, 5, 16}, 0.0, 1.0, DType::kFloat32, rng), true);
  auto p = [&](const std::string& name) { return cell.parameter(name); };
  auto unfused = [&] {
    const Var attended = cell.attention()->Forward(z);
    const Var h =
        layer_norm(add(add(z, attended), u), p("ln1.gain"), p("ln1.bias"), options.ln_eps);
    const Var hidden =
        gelu(reshape(linear(reshape(h, {15, 16}), p("fc1.weight"), p("fc1.bias")), {3, 5, 24}));
    const Var ffn =
        reshape(linear(reshape(hidden, {15, 24}), p("fc2.weight"), p("fc2.bias")), {3, 5, 16});
    return layer_norm(add(h, ffn), p("ln2.gain"), p("ln2.bias"), options.ln_eps);
  };
  const Var fused_out = cell.Forward(z, u);
  const Var unfused_out = unfused();
  EXPECT_EQ(MaxAbsDiff(fused_out.value(), unfused_out.value()), 0.0);
  VarList inputs = {z, u};
  for (const Var& parameter : cell.parameters()) inputs.push_back(parameter);
  const Var probe(RandomNormal({3, 5, 16}, 0.0, 1.0, DType::kFloat32, rng));
  const VarList fused_grads = grad({sum(mul(fused_out, probe))}, inputs);
  const VarList unfused_grads = grad({sum(mul(unfused_out, probe))}, inputs);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    EXPECT_EQ(MaxAbsDiff(fused_grads[i].value(), unfused_grads[i].value()), 0.0) << "input " << i;
  }
}

TEST(DEQCellTest, ParameterNamesMatchTheReferenceOrder) {
  Rng rng(13);
  DEQCell cell({.dim = 8, .heads = 2, .hidden = 12}, rng);
  std::vector<std::string> names;
  for (const auto& [name, p] : cell.named_parameters()) names.push_back(name);
  const std::vector<std::string> expected = {"wq.weight",  "wq.bias",  "wk.weight",  "wk.bias",
                                             "wv.weight",  "wv.bias",  "wo.weight",  "wo.bias",
                                             "ln1.gain",   "ln1.bias", "fc1.weight", "fc1.bias",
                                             "fc2.weight", "fc2.bias", "ln2.gain",   "ln2.bias"};
  EXPECT_EQ(names, expected);
  EXPECT_EQ(cell.parameter("fc1.weight").shape(), Shape({8, 12}));
}

TEST(DEQCellTest, DropoutCellWithFrozenMasksIsDifferentiable) {
  Rng rng(14);
  DEQCell cell({.dim = 4, .heads = 2, .hidden = 6, .dropout = 0.3, .dtype = kF64}, rng);
  Perturb(cell, rng);
  FreezeDropoutMasks(cell);
  const Var z = RandomVar({2, 3, 4}, rng);
  const Var u = RandomVar({2, 3, 4}, rng);
  auto r = CheckModuleGradients(cell, [&](const VarList& in) { return cell.Forward(in[0], in[1]); },
                                {z, u});
  EXPECT_TRUE(r) << r;
  // The masks really acted: in eval mode the output differs.
  const Tensor train_out = cell.Forward(z, u).value();
  cell.Eval();
  EXPECT_GT(MaxAbsDiff(train_out, cell.Forward(z, u).value()), 1e-3);
}

TEST(DEQCellTest, ForwardAtZeroGradientsWrtInjectionAndParameters) {
  Rng rng(22);
  DEQCell cell({.dim = 4, .heads = 2, .hidden = 6, .dtype = kF64}, rng);
  Perturb(cell, rng);
  const Var u = RandomVar({2, 3, 4}, rng);
  auto r = CheckModuleGradients(
      cell, [&](const VarList& in) { return cell.ForwardAtZero(in[0], {}); }, {u});
  EXPECT_TRUE(r) << r;
}

// f(0; u) by the shortcut equals the full computation on zeros, also with
// frozen dropout masks (the same masks must land on the same entries) and a
// causal mask.
TEST(DEQCellTest, ForwardAtZeroMatchesForwardOnZeros) {
  for (const double dropout : {0.0, 0.3}) {
    for (const bool causal : {false, true}) {
      Rng rng(23);
      DEQCell cell(
          {.dim = 8, .heads = 2, .hidden = 12, .causal = causal, .dropout = dropout, .dtype = kF64},
          rng);
      Perturb(cell, rng);
      if (dropout > 0.0) FreezeDropoutMasks(cell);
      const Var u(RandomNormal({3, 5, 8}, 0.0, 1.0, kF64, rng), true);
      // A zero state that needs a gradient takes Forward's full path.
      const Var full = cell.Forward(Var(Tensor::Zeros({3, 5, 8}, kF64), true), u, {});
      const Var one_row = cell.ForwardAtZero(u, {});
      EXPECT_LT(MaxAbsDiff(one_row.value(), full.value()), 1e-12)
          << "dropout " << dropout << ", causal " << causal;
      VarList inputs = {u};
      for (const Var& parameter : cell.parameters()) inputs.push_back(parameter);
      const Var probe(RandomNormal({3, 5, 8}, 0.0, 1.0, kF64, rng));
      const VarList full_grads = grad({sum(mul(full, probe))}, inputs);
      const VarList row_grads = grad({sum(mul(one_row, probe))}, inputs);
      for (std::size_t i = 0; i < inputs.size(); ++i) {
        EXPECT_LT(MaxAbsDiff(row_grads[i].value(), full_grads[i].value()), 1e-11)
            << "input " << i << ", dropout " << dropout << ", causal " << causal;
      }
    }
  }
}

// Forward recognises a zero state that needs no gradient and takes the
// one-row path: bitwise ForwardAtZero (T = 7, so the full computation's
// average of seven copies would round differently). A zero state that
// needs a gradient takes the full path and gets one.
TEST(DEQCellTest, ForwardOnAZeroStateWithoutGradientIsTheOneRowPath) {
  Rng rng(24);
  DEQCell cell({.dim = 8, .heads = 2, .hidden = 12, .dtype = DType::kFloat32}, rng);
  Perturb(cell, rng);
  const Var u(RandomNormal({3, 7, 8}, 0.0, 1.0, DType::kFloat32, rng));
  const Tensor zeros = Tensor::Zeros({3, 7, 8}, DType::kFloat32);
  const Tensor one_row = cell.ForwardAtZero(u, {}).value();
  EXPECT_EQ(MaxAbsDiff(cell.Forward(Var(zeros), u).value(), one_row), 0.0);
  {
    NoGrad no_grad;
    EXPECT_EQ(MaxAbsDiff(cell.Forward(Var(zeros, true), u).value(), one_row), 0.0);
  }
  const Var z(zeros, true);
  const Var out = cell.Forward(z, u);
  EXPECT_LT(MaxAbsDiff(out.value(), one_row), 1e-5);
  const VarList dz = grad({sum(out)}, {z});
  ASSERT_TRUE(dz[0].defined());
  EXPECT_GT(MaxAbsDiff(dz[0].value(), zeros), 1e-3);
}

TEST(DEQCellTest, RejectsUnknownExtraOption) {
  Rng rng(15);
  CellOptions options;
  options.extra["beta"] = 2.0;
  EXPECT_THROW(DEQCell(options, rng), Error);
}

}  // namespace
}  // namespace stillpoint::building_blocks_test
