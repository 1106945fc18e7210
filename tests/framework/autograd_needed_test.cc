// The per-input "needed" mask a backward sweep hands to each VJP
// (InputGradNeeded): its values for grad() and backward(), and the VJPs that
// skip unneeded gradients (matmul, layer_norm, add) without changing the
// gradients that are computed.
#include <gtest/gtest.h>

#include <vector>

#include "framework/autograd.h"
#include "framework/ops.h"
#include "framework/random.h"

namespace stillpoint::autograd_needed_test {
namespace {

Var Random(const Shape& shape, uint64_t seed, bool requires_grad = true) {
  Rng rng(seed);
  return Var(RandomNormal(shape, 0.0, 1.0, DType::kFloat64, rng), requires_grad);
}

// y = x + w with a VJP that records the mask it was called with.
Var Probe(const Var& x, const Var& w, std::vector<std::vector<bool>>* seen) {
  return RecordOp("probe", add(x, w).value(), {x, w},
                  [seen](const VarList& in, const Var&, const Var& g) {
                    seen->push_back({InputGradNeeded(0), InputGradNeeded(1)});
                    return VarList{g, g};
                  });
}

TEST(InputGradNeededTest, TrueOutsideASweep) { EXPECT_TRUE(InputGradNeeded(0)); }

TEST(InputGradNeededTest, GradAsksOnlyForTheRequestedInputs) {
  const Var x = Random(Shape{3}, 1);
  const Var w = Random(Shape{3}, 2);
  std::vector<std::vector<bool>> seen;
  grad({sum(Probe(x, w, &seen))}, {x});
  grad({sum(Probe(x, w, &seen))}, {w});
  grad({sum(Probe(x, w, &seen))}, {x, w});
  backward(sum(Probe(x, w, &seen)));
  const Var frozen = Random(Shape{3}, 3, /*requires_grad=*/false);
  backward(sum(Probe(x, frozen, &seen)));
  const std::vector<std::vector<bool>> expected = {
      {true, false}, {false, true}, {true, true}, {true, true}, {true, false}};
  EXPECT_EQ(seen, expected);
}

TEST(InputGradNeededTest, IntermediateNodesLeadingToTargetsAreNeeded) {
  // w feeds the probe through h = w * 2: the mask follows paths, not leaves.
  const Var x = Random(Shape{3}, 4);
  const Var w = Random(Shape{3}, 5);
  std::vector<std::vector<bool>> seen;
  grad({sum(Probe(x, mul_scalar(w, 2.0), &seen))}, {w});
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], (std::vector<bool>{false, true}));
}

TEST(InputGradNeededTest, MatmulVjpSkipsAnUnneededWeight) {
  const Var x = Random(Shape{4, 3}, 6);
  const Var w = Random(Shape{3, 5}, 7);
  const Var y = matmul(x, w);
  const Var g = Random(Shape{4, 5}, 8, false);
  const VarList inputs{x, w};
  const std::vector<char> only_x = {1, 0};
  VarList grads;
  {
    NoGrad no_grad;
    ScopedInputGradMask mask(&only_x);
    grads = y.node()->backward(inputs, y, g);
  }
  ASSERT_EQ(grads.size(), 2u);
  EXPECT_TRUE(grads[0].defined());
  EXPECT_FALSE(grads[1].defined());  // x^T g was never formed
  const std::vector<char> both = {1, 1};
  VarList full;
  {
    NoGrad no_grad;
    ScopedInputGradMask mask(&both);
    full = y.node()->backward(inputs, y, g);
  }
  ASSERT_TRUE(full[1].defined());
  EXPECT_EQ(grads[0].value().ToVector(), full[0].value().ToVector());
}

TEST(InputGradNeededTest, LayerNormAndAddVjpsSkipParameters) {
  const Var x = Random(Shape{2, 4}, 9);
  const Var gain = Random(Shape{4}, 10);
  const Var bias = Random(Shape{4}, 11);
  const Var g = Random(Shape{2, 4}, 12, false);
  const std::vector<char> only_x = {1, 0, 0};
  const Var y = layer_norm(x, gain, bias);
  const Var z = add(x, bias);
  NoGrad no_grad;
  ScopedInputGradMask mask(&only_x);
  const VarList grads = y.node()->backward({x, gain, bias}, y, g);
  EXPECT_TRUE(grads[0].defined());
  EXPECT_FALSE(grads[1].defined());
  EXPECT_FALSE(grads[2].defined());
  const VarList add_grads = z.node()->backward({x, bias}, z, g);
  EXPECT_TRUE(add_grads[0].defined());
  EXPECT_FALSE(add_grads[1].defined());
}

TEST(InputGradNeededTest, SkippingDoesNotChangeTheRequestedGradients) {
  // A small two-layer network: d/dx alone equals d/dx from the full request,
  // bit for bit, with and without create_graph.
  const Var x = Random(Shape{5, 4}, 13);
  const Var w1 = Random(Shape{4, 6}, 14);
  const Var w2 = Random(Shape{6, 4}, 15);
  const Var gain = Random(Shape{4}, 16);
  const Var bias = Random(Shape{4}, 17);
  auto f = [&]() { return layer_norm(matmul(gelu(matmul(x, w1)), w2), gain, bias); };
  const Var g = Random(Shape{5, 4}, 18, false);
  for (bool create_graph : {false, true}) {
    const VarList all = grad({f()}, {x, w1, w2, gain, bias}, {g}, {.create_graph = create_graph});
    const VarList only_x = grad({f()}, {x}, {g}, {.create_graph = create_graph});
    EXPECT_EQ(only_x[0].value().ToVector(), all[0].value().ToVector()) << create_graph;
  }
}

}  // namespace
}  // namespace stillpoint::autograd_needed_test
