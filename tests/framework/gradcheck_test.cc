// The gradient checker must accept correct VJPs and reject wrong ones.
#include "framework/gradcheck.h"

#include <gtest/gtest.h>

#include <sstream>

#include "framework/ops.h"
#include "framework/random.h"

namespace stillpoint::gradcheck_test {
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

// A module whose forward scales its input by its parameter w: out = w * x,
// with dL/dw optionally off by a factor.
class Scale : public Module {
 public:
  explicit Scale(double factor) : factor_(factor) {
    w_ = RegisterParameter("w", Tensor::Full({3}, 0.7, DType::kFloat64));
  }
  std::string Name() const override { return "Scale"; }
  Var Forward(const Var& x) const {
    const double factor = factor_;
    Tensor out = x.value().Clone();
    for (int64_t i = 0; i < out.numel(); ++i) out.set(i, out.at(i) * w_.value().at(i));
    return RecordOp("scale", out, {x, w_},
                    [factor](const VarList& in, const Var&, const Var& g) {
                      return VarList{mul(g, in[1]), mul_scalar(mul(g, in[0]), factor)};
                    });
  }

 private:
  double factor_;
  Var w_;
};

// The trap CheckGradients cannot see by itself: f ignores the checked input
// and reads the module's own parameter, so every gradient is exactly 0.
// It now fails, saying so, unless allowed.
TEST(GradCheckTest, AllZeroGradientsFailWithAWarning) {
  Scale module(1.0);
  const Var x = RandomInput({3}, 5);
  VarFunction reads_parameter = [&](const VarList& in) {
    (void)in;  // the copy of the parameter is not what forward reads
    return module.Forward(x);
  };
  const Var parameter_copy(module.parameters()[0].value().Clone());
  GradCheckResult r = CheckGradients(reads_parameter, {parameter_copy});
  EXPECT_FALSE(r);
  EXPECT_TRUE(r.all_zero);
  std::ostringstream text;
  text << r;
  EXPECT_NE(text.str().find("every compared gradient (3 entries) is exactly zero"),
            std::string::npos)
      << text.str();
  EXPECT_NE(text.str().find("CheckParameterGradients"), std::string::npos);
  GradCheckOptions allow;
  allow.allow_all_zero = true;
  r = CheckGradients(reads_parameter, {parameter_copy}, allow);
  EXPECT_TRUE(r);
  EXPECT_TRUE(r.all_zero);
  // A gradient that is not all zero is unaffected.
  EXPECT_FALSE(CheckGradients([&](const VarList& in) { return module.Forward(in[0]); }, {x}).all_zero);
}

TEST(GradCheckTest, CheckParameterGradientsComparesTheModulesOwnParameters) {
  const Var x = RandomInput({3}, 6);
  Scale right(1.0), wrong(1.5);
  const GradCheckResult good =
      CheckParameterGradients(right, [&] { return sum(square(right.Forward(x))); });
  EXPECT_TRUE(good) << good;
  EXPECT_EQ(good.entries_checked, 3);
  const GradCheckResult bad =
      CheckParameterGradients(wrong, [&] { return sum(square(wrong.Forward(x))); });
  EXPECT_FALSE(bad) << bad;
  EXPECT_NE(bad.log.find("w["), std::string::npos) << bad.log;
  // The parameters are restored and the gradients cleared.
  EXPECT_EQ(wrong.parameters()[0].value().at(1), 0.7);
  EXPECT_FALSE(wrong.parameters()[0].has_grad());
  // A loss that does not read the parameters: all zero, failed.
  const GradCheckResult unrelated = CheckParameterGradients(right, [&] { return sum(square(x)); });
  EXPECT_FALSE(unrelated);
  EXPECT_TRUE(unrelated.all_zero);
}

}  // namespace
}  // namespace stillpoint::gradcheck_test
