// Position schemes and attention masks (layers/positions.h): the bias and
// the rotation against hand computations, their gradients against central
// differences, and causality inside every attention, in every model kind:
// a later token never moves an earlier token's output, at the fixed point
// of an energy too.
#include "layers/positions.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "framework/gradcheck.h"
#include "framework/ops.h"
#include "framework/random.h"
#include "layers/attention.h"
#include "layers/energy_attention.h"
#include "layers/models.h"

namespace stillpoint::positions_test {
namespace {

bool HasParameter(const Module& module, const std::string& name) {
  for (const auto& [n, p] : module.named_parameters()) {
    if (n == name) return true;
  }
  return false;
}

double At(const Tensor& t, int64_t h, int64_t i, int64_t j) {
  return t.ToVector()[(h * t.dim(2) + i) * t.dim(3) + j];
}

TEST(PositionSchemes, NamesRoundTripAndUnknownNamesAreRefused) {
  for (PositionScheme scheme : AllPositionSchemes()) {
    PositionScheme parsed = PositionScheme::kLearned;
    ASSERT_TRUE(StringToPositionScheme(ToString(scheme), &parsed)) << ToString(scheme);
    EXPECT_EQ(parsed, scheme);
  }
  PositionScheme unused;
  EXPECT_FALSE(StringToPositionScheme("alibi3d", &unused));
  AttentionMaskKind mask;
  EXPECT_TRUE(StringToAttentionMaskKind("LOCAL", &mask));
  EXPECT_EQ(mask, AttentionMaskKind::kLocal);
  EXPECT_FALSE(StringToAttentionMaskKind("windowed", &mask));
}

TEST(AttentionBias, CausalWithAWindowHidesTheFutureAndTheFarPast) {
  AttentionLayout layout;
  layout.mask = AttentionMaskKind::kCausal;
  layout.window = 1;
  const Tensor bias = AttentionBias(layout, 2, 4, DType::kFloat64);
  ASSERT_EQ(bias.shape(), (Shape{1, 1, 4, 4}));
  for (int64_t i = 0; i < 4; ++i) {
    for (int64_t j = 0; j < 4; ++j) {
      const bool visible = j <= i && j >= i - 1;
      EXPECT_EQ(std::isinf(At(bias, 0, i, j)), !visible) << i << ", " << j;
      if (visible) {
        EXPECT_EQ(At(bias, 0, i, j), 0.0);
      }
    }
  }
  layout.window = 0;  // plain causal: every earlier key
  const Tensor full = AttentionBias(layout, 2, 4, DType::kFloat64);
  EXPECT_EQ(At(full, 0, 3, 0), 0.0);
  EXPECT_TRUE(std::isinf(At(full, 0, 0, 1)));
}

TEST(AttentionBias, LocalOnAGridUsesTheChebyshevNeighbourhood) {
  AttentionLayout layout;
  layout.mask = AttentionMaskKind::kLocal;
  layout.window = 1;
  layout.grid_width = 3;  // tokens 0..8 on a 3 x 3 grid
  const Tensor bias = AttentionBias(layout, 1, 9, DType::kFloat64);
  // Token 4 (the centre) sees all 9; token 0 (a corner) sees 0, 1, 3, 4.
  for (int64_t j = 0; j < 9; ++j) EXPECT_EQ(At(bias, 0, 4, j), 0.0) << j;
  for (int64_t j = 0; j < 9; ++j) {
    const bool visible = j == 0 || j == 1 || j == 3 || j == 4;
    EXPECT_EQ(std::isinf(At(bias, 0, 0, j)), !visible) << j;
  }
  // Without the grid, the same window is |i - j| <= 1.
  layout.grid_width = 0;
  const Tensor line = AttentionBias(layout, 1, 9, DType::kFloat64);
  EXPECT_TRUE(std::isinf(At(line, 0, 0, 3)));
  EXPECT_EQ(At(line, 0, 3, 4), 0.0);
}

TEST(AttentionBias, AlibiSlopesAndDistances) {
  AttentionLayout layout;
  layout.positions = PositionScheme::kAlibi;
  const Tensor bias = AttentionBias(layout, 4, 5, DType::kFloat64);
  ASSERT_EQ(bias.shape(), (Shape{1, 4, 5, 5}));
  // m_h = 2^(-8h/H): 1/4, 1/16, 1/64, 1/256 for H = 4.
  EXPECT_DOUBLE_EQ(At(bias, 0, 1, 4), -0.25 * 3);
  EXPECT_DOUBLE_EQ(At(bias, 0, 4, 1), -0.25 * 3);
  EXPECT_DOUBLE_EQ(At(bias, 1, 0, 2), -2.0 / 16.0);
  EXPECT_DOUBLE_EQ(At(bias, 3, 2, 2), 0.0);
  // 2-D: the Manhattan distance on the square grid of 9 tokens.
  layout.positions = PositionScheme::kAlibi2d;
  const Tensor grid = AttentionBias(layout, 4, 9, DType::kFloat64);
  EXPECT_DOUBLE_EQ(At(grid, 0, 0, 8), -0.25 * 4);  // (0,0) -> (2,2)
  EXPECT_DOUBLE_EQ(At(grid, 0, 2, 6), -0.25 * 4);  // (0,2) -> (2,0)
  EXPECT_THROW(AttentionBias(layout, 4, 8, DType::kFloat64), Error);  // 8 is not a square
  // No mask and no ALiBi: nothing to add.
  EXPECT_FALSE(AttentionBias(AttentionLayout{}, 4, 5, DType::kFloat64).defined());
}

// q_i . k_j after rotation depends on i - j only (rows t of x hold the same
// vector at every position).
TEST(Rotary, DotProductsDependOnTheOffsetOnly) {
  Rng rng(3);
  const int64_t length = 7, width = 8;
  const Tensor q1 = RandomNormal(Shape{1, 1, 1, width}, 0, 1, DType::kFloat64, rng);
  const Tensor k1 = RandomNormal(Shape{1, 1, 1, width}, 0, 1, DType::kFloat64, rng);
  AttentionLayout layout;
  layout.positions = PositionScheme::kRotary;
  const Shape shape{1, 1, length, width};
  const Var q = ApplyRotary(broadcast_to(constant(q1), shape), layout, 2);
  const Var k = ApplyRotary(broadcast_to(constant(k1), shape), layout, 2);
  const std::vector<double> s = matmul(q, k, false, true).value().ToVector();
  for (int64_t offset = -3; offset <= 3; ++offset) {
    const double first = s[3 * length + 3 - offset];
    for (int64_t i = 3; i < length && i - offset < length; ++i) {
      if (i - offset < 0) continue;
      EXPECT_NEAR(s[i * length + i - offset], first, 1e-12) << i << ", offset " << offset;
    }
  }
  // At offset 0 the rotation cancels: q.k unrotated.
  double plain = 0;
  for (int64_t c = 0; c < width; ++c) plain += q1.ToVector()[c] * k1.ToVector()[c];
  EXPECT_NEAR(s[2 * length + 2], plain, 1e-12);
  // The inverse undoes it.
  const Var back = ApplyRotary(q, layout, 2, /*inverse=*/true);
  const std::vector<double> restored = back.value().ToVector();
  for (int64_t i = 0; i < length * width; ++i) {
    EXPECT_NEAR(restored[i], q1.ToVector()[i % width], 1e-12);
  }
}

TEST(Rotary, TwoDimensionalDotProductsDependOnRowAndColumnOffsets) {
  Rng rng(4);
  const int64_t width = 8;
  AttentionLayout layout;
  layout.positions = PositionScheme::kRotary2d;
  layout.grid_width = 3;  // 9 tokens, 3 x 3
  const Shape shape{1, 9, 1, width};
  const Tensor q1 = RandomNormal(Shape{1, 1, 1, width}, 0, 1, DType::kFloat64, rng);
  const Tensor k1 = RandomNormal(Shape{1, 1, 1, width}, 0, 1, DType::kFloat64, rng);
  const Var q = reshape(ApplyRotary(broadcast_to(constant(q1), shape), layout, 1), Shape{9, width});
  const Var k = reshape(ApplyRotary(broadcast_to(constant(k1), shape), layout, 1), Shape{9, width});
  const std::vector<double> s = matmul(q, k, false, true).value().ToVector();
  // (0,0)->(1,1) and (1,1)->(2,2) share the offset (1,1); (0,1)->(1,0) does not.
  EXPECT_NEAR(s[0 * 9 + 4], s[4 * 9 + 8], 1e-12);
  EXPECT_GT(std::abs(s[0 * 9 + 4] - s[1 * 9 + 3]), 1e-6);
}

TEST(Rotary, GradientMatchesCentralDifferences) {
  Rng rng(5);
  for (PositionScheme scheme : {PositionScheme::kRotary, PositionScheme::kRotary2d}) {
    AttentionLayout layout;
    layout.positions = scheme;
    const Var x(RandomNormal(Shape{2, 2, 4, 8}, 0, 1, DType::kFloat64, rng), true);
    const auto f = [&](const VarList& in) { return ApplyRotary(in[0], layout, 2); };
    const auto r = CheckGradients(f, {x});
    EXPECT_TRUE(r) << ToString(scheme) << ": " << r;
  }
}

TEST(MultiHeadAttentionLayout, GradientsThroughMaskBiasAndRotation) {
  Rng rng(6);
  for (AttentionMaskKind mask : {AttentionMaskKind::kCausal, AttentionMaskKind::kLocal}) {
    auto layout = std::make_shared<AttentionLayout>();
    layout->mask = mask;
    layout->window = 1;
    layout->positions = mask == AttentionMaskKind::kLocal ? PositionScheme::kAlibi
                                                            : PositionScheme::kRotary;
    MultiHeadAttention attention(8, 2, rng,
                                 AttentionOptions{.dtype = DType::kFloat64, .layout = layout});
    const Var x(RandomNormal(Shape{2, 5, 8}, 0, 1, DType::kFloat64, rng), true);
    const auto f = [&](const VarList& in) { return attention.Forward(in[0]); };
    const auto r = CheckGradients(f, {x});
    EXPECT_TRUE(r) << ToString(mask) << ": " << r;
  }
}

ImplicitOptions TightSolve();

// The implicit gradient of every energy attention through its masked and
// rotated logits, against central differences of its fixed point.
TEST(EnergyAttentionLayout, GradientsThroughMaskBiasAndRotation) {
  for (const std::string block : {"hopfield", "probabilistic", "expfam", "energy_transformer"}) {
    for (PositionScheme scheme : {PositionScheme::kAlibi, PositionScheme::kRotary}) {
      Rng rng(8);
      auto layout = std::make_shared<AttentionLayout>();
      layout->mask = AttentionMaskKind::kCausal;
      layout->positions = scheme;
      EnergyAttentionOptions options;
      options.block.layer = block;
      options.block.dim = 8;
      options.block.heads = 2;
      options.block.key_grad = KeyGrad::kStop;
      options.block.dtype = DType::kFloat64;
      options.block.layout = layout;
      options.solver = TightSolve();
      options.solver.backward.tolerance = 1e-13;
      options.solver.backward.max_iterations = 400;
      EnergyAttention attention(options, rng);
      const Var x(RandomNormal(Shape{1, 4, 8}, 0, 1, DType::kFloat64, rng), true);
      const auto f = [&](const VarList& in) { return attention.Forward(in[0]); };
      GradCheckOptions check;
      check.relative_tolerance = 1e-5;
      const auto r = CheckGradients(f, {x}, check);
      EXPECT_TRUE(r) << block << " " << ToString(scheme) << ": " << r;
    }
  }
}

// ------------------------------------------------------------- causality

struct CausalCase {
  ModelKind kind;
  std::string attention;
  PositionScheme positions;
};

std::string CaseName(const testing::TestParamInfo<CausalCase>& info) {
  return std::string(ToString(info.param.kind)) + "_" + info.param.attention + "_" +
         ToString(info.param.positions);
}

class Causality : public testing::TestWithParam<CausalCase> {};

ImplicitOptions TightSolve() {
  ImplicitOptions solve;
  solve.forward.max_iterations = 400;
  solve.forward.absolute_tolerance = 1e-13;
  solve.forward.relative_tolerance = 1e-13;
  return solve;
}

// The logits of every token before the last do not move when the last token
// changes (float64, to the solvers' tolerance: their stopping tests see the
// whole state).
TEST_P(Causality, ALaterTokenNeverMovesAnEarlierOutput) {
  const CausalCase c = GetParam();
  ModelOptions o;
  o.kind = c.kind;
  o.vocab_size = 5;
  o.dim = 8;
  o.cell_options.heads = 2;
  o.cell_options.hidden = 16;
  o.num_layers = 2;
  o.dtype = DType::kFloat64;
  o.seed = 7;
  o.positions = c.positions;
  o.attention_mask = AttentionMaskKind::kCausal;
  o.cell_options.attention = c.attention;
  o.implicit = TightSolve();
  o.cell_options.attention_solver = TightSolve();
  if (c.kind == ModelKind::kEnergy) o.energy.layer = c.attention;
  // The Energy Transformer's key-side force moves earlier tokens with later
  // queries; a causal mask needs the query-side update alone.
  o.energy.key_grad = KeyGrad::kStop;
  o.cell_options.energy.key_grad = KeyGrad::kStop;
  SequenceModel model(o);
  model.Eval();
  const int64_t length = 6;
  std::vector<int64_t> ids = {1, 3, 0, 2, 4, 1, 2, 2, 0, 1, 3, 4};
  const Shape shape{2, length};
  const std::vector<double> before = model.Forward(ids, shape).value().ToVector();
  ids[length - 1] = 3;      // sample 0's last token
  ids[2 * length - 1] = 0;  // sample 1's
  const std::vector<double> after = model.Forward(ids, shape).value().ToVector();
  const int64_t classes = static_cast<int64_t>(before.size()) / (2 * length);
  double earlier = 0.0, last = 0.0;
  for (int64_t s = 0; s < 2; ++s) {
    for (int64_t t = 0; t < length; ++t) {
      for (int64_t v = 0; v < classes; ++v) {
        const int64_t i = (s * length + t) * classes + v;
        const double moved = std::abs(after[i] - before[i]);
        (t < length - 1 ? earlier : last) = std::max(t < length - 1 ? earlier : last, moved);
      }
    }
  }
  EXPECT_LT(earlier, 1e-9) << "an earlier token moved";
  EXPECT_GT(last, 1e-6) << "the perturbed token itself should move";
}

std::vector<CausalCase> CausalCases() {
  std::vector<CausalCase> cases;
  const std::vector<std::string> attentions = {"softmax", "hopfield", "probabilistic", "expfam",
                                               "energy_transformer"};
  for (const std::string& a : attentions) {
    for (PositionScheme p : {PositionScheme::kAlibi, PositionScheme::kRotary}) {
      cases.push_back({ModelKind::kExplicit, a, p});
      cases.push_back({ModelKind::kImplicit, a, p});
      if (a != "softmax") cases.push_back({ModelKind::kEnergy, a, p});
    }
  }
  cases.push_back({ModelKind::kImplicit, "softmax", PositionScheme::kNone});
  cases.push_back({ModelKind::kTied, "softmax", PositionScheme::kLearned});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(EveryAttention, Causality, testing::ValuesIn(CausalCases()), CaseName);

TEST(ModelPositions, OnlyLearnedPositionsHaveATableAndALengthLimit) {
  ModelOptions o;
  o.vocab_size = 4;
  o.dim = 8;
  o.cell_options.heads = 2;
  o.max_length = 4;
  o.kind = ModelKind::kExplicit;
  o.num_layers = 1;
  SequenceModel learned(o);
  EXPECT_TRUE(HasParameter(learned, "pos_emb"));
  const std::vector<int64_t> ids(6, 1);
  try {
    learned.Forward(ids, Shape{1, 6});
    FAIL() << "a length beyond max_length was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_length 4"), std::string::npos) << e.what();
  }
  o.positions = PositionScheme::kAlibi;
  SequenceModel alibi(o);
  EXPECT_FALSE(HasParameter(alibi, "pos_emb"));
  EXPECT_EQ(alibi.Forward(ids, Shape{1, 6}).shape(), (Shape{1, 6, 4}));
}

TEST(ModelPositions, ACausalEnergyTransformerNeedsTheQuerySideUpdate) {
  ModelOptions o;
  o.kind = ModelKind::kEnergy;
  o.dim = 8;
  o.cell_options.heads = 2;
  o.energy.layer = "energy_transformer";
  o.attention_mask = AttentionMaskKind::kCausal;
  EXPECT_THROW(SequenceModel{o}, Error);
  o.energy.key_grad = KeyGrad::kStop;
  EXPECT_NO_THROW(SequenceModel{o});
}

TEST(ModelPositions, InvalidLayoutsNameTheProblem) {
  ModelOptions o;
  o.dim = 6;
  o.cell_options.heads = 2;  // head width 3: odd
  o.positions = PositionScheme::kRotary;
  std::string error;
  EXPECT_FALSE(o.IsValid(&error));
  EXPECT_NE(error.find("rotary"), std::string::npos) << error;
  o.positions = PositionScheme::kLearned;
  o.attention_mask = AttentionMaskKind::kLocal;
  EXPECT_FALSE(o.IsValid(&error));
  EXPECT_NE(error.find("attention_window"), std::string::npos) << error;
  o.attention_mask = AttentionMaskKind::kNone;
  o.attention_window = 2;
  EXPECT_FALSE(o.IsValid(&error));
  EXPECT_NE(error.find("attention_window"), std::string::npos) << error;
}

}  // namespace
}  // namespace stillpoint::positions_test
