// The gradient checker must accept correct VJPs and reject wrong ones.
#include "framework/gradcheck.h"

#include <gtest/gtest.h>

#include <sstream>

#include "framework/ops.h"
#include "framework/random.h"

namespace stillpoint {
namespace {

Var RandomInput(const Shape& shape, uint64_t seed) {
  Rng rng(seed);
  return Var(RandomNormal(shape, 0, 1, DType::kFloat64, rng));
}

// x -> x^2 with a VJP that is off by a factor (a deliberately broken op).
Var BrokenSquare(const Var& x, double factor) {
  Tensor out = x.value().Clone();
  for (int64_t i = 0; i < out.numel(); ++i) out.set(i, out.at(i) * out.at(i));
  return RecordOp("broken_square", out, {x},
                  [factor](const VarList& in, const Var&, const Var& g) {
                    return VarList{mul(g, mul_scalar(in[0], 2.0 * factor))};
                  });
}

TEST(GradCheckTest, AcceptsACorrectGradient) {
  auto r = CheckGradients([](const VarList& in) { return BrokenSquare(in[0], 1.0); },
                          {RandomInput(Shape{3, 4}, 1)});
  EXPECT_TRUE(r) << r;
  EXPECT_EQ(r.entries_checked, 12);
}

TEST(GradCheckTest, RejectsAWrongGradientAndReportsTheWorstEntry) {
  auto r = CheckGradients([](const VarList& in) { return BrokenSquare(in[0], 1.01); },
                          {RandomInput(Shape{3, 4}, 2)});
  EXPECT_FALSE(r);
  std::ostringstream text;
  text << r;
  EXPECT_NE(text.str().find("FAILED"), std::string::npos);
  EXPECT_NE(text.str().find("analytic"), std::string::npos);
  EXPECT_GT(r.max_rel_error, 1e-3);
}

TEST(GradCheckTest, SecondOrderCheckCatchesAVjpThatIsNotDifferentiable) {
  // A VJP computed from a detached value is right to first order but has no
  // second derivative: the second-order check must notice.
  auto detached_square = [](const Var& x) {
    Tensor out = x.value().Clone();
    for (int64_t i = 0; i < out.numel(); ++i) out.set(i, out.at(i) * out.at(i));
    return RecordOp("detached_square", out, {x}, [](const VarList& in, const Var&, const Var& g) {
      return VarList{mul(g, mul_scalar(in[0].detach(), 2.0))};
    });
  };
  const Var x = RandomInput(Shape{5}, 3);
  auto f = [&](const VarList& in) { return detached_square(in[0]); };
  auto first = CheckGradients(f, {x});
  EXPECT_TRUE(first) << first;
  auto second = CheckSecondOrderGradients(f, {x});
  EXPECT_FALSE(second) << second;
  auto good = CheckSecondOrderGradients(
      [](const VarList& in) { return BrokenSquare(in[0], 1.0); }, {x});
  EXPECT_TRUE(good) << good;
}

TEST(GradCheckTest, SkipsEntriesNearDeclaredKinks) {
  Tensor t = Tensor::FromVector(Shape{3}, {0.0, 0.5, -0.7}, DType::kFloat64);
  GradCheckOptions options;
  options.kinks = {0.0};
  auto r = CheckGradients([](const VarList& in) { return abs(in[0]); }, {Var(t)}, options);
  EXPECT_TRUE(r) << r;
  EXPECT_EQ(r.entries_skipped, 1);
  EXPECT_EQ(r.entries_checked, 2);
}

TEST(GradCheckTest, RejectsFloat32Inputs) {
  Var x(Tensor::Ones(Shape{2}, DType::kFloat32));
  EXPECT_THROW(CheckGradients([](const VarList& in) { return exp(in[0]); }, {x}), Error);
}

}  // namespace
}  // namespace stillpoint
