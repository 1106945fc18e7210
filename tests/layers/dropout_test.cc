// Dropout: statistics of fresh masks, identity in evaluation mode, and mask
// freezing across calls and across subsets of samples (as a solver calls it).
#include "layers/dropout.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "framework/gradcheck.h"
#include "framework/ops.h"
#include "framework/random.h"
#include "layers/linear.h"

namespace stillpoint::dropout_test {
namespace {

constexpr DType kF64 = DType::kFloat64;

Var Ones(const Shape& shape) { return Var(Tensor::Ones(shape, kF64)); }

TEST(DropoutTest, FreshMasksDropAboutPAndRescale) {
  Dropout dropout({.p = 0.25, .seed = 3});
  const Tensor y = dropout.Forward(Ones({50, 40})).value();
  int64_t zeros = 0;
  for (int64_t i = 0; i < y.numel(); ++i) {
    if (y.at(i) == 0.0) {
      ++zeros;
    } else {
      EXPECT_DOUBLE_EQ(y.at(i), 1.0 / 0.75);
    }
  }
  const double fraction = static_cast<double>(zeros) / y.numel();
  EXPECT_NEAR(fraction, 0.25, 0.03);
  // Unfrozen: the next call draws another mask.
  EXPECT_GT(MaxAbsDiff(y, dropout.Forward(Ones({50, 40})).value()), 0.5);
}

TEST(DropoutTest, IdentityInEvalModeAndForZeroP) {
  Dropout dropout({.p = 0.5});
  dropout.Eval();
  Rng rng(1);
  const Var x(RandomNormal({4, 6}, 0.0, 1.0, kF64, rng));
  EXPECT_TRUE(dropout.Forward(x).value().SameStorage(x.value()));
  Dropout none({.p = 0.0});
  EXPECT_TRUE(none.Forward(x).value().SameStorage(x.value()));
}

TEST(DropoutTest, FrozenMaskIsReusedUntilReleased) {
  Dropout dropout({.p = 0.5, .seed = 4});
  dropout.FreezeMask();
  EXPECT_TRUE(dropout.mask_frozen());
  const Tensor first = dropout.Forward(Ones({4, 3, 5})).value();
  const Tensor second = dropout.Forward(Ones({4, 3, 5})).value();
  EXPECT_EQ(MaxAbsDiff(first, second), 0.0);
  EXPECT_EQ(dropout.frozen_mask().shape(), Shape({4, 3, 5}));
  // The mask multiplies, whatever the input.
  const Tensor twice = dropout.Forward(Var(Tensor::Full({4, 3, 5}, 2.0, kF64))).value();
  for (int64_t i = 0; i < twice.numel(); ++i) EXPECT_DOUBLE_EQ(twice.at(i), 2.0 * first.at(i));
  dropout.ReleaseMask();
  EXPECT_FALSE(dropout.mask_frozen());
  EXPECT_FALSE(dropout.frozen_mask().defined());
  EXPECT_GT(MaxAbsDiff(first, dropout.Forward(Ones({4, 3, 5})).value()), 0.5);
}

TEST(DropoutTest, FrozenMaskFollowsSampleIds) {
  Dropout dropout({.p = 0.5, .seed = 5});
  dropout.FreezeMask();
  const Tensor full = dropout.Forward(Ones({5, 8}), {0, 1, 2, 3, 4}).value();
  // Samples 1 and 3 evaluated alone keep their own rows of the mask.
  const Tensor subset = dropout.Forward(Ones({2, 8}), {1, 3}).value();
  for (int64_t j = 0; j < 8; ++j) {
    EXPECT_EQ(subset.at(j), full.at(1 * 8 + j));
    EXPECT_EQ(subset.at(8 + j), full.at(3 * 8 + j));
  }
  // A sample the mask was not drawn for is an error, as is a shape change.
  EXPECT_THROW(dropout.Forward(Ones({1, 8}), {5}), Error);
  EXPECT_THROW(dropout.Forward(Ones({2, 7}), {0, 1}), Error);
  EXPECT_THROW(dropout.Forward(Ones({2, 8}), {0}), Error);
}

TEST(DropoutTest, FreezeAndReleaseReachNestedModules) {
  class Net : public Module {
   public:
    Net() { inner = RegisterModule("inner", std::make_shared<Dropout>(DropoutOptions{.p = 0.5})); }
    std::shared_ptr<Dropout> inner;
  };
  Net net;
  FreezeDropoutMasks(net);
  EXPECT_TRUE(net.inner->mask_frozen());
  ReleaseDropoutMasks(net);
  EXPECT_FALSE(net.inner->mask_frozen());
}

TEST(DropoutTest, GradientIsTheMaskedGradient) {
  Dropout dropout({.p = 0.4, .seed = 6});
  dropout.FreezeMask();
  Rng rng(2);
  const Var x(RandomNormal({3, 7}, 0.0, 1.0, kF64, rng));
  auto r = CheckGradients([&](const VarList& in) { return dropout.Forward(in[0]); }, {x});
  EXPECT_TRUE(r) << r;
  Var leaf(x.value().Clone(), true);
  backward(sum(dropout.Forward(leaf)));
  for (int64_t i = 0; i < 21; ++i) {
    EXPECT_EQ(leaf.grad().value().at(i), dropout.frozen_mask().at(i));
  }
}

TEST(DropoutTest, RejectsInvalidProbability) {
  EXPECT_THROW(Dropout({.p = 1.0}), Error);
  EXPECT_THROW(Dropout({.p = -0.1}), Error);
}

}  // namespace
}  // namespace stillpoint::dropout_test
