// Attention over each query's neighbours (neighbour_attention,
// framework/ops_neighbour_attention.h, with LocalNeighbours,
// layers/positions.h) against the dense scores masked by AttentionBias, in
// float64: values and gradients (2-D grids and sequences, with and without
// ALiBi), central differences of the fused VJP and of its create_graph
// form, and MultiHeadAttention's local mask against its dense path.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "framework/gradcheck.h"
#include "framework/ops.h"
#include "framework/ops_neighbour_attention.h"
#include "framework/random.h"
#include "layers/attention.h"
#include "layers/positions.h"

namespace stillpoint::neighbour_attention_test {
namespace {

Var Random(const Shape& shape, uint64_t seed, bool requires_grad = false) {
  Rng rng(seed);
  return Var(RandomNormal(shape, 0.0, 1.0, DType::kFloat64, rng), requires_grad);
}

double LargestDifference(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const std::vector<double> x = a.ToVector(), y = b.ToVector();
  double worst = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
  return worst;
}

// Dense multi-head self-attention with AttentionBias added to the scores:
// every key scored, the hidden ones at -inf.
Var DenseMasked(const Var& q,
                const Var& k,
                const Var& v,
                int64_t heads,
                double scale,
                const AttentionLayout& layout) {
  const int64_t batch = q.dim(0), length = q.dim(1), dh = q.dim(2) / heads;
  const auto split = [&](const Var& x) {
    return permute(reshape(x, Shape{batch, length, heads, dh}), {0, 2, 1, 3});
  };
  Var scores = mul_scalar(matmul(split(q), split(k), false, true), scale);
  scores = add(scores, constant(AttentionBias(layout, heads, length, DType::kFloat64)));
  const Var out = matmul(softmax(scores), split(v));
  return reshape(permute(out, {0, 2, 1, 3}), Shape{batch, length, heads * dh});
}

struct Case {
  PositionScheme positions;
  int64_t grid_width;  // 0: a sequence (or a square grid for alibi_2d)
  int64_t length;
  int64_t window;
  int64_t heads;
};

class NeighbourAttentionCase : public ::testing::TestWithParam<Case> {};

TEST_P(NeighbourAttentionCase, MatchesTheDenseMaskedScoresInValuesAndGradients) {
  const Case c = GetParam();
  AttentionLayout layout;
  layout.mask = AttentionMaskKind::kLocal;
  layout.window = c.window;
  layout.positions = c.positions;
  layout.grid_width = c.grid_width;
  const int64_t dim = c.heads * 4;
  const Var q = Random(Shape{2, c.length, dim}, 1, true);
  const Var k = Random(Shape{2, c.length, dim}, 2, true);
  const Var v = Random(Shape{2, c.length, dim}, 3, true);
  const Var g = Random(Shape{2, c.length, dim}, 4);
  const AttentionNeighbours neighbours =
      LocalNeighbours(layout, c.heads, c.length, DType::kFloat64);
  const Var dense = DenseMasked(q, k, v, c.heads, 0.7, layout);
  const Var fused = neighbour_attention(q, k, v, c.heads, 0.7, neighbours);
  const Var reference = neighbour_attention_reference(q, k, v, c.heads, 0.7, neighbours);
  EXPECT_LT(LargestDifference(fused.value(), dense.value()), 1e-13);
  EXPECT_LT(LargestDifference(reference.value(), dense.value()), 1e-13);
  const VarList dense_grads = grad({dense}, {q, k, v}, {g});
  const VarList fused_grads = grad({fused}, {q, k, v}, {g});
  const VarList reference_grads = grad({reference}, {q, k, v}, {g});
  for (int i = 0; i < 3; ++i) {
    EXPECT_LT(LargestDifference(fused_grads[i].value(), dense_grads[i].value()), 1e-12) << i;
    EXPECT_LT(LargestDifference(reference_grads[i].value(), dense_grads[i].value()), 1e-12) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts,
    NeighbourAttentionCase,
    ::testing::Values(Case{PositionScheme::kRotary2d, 5, 25, 1, 2},  // a 5 x 5 grid
                      Case{PositionScheme::kNone, 4, 12, 1, 1},      // 3 rows of 4
                      Case{PositionScheme::kAlibi2d, 0, 16, 1, 2},   // ALiBi on a 4 x 4 grid
                      Case{PositionScheme::kAlibi, 0, 9, 2, 2},      // a sequence, window 2
                      Case{PositionScheme::kNone, 4, 16, 2, 1}));    // window 2 on a grid

TEST(NeighbourAttention, LocalNeighboursListsTheWindowInOrder) {
  AttentionLayout layout;
  layout.mask = AttentionMaskKind::kLocal;
  layout.window = 1;
  layout.grid_width = 3;  // tokens 0..8 on a 3 x 3 grid
  const AttentionNeighbours n = LocalNeighbours(layout, 1, 9, DType::kFloat64);
  ASSERT_EQ(n.per_query, 9);
  // A corner sees itself and three neighbours; the centre sees all nine.
  const std::vector<int64_t> corner(n.keys.begin(), n.keys.begin() + 9);
  EXPECT_EQ(corner, (std::vector<int64_t>{0, 1, 3, 4, -1, -1, -1, -1, -1}));
  const std::vector<int64_t> centre(n.keys.begin() + 4 * 9, n.keys.begin() + 5 * 9);
  EXPECT_EQ(centre, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_FALSE(n.bias.defined());  // no ALiBi
}

TEST(NeighbourAttention, FusedVjpAndCreateGraphFormMatchCentralDifferences) {
  AttentionLayout layout;
  layout.mask = AttentionMaskKind::kLocal;
  layout.window = 1;
  layout.positions = PositionScheme::kAlibi2d;
  const AttentionNeighbours neighbours = LocalNeighbours(layout, 2, 9, DType::kFloat64);
  const VarFunction f = [&](const VarList& in) {
    return neighbour_attention(in[0], in[1], in[2], 2, 0.6, neighbours);
  };
  const VarList inputs = {Random(Shape{2, 9, 4}, 11), Random(Shape{2, 9, 4}, 12),
                          Random(Shape{2, 9, 4}, 13)};
  auto r = CheckGradients(f, inputs);
  EXPECT_TRUE(r) << r;
  r = CheckSecondOrderGradients(f, inputs);
  EXPECT_TRUE(r) << r;
}

TEST(NeighbourAttention, SharedInputGetsTheSumOfItsSlotsGradients) {
  AttentionLayout layout;
  layout.mask = AttentionMaskKind::kLocal;
  layout.window = 1;
  layout.grid_width = 3;
  const AttentionNeighbours neighbours = LocalNeighbours(layout, 2, 9, DType::kFloat64);
  const Var x = Random(Shape{1, 9, 4}, 20, true);
  const Var fused = sum(square(neighbour_attention(x, x, x, 2, 0.5, neighbours)));
  const Var reference = sum(square(neighbour_attention_reference(x, x, x, 2, 0.5, neighbours)));
  // create_graph first: it keeps the graph for the second call.
  const Var graph_grad = grad({fused}, {x}, {}, {.create_graph = true})[0];
  const Var fused_grad = grad({fused}, {x})[0];
  const Var reference_grad = grad({reference}, {x})[0];
  EXPECT_LT(LargestDifference(fused_grad.value(), reference_grad.value()), 1e-12);
  EXPECT_LT(LargestDifference(graph_grad.value(), reference_grad.value()), 1e-12);
}

TEST(NeighbourAttention, MultiHeadAttentionLocalMaskMatchesItsDensePath) {
  auto layout = std::make_shared<AttentionLayout>();
  layout->mask = AttentionMaskKind::kLocal;
  layout->window = 1;
  layout->positions = PositionScheme::kRotary2d;
  layout->grid_width = 4;
  Rng rng(5);
  AttentionOptions options;
  options.dtype = DType::kFloat64;
  options.layout = layout;
  MultiHeadAttention attention(16, 2, rng, options);
  const Var x = Random(Shape{2, 16, 16}, 6, true);
  // An all-zero key mask hides nothing but sends the layer down its dense
  // path (scores [B, heads, T, T] plus the layout's bias).
  AttentionMask nothing_hidden;
  nothing_hidden.key_mask = Tensor::Zeros(Shape{16}, DType::kFloat64);
  const Var sparse = attention.Forward(x);
  const Var dense = attention.Forward(x, nothing_hidden);
  EXPECT_LT(LargestDifference(sparse.value(), dense.value()), 1e-13);
  const Var g = Random(Shape{2, 16, 16}, 7);
  VarList inputs = {x};
  for (const auto& [name, p] : attention.named_parameters()) inputs.push_back(p);
  const VarList sparse_grads = grad({sparse}, inputs, {g});
  const VarList dense_grads = grad({dense}, inputs, {g});
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    EXPECT_LT(LargestDifference(sparse_grads[i].value(), dense_grads[i].value()), 1e-12) << i;
  }
}

TEST(NeighbourAttention, ErrorsNameTheProblem) {
  AttentionNeighbours none;
  none.per_query = 1;
  none.keys = {-1, 0};  // query 0 sees no key
  const Var x = Random(Shape{1, 2, 4}, 30);
  EXPECT_THROW(neighbour_attention(x, x, x, 2, 1.0, none), Error);
  AttentionNeighbours outside;
  outside.per_query = 1;
  outside.keys = {0, 2};  // key 2 of 2 tokens
  EXPECT_THROW(neighbour_attention(x, x, x, 2, 1.0, outside), Error);
}

}  // namespace
}  // namespace stillpoint::neighbour_attention_test
