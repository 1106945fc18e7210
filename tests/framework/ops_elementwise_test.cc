// Elementwise ops: values against direct std:: formulas (float64 and
// float32), NumPy broadcasting on every kernel path, first- and second-order
// gradient checks, fused VJPs against their differentiable form, error
// messages, IEEE propagation and independence from the thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "framework/gradcheck.h"
#include "framework/ops.h"
#include "framework/parallel.h"
#include "framework/random.h"
#include "framework/kernels/vector_math.h"

namespace stillpoint::ops_elementwise_test {
namespace {

using UnaryOp = std::function<Var(const Var&)>;
using Formula = std::function<double(double)>;

Var Uniform(
    const Shape& shape, double low, double high, uint64_t seed, DType dtype = DType::kFloat64) {
  Rng rng(seed);
  return Var(RandomUniform(shape, low, high, dtype, rng));
}

Var Normal(const Shape& shape, uint64_t seed, DType dtype = DType::kFloat64) {
  Rng rng(seed);
  return Var(RandomNormal(shape, 0.0, 1.0, dtype, rng));
}

double GeluFormula(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

double SigmoidFormula(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// One unary op with its reference formula and an input range where it is
// smooth and well conditioned.
struct UnaryCase {
  std::string name;
  UnaryOp op;
  Formula formula;
  double low;
  double high;
  bool second_order;  // smooth enough for a second-order check
};

std::vector<UnaryCase> UnaryCases() {
  return {
      {"neg", [](const Var& x) { return neg(x); }, [](double x) { return -x; }, -2, 2, true},
      {"exp", [](const Var& x) { return exp(x); }, [](double x) { return std::exp(x); }, -2, 2,
       true},
      {"log", [](const Var& x) { return log(x); }, [](double x) { return std::log(x); }, 0.5, 3,
       true},
      {"sqrt", [](const Var& x) { return sqrt(x); }, [](double x) { return std::sqrt(x); }, 0.5, 3,
       true},
      {"rsqrt", [](const Var& x) { return rsqrt(x); }, [](double x) { return 1.0 / std::sqrt(x); },
       0.5, 3, true},
      {"square", [](const Var& x) { return square(x); }, [](double x) { return x * x; }, -2, 2,
       true},
      {"pow_2.5", [](const Var& x) { return pow(x, 2.5); },
       [](double x) { return std::pow(x, 2.5); }, 0.5, 2, true},
      {"pow_-1.5", [](const Var& x) { return pow(x, -1.5); },
       [](double x) { return std::pow(x, -1.5); }, 0.5, 2, true},
      {"pow_2", [](const Var& x) { return pow(x, 2.0); }, [](double x) { return x * x; }, -2, 2,
       true},
      {"pow_1", [](const Var& x) { return pow(x, 1.0); }, [](double x) { return x; }, -2, 2, true},
      {"pow_0", [](const Var& x) { return pow(x, 0.0); }, [](double x) { return 1.0; }, -2, 2,
       true},
      {"abs", [](const Var& x) { return abs(x); }, [](double x) { return std::abs(x); }, -2, 2,
       false},
      {"tanh", [](const Var& x) { return tanh(x); }, [](double x) { return std::tanh(x); }, -2, 2,
       true},
      {"sigmoid", [](const Var& x) { return sigmoid(x); }, SigmoidFormula, -4, 4, true},
      {"relu", [](const Var& x) { return relu(x); }, [](double x) { return x > 0 ? x : 0.0; }, -2,
       2, false},
      {"gelu", [](const Var& x) { return gelu(x); }, GeluFormula, -3, 3, true},
      {"softplus", [](const Var& x) { return softplus(x); },
       [](double x) { return std::log(1.0 + std::exp(x)); }, -4, 4, true},
      {"add_scalar", [](const Var& x) { return add_scalar(x, 1.25); },
       [](double x) { return x + 1.25; }, -2, 2, true},
      {"mul_scalar", [](const Var& x) { return mul_scalar(x, -0.75); },
       [](double x) { return -0.75 * x; }, -2, 2, true},
      {"rdiv_scalar", [](const Var& x) { return rdiv_scalar(1.5, x); },
       [](double x) { return 1.5 / x; }, 0.5, 2, true},
  };
}

GradCheckOptions KinkAtZero() {
  GradCheckOptions options;
  options.kinks = {0.0};
  return options;
}

TEST(ElementwiseTest, UnaryValuesMatchStdFormulasInFloat64) {
  for (const UnaryCase& c : UnaryCases()) {
    Var x = Uniform(Shape{3, 5}, c.low, c.high, 11);
    Var y = c.op(x);
    ASSERT_EQ(y.shape(), x.shape()) << c.name;
    ASSERT_EQ(y.dtype(), DType::kFloat64) << c.name;
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double expected = c.formula(x.value().at(i));
      EXPECT_NEAR(y.value().at(i), expected, 1e-14 * (1.0 + std::abs(expected)))
          << c.name << " at " << x.value().at(i);
    }
  }
}

TEST(ElementwiseTest, UnaryValuesMatchStdFormulasInFloat32) {
  for (const UnaryCase& c : UnaryCases()) {
    Var x = Uniform(Shape{4, 6}, c.low, c.high, 12, DType::kFloat32);
    Var y = c.op(x);
    ASSERT_EQ(y.dtype(), DType::kFloat32) << c.name;
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double expected = c.formula(x.value().at(i));
      EXPECT_NEAR(y.value().at(i), expected, 2e-6 * (1.0 + std::abs(expected)))
          << c.name << " at " << x.value().at(i);
    }
  }
}

// Ops whose derivative (pow_0) or second derivative (the linear ones) is
// zero everywhere: their all-zero checks are expected, not a mistake.
bool ZeroDerivative(const std::string& name) { return name == "pow_0"; }
bool ZeroSecondDerivative(const std::string& name) {
  return name == "pow_0" || name == "pow_1" || name == "neg" || name == "add_scalar" ||
         name == "mul_scalar" || name == "add" || name == "sub";
}

TEST(ElementwiseTest, UnaryGradientsMatchFiniteDifferences) {
  for (const UnaryCase& c : UnaryCases()) {
    Var x = Uniform(Shape{2, 3, 4}, c.low, c.high, 13);
    GradCheckOptions options = KinkAtZero();
    options.allow_all_zero = ZeroDerivative(c.name);
    auto r = CheckGradients([&](const VarList& in) { return c.op(in[0]); }, {x}, options);
    EXPECT_TRUE(r) << c.name << ": " << r;
    EXPECT_EQ(r.all_zero, ZeroDerivative(c.name)) << c.name;
    EXPECT_GT(r.entries_checked, 20) << c.name;
  }
}

TEST(ElementwiseTest, UnarySecondOrderGradientsMatchFiniteDifferences) {
  for (const UnaryCase& c : UnaryCases()) {
    if (!c.second_order) continue;
    Var x = Uniform(Shape{2, 3}, c.low, c.high, 14);
    GradCheckOptions options;
    options.allow_all_zero = ZeroSecondDerivative(c.name);
    auto r =
        CheckSecondOrderGradients([&](const VarList& in) { return c.op(in[0]); }, {x}, options);
    EXPECT_TRUE(r) << c.name << ": " << r;
    EXPECT_EQ(r.all_zero, ZeroSecondDerivative(c.name)) << c.name;
  }
}

// The fused VJP (taken without create_graph) and the differentiable VJP
// (taken with it) must give the same gradient.
TEST(ElementwiseTest, FusedAndDifferentiableVjpsAgree) {
  for (const UnaryCase& c : UnaryCases()) {
    Var x(Uniform(Shape{3, 4}, c.low, c.high, 15).value(), true);
    Var probe = Normal(Shape{3, 4}, 16);
    Var plain = grad({sum(mul(c.op(x), probe))}, {x})[0];
    Var recorded =
        grad({sum(mul(c.op(x), probe))}, {x}, {}, {.retain_graph = true, .create_graph = true})[0];
    ASSERT_TRUE(plain.defined() && recorded.defined()) << c.name;
    EXPECT_LT(MaxAbsDiff(plain.value(), recorded.value()), 1e-13) << c.name;
  }
}

TEST(ElementwiseTest, ReluAndAbsHaveZeroDerivativeAtZero) {
  Var x(Tensor::FromVector(Shape{3}, {-1.0, 0.0, 2.0}, DType::kFloat64), true);
  Var g_relu = grad({sum(relu(x))}, {x})[0];
  Var g_abs = grad({sum(abs(x))}, {x})[0];
  EXPECT_EQ(g_relu.value().ToVector(), (std::vector<double>{0.0, 0.0, 1.0}));
  EXPECT_EQ(g_abs.value().ToVector(), (std::vector<double>{-1.0, 0.0, 1.0}));
}

// --------------------------------------------------------------- binary

using BinaryOp = std::function<Var(const Var&, const Var&)>;

struct BinaryCase {
  std::string name;
  BinaryOp op;
  std::function<double(double, double)> formula;
};

std::vector<BinaryCase> BinaryCases() {
  return {
      {"add", [](const Var& a, const Var& b) { return add(a, b); },
       [](double a, double b) { return a + b; }},
      {"sub", [](const Var& a, const Var& b) { return sub(a, b); },
       [](double a, double b) { return a - b; }},
      {"mul", [](const Var& a, const Var& b) { return mul(a, b); },
       [](double a, double b) { return a * b; }},
      {"div", [](const Var& a, const Var& b) { return div(a, b); },
       [](double a, double b) { return a / b; }},
      {"maximum", [](const Var& a, const Var& b) { return maximum(a, b); },
       [](double a, double b) { return a >= b ? a : b; }},
  };
}

// Shape pairs covering each kernel path: identical, scalar either side,
// trailing row either side, and the general strided walk.
std::vector<std::pair<Shape, Shape>> BroadcastPairs() {
  return {
      {Shape{2, 3}, Shape{2, 3}},
      {Shape{2, 3, 4}, Shape{3, 1}},
      {Shape{4}, Shape{2, 3, 4}},
      {Shape{}, Shape{2, 3}},
      {Shape{2, 3}, Shape{}},
      {Shape{2, 3, 4}, Shape{4}},
      {Shape{3, 4}, Shape{2, 3, 4}},
      {Shape{2, 1, 4}, Shape{1, 3, 1}},
      {Shape{2, 1, 3, 1}, Shape{4, 1, 1}},
      {Shape{1, 1}, Shape{2, 3}},
      {Shape{2, 3, 1}, Shape{2, 3, 4}},
  };
}

// The row-major flat index into `in` of the element that broadcasting reads
// for flat output index `flat` of shape `out`.
int64_t SourceIndex(const Shape& in, const Shape& out, int64_t flat) {
  std::vector<int64_t> coords(out.rank());
  for (int axis = out.rank() - 1; axis >= 0; --axis) {
    coords[axis] = flat % out.dim(axis);
    flat /= out.dim(axis);
  }
  int64_t index = 0;
  for (int axis = 0; axis < in.rank(); ++axis) {
    const int64_t c = coords[out.rank() - in.rank() + axis];
    index = index * in.dim(axis) + (in.dim(axis) == 1 ? 0 : c);
  }
  return index;
}

TEST(ElementwiseTest, BroadcastShapesFollowNumPy) {
  EXPECT_EQ(BroadcastShapes(Shape{2, 3, 4}, Shape{3, 1}, "t"), (Shape{2, 3, 4}));
  EXPECT_EQ(BroadcastShapes(Shape{}, Shape{2, 3}, "t"), (Shape{2, 3}));
  EXPECT_EQ(BroadcastShapes(Shape{2, 1, 4}, Shape{1, 3, 1}, "t"), (Shape{2, 3, 4}));
  EXPECT_EQ(BroadcastShapes(Shape{5, 1, 1, 1}, Shape{1, 2}, "t"), (Shape{5, 1, 1, 2}));
  EXPECT_EQ(BroadcastShapes(Shape{}, Shape{}, "t"), Shape{});
  EXPECT_THROW(BroadcastShapes(Shape{2, 3}, Shape{2}, "t"), Error);
}

TEST(ElementwiseTest, BinaryValuesBroadcastOnEveryPath) {
  for (const BinaryCase& c : BinaryCases()) {
    for (const auto& [sa, sb] : BroadcastPairs()) {
      for (DType dtype : {DType::kFloat64, DType::kFloat32}) {
        Var a = Uniform(sa, 0.5, 2.0, 21, dtype);
        Var b = Uniform(sb, -2.0, 2.0, 22, dtype);
        Var y = c.op(a, b);
        const Shape expected_shape = BroadcastShapes(sa, sb, "test");
        ASSERT_EQ(y.shape(), expected_shape) << c.name << " " << sa << " " << sb;
        ASSERT_EQ(y.dtype(), dtype);
        for (int64_t i = 0; i < y.numel(); ++i) {
          const double av = a.value().at(SourceIndex(sa, expected_shape, i));
          const double bv = b.value().at(SourceIndex(sb, expected_shape, i));
          // float32 results are the float32 rounding of the float32 operation.
          const double expected =
              dtype == DType::kFloat64 ? c.formula(av, bv) : static_cast<float>(c.formula(av, bv));
          EXPECT_EQ(y.value().at(i), expected) << c.name << " " << sa << " " << sb << " at " << i;
        }
      }
    }
  }
}

TEST(ElementwiseTest, BinaryGradientsMatchFiniteDifferencesUnderBroadcasting) {
  for (const BinaryCase& c : BinaryCases()) {
    for (const auto& [sa, sb] : BroadcastPairs()) {
      Var a = Uniform(sa, 0.5, 2.0, 31);
      Var b = Uniform(sb, 0.5, 2.0, 32);  // continuous values: maximum never ties
      auto r = CheckGradients([&](const VarList& in) { return c.op(in[0], in[1]); }, {a, b});
      EXPECT_TRUE(r) << c.name << " " << sa << " " << sb << ": " << r;
    }
  }
}

TEST(ElementwiseTest, BinarySecondOrderGradientsMatchFiniteDifferences) {
  const std::vector<std::pair<Shape, Shape>> pairs = {
      {Shape{2, 3}, Shape{2, 3}}, {Shape{2, 3, 2}, Shape{3, 1}}, {Shape{}, Shape{2, 3}}};
  for (const BinaryCase& c : BinaryCases()) {
    if (c.name == "maximum") continue;  // piecewise linear: second derivative 0
    for (const auto& [sa, sb] : pairs) {
      Var a = Uniform(sa, 0.5, 2.0, 41);
      Var b = Uniform(sb, 0.5, 2.0, 42);
      // Squaring makes the second derivative of add/sub nonzero.
      auto r = CheckSecondOrderGradients(
          [&](const VarList& in) { return square(c.op(in[0], in[1])); }, {a, b});
      EXPECT_TRUE(r) << c.name << " " << sa << " " << sb << ": " << r;
      GradCheckOptions options;
      options.allow_all_zero = ZeroSecondDerivative(c.name);
      auto plain = CheckSecondOrderGradients(
          [&](const VarList& in) { return c.op(in[0], in[1]); }, {a, b}, options);
      EXPECT_TRUE(plain) << c.name << " " << sa << " " << sb << ": " << plain;
      EXPECT_EQ(plain.all_zero, ZeroSecondDerivative(c.name)) << c.name;
    }
  }
}

TEST(ElementwiseTest, DivFusedAndDifferentiableVjpsAgree) {
  Var a(Uniform(Shape{2, 3, 4}, 0.5, 2.0, 51).value(), true);
  Var b(Uniform(Shape{3, 1}, 0.5, 2.0, 52).value(), true);
  Var probe = Normal(Shape{2, 3, 4}, 53);
  VarList plain = grad({sum(mul(div(a, b), probe))}, {a, b});
  VarList recorded =
      grad({sum(mul(div(a, b), probe))}, {a, b}, {}, {.retain_graph = true, .create_graph = true});
  EXPECT_LT(MaxAbsDiff(plain[1].value(), recorded[1].value()), 1e-13);
  EXPECT_LT(MaxAbsDiff(plain[0].value(), recorded[0].value()), 1e-13);
}

TEST(ElementwiseTest, MaximumTiesSendTheGradientToTheFirstOperand) {
  Var a(Tensor::FromVector(Shape{3}, {1.0, 2.0, 3.0}, DType::kFloat64), true);
  Var b(Tensor::FromVector(Shape{3}, {0.0, 2.0, 5.0}, DType::kFloat64), true);
  VarList g = grad({sum(maximum(a, b))}, {a, b});
  EXPECT_EQ(g[0].value().ToVector(), (std::vector<double>{1.0, 1.0, 0.0}));
  EXPECT_EQ(g[1].value().ToVector(), (std::vector<double>{0.0, 0.0, 1.0}));
}

TEST(ElementwiseTest, GradientOfAnInputThatNeedsNoneIsNotComputed) {
  Var a(Uniform(Shape{2, 3}, 0.5, 2.0, 61).value(), true);
  Var b = Uniform(Shape{3}, 0.5, 2.0, 62);  // a constant
  Var y = mul(a, b);
  VarList g = grad({sum(y)}, {a});
  ASSERT_TRUE(g[0].defined());
  for (int64_t i = 0; i < 6; ++i) EXPECT_DOUBLE_EQ(g[0].value().at(i), b.value().at(i % 3));
}

// ------------------------------------------------------------ operators

TEST(ElementwiseTest, OperatorsMatchTheNamedOps) {
  Var a = Uniform(Shape{2, 3}, 0.5, 2.0, 71);
  Var b = Uniform(Shape{3}, 0.5, 2.0, 72);
  auto same = [](const Var& x, const Var& y) { return MaxAbsDiff(x.value(), y.value()) == 0.0; };
  EXPECT_TRUE(same(a + b, add(a, b)));
  EXPECT_TRUE(same(a - b, sub(a, b)));
  EXPECT_TRUE(same(a * b, mul(a, b)));
  EXPECT_TRUE(same(a / b, div(a, b)));
  EXPECT_TRUE(same(-a, neg(a)));
  EXPECT_TRUE(same(a + 2.0, add_scalar(a, 2.0)));
  EXPECT_TRUE(same(2.0 + a, add_scalar(a, 2.0)));
  EXPECT_TRUE(same(a * 3.0, mul_scalar(a, 3.0)));
  EXPECT_TRUE(same(3.0 * a, mul_scalar(a, 3.0)));
  EXPECT_TRUE(same(2.0 / a, rdiv_scalar(2.0, a)));
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double v = a.value().at(i);
    EXPECT_EQ((a - 0.5).value().at(i), v - 0.5);
    EXPECT_EQ((0.5 - a).value().at(i), 0.5 - v);
    EXPECT_EQ((a / 3.0).value().at(i), v / 3.0);  // a true division
  }
}

TEST(ElementwiseTest, ScalarOperatorGradientsMatchFiniteDifferences) {
  Var x = Uniform(Shape{2, 3}, 0.5, 2.0, 73);
  auto r = CheckGradients(
      [](const VarList& in) { return (in[0] - 0.5) * (0.5 - in[0]) / 3.0 + 2.0 / in[0]; }, {x});
  EXPECT_TRUE(r) << r;
  auto r2 = CheckSecondOrderGradients(
      [](const VarList& in) { return square(in[0] / 3.0) + 1.0 / in[0]; }, {x});
  EXPECT_TRUE(r2) << r2;
}

// ------------------------------------------------------------ constants

TEST(ElementwiseTest, ConstantsHaveTheRightShapeDtypeAndNoGradient) {
  Var x = Uniform(Shape{2, 3}, 0, 1, 81, DType::kFloat32);
  Var s = scalar_like(x, 2.5);
  EXPECT_EQ(s.shape(), Shape{});
  EXPECT_EQ(s.dtype(), DType::kFloat32);
  EXPECT_EQ(s.item(), 2.5);
  EXPECT_FALSE(s.requires_grad());
  Var z = zeros_like(x);
  Var o = ones_like(x);
  EXPECT_EQ(z.shape(), x.shape());
  EXPECT_EQ(o.dtype(), DType::kFloat32);
  EXPECT_EQ(z.value().ToVector(), std::vector<double>(6, 0.0));
  EXPECT_EQ(o.value().ToVector(), std::vector<double>(6, 1.0));
  Var c = constant(x.value());
  EXPECT_FALSE(c.requires_grad());
  EXPECT_TRUE(c.value().SameStorage(x.value()));
}

// ---------------------------------------------------------------- errors

std::string ErrorMessage(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ElementwiseTest, NonBroadcastableShapesNameTheOpAndBothShapes) {
  Var a = Uniform(Shape{2, 3}, 0, 1, 91);
  Var b = Uniform(Shape{4}, 0, 1, 92);
  EXPECT_THROW(add(a, b), Error);
  for (const BinaryCase& c : BinaryCases()) {
    const std::string message = ErrorMessage([&] { c.op(a, b); });
    EXPECT_NE(message.find(c.name), std::string::npos) << message;
    EXPECT_NE(message.find("[2, 3]"), std::string::npos) << message;
    EXPECT_NE(message.find("[4]"), std::string::npos) << message;
  }
}

TEST(ElementwiseTest, MismatchedDtypesNameTheOpAndBothShapes) {
  Var a = Uniform(Shape{2, 3}, 0, 1, 93, DType::kFloat32);
  Var b = Uniform(Shape{3}, 0, 1, 94, DType::kFloat64);
  EXPECT_THROW(mul(a, b), Error);
  for (const BinaryCase& c : BinaryCases()) {
    const std::string message = ErrorMessage([&] { c.op(a, b); });
    EXPECT_NE(message.find(c.name), std::string::npos) << message;
    EXPECT_NE(message.find("float32"), std::string::npos) << message;
    EXPECT_NE(message.find("float64"), std::string::npos) << message;
    EXPECT_NE(message.find("[2, 3]"), std::string::npos) << message;
    EXPECT_NE(message.find("[3]"), std::string::npos) << message;
  }
}

// ------------------------------------------------------------- numerics

TEST(ElementwiseTest, SoftplusAndSigmoidAreStableAtLargeMagnitudes) {
  for (DType dtype : {DType::kFloat64, DType::kFloat32}) {
    Var x(Tensor::FromVector(Shape{2}, {100.0, -100.0}, dtype), true);
    Var y = softplus(x);
    EXPECT_EQ(y.value().at(0), 100.0) << ToString(dtype);
    EXPECT_GE(y.value().at(1), 0.0);
    EXPECT_LT(y.value().at(1), 1e-40);
    EXPECT_FALSE(HasNonFinite(y.value()));
    Var g = grad({sum(y)}, {x})[0];  // sigmoid(x)
    EXPECT_EQ(g.value().at(0), 1.0);
    EXPECT_GE(g.value().at(1), 0.0);
    EXPECT_LT(g.value().at(1), 1e-40);
    Var s = sigmoid(x);
    EXPECT_FALSE(HasNonFinite(s.value()));
    EXPECT_EQ(s.value().at(0), 1.0);
  }
  Var wide(Tensor::FromVector(Shape{2}, {800.0, -800.0}, DType::kFloat64));
  EXPECT_EQ(softplus(wide).value().at(0), 800.0);
  EXPECT_EQ(softplus(wide).value().at(1), 0.0);
}

TEST(ElementwiseTest, NonFiniteValuesPropagateAsIeeeValues) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Var x(Tensor::FromVector(Shape{4}, {inf, -inf, nan, 0.0}, DType::kFloat64));
  EXPECT_EQ(exp(x).value().at(0), inf);
  EXPECT_EQ(exp(x).value().at(1), 0.0);
  EXPECT_TRUE(std::isnan(exp(x).value().at(2)));
  EXPECT_EQ(log(x).value().at(3), -inf);
  EXPECT_TRUE(std::isnan(log(x).value().at(1)));
  EXPECT_TRUE(std::isnan(relu(x).value().at(2)));
  EXPECT_TRUE(std::isnan(sqrt(neg(x)).value().at(0)));
  EXPECT_EQ(rdiv_scalar(1.0, x).value().at(3), inf);
  EXPECT_EQ(tanh(x).value().at(0), 1.0);
  EXPECT_EQ(sigmoid(x).value().at(1), 0.0);
  EXPECT_EQ(softplus(x).value().at(0), inf);
  Var one = scalar_like(x, 1.0);
  EXPECT_TRUE(std::isnan(maximum(x, one).value().at(2)));
  EXPECT_TRUE(std::isnan(maximum(one, x).value().at(2)));
  EXPECT_TRUE(std::isnan(mul(x, scalar_like(x, 0.0)).value().at(0)));
}

// Each output element is computed on its own, so the thread count cannot
// change any bit of the result.
TEST(ElementwiseTest, ResultsAreIdenticalForOneAndTwoThreads) {
  const Shape big{4, 64, 1031};  // not a multiple of the chunk size
  Var a(Normal(big, 101).value(), true);
  Var row = Normal(Shape{1031}, 102);
  Var col = Normal(Shape{64, 1}, 103);
  auto run = [&](int threads) {
    ScopedNumThreads scoped(threads);
    Var y = gelu(add(mul(a, row), col));
    y = div(softplus(y), add_scalar(exp(mul_scalar(y, 0.1)), 1.0));
    Var g = grad({sum(mul(y, y))}, {a})[0];
    return std::make_pair(y.value(), g.value());
  };
  const auto [y1, g1] = run(1);
  const auto [y2, g2] = run(2);
  ASSERT_EQ(y1.numel(), big.numel());
  EXPECT_EQ(std::memcmp(y1.data<double>(), y2.data<double>(), y1.nbytes()), 0);
  EXPECT_EQ(std::memcmp(g1.data<double>(), g2.data<double>(), g1.nbytes()), 0);
}

// The adjoint iterations of an implicit layer take many VJPs through one
// retained graph; gelu keeps the derivative it computed with its value. Every
// call must still give g * gelu'(x), bitwise equal to a fresh graph's VJP.
TEST(ElementwiseOpsTest, GeluRepeatedVjpsThroughOneGraphMatchAFreshGraph) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    const Var x(Uniform(Shape{7, 33}, -4.0, 4.0, 11, dtype).value(), true);
    const Var y = gelu(x);
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      const Var g = Normal(Shape{7, 33}, seed, dtype);
      const Var repeated = grad({y}, {x}, {g}, {.retain_graph = true})[0];
      const Var x_fresh(x.value(), true);
      const Var fresh = grad({gelu(x_fresh)}, {x_fresh}, {g})[0];
      for (int64_t i = 0; i < fresh.numel(); ++i) {
        ASSERT_EQ(repeated.value().at(i), fresh.value().at(i))
            << ToString(dtype) << ", call " << seed << ", entry " << i;
      }
      const double x0 = x.value().at(5);
      const double expected =
          g.value().at(5) * (GeluFormula(x0 + 1e-6) - GeluFormula(x0 - 1e-6)) / 2e-6;
      EXPECT_NEAR(repeated.value().at(5), expected, 1e-4 * (1.0 + std::abs(expected)));
    }
  }
}

// A recorded gelu computes gelu'(x) together with its value; the values and
// the VJP must be bitwise those of the separate kernels (VecGelu, and
// VecGeluBackward = g * gelu'(x)), tails shorter than a packet included, for
// one and two threads.
TEST(ElementwiseOpsTest, GeluRecordedValueAndVjpMatchTheSeparateKernelsBitwise) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    // 3 x 7001 entries: several tasks, and a tail of 5 after the last packet.
    const Var x(Uniform(Shape{3, 7001}, -12.0, 12.0, 12, dtype).value(), true);
    const Var g = Normal(Shape{3, 7001}, 13, dtype);
    Tensor expected_y(x.shape(), dtype), expected_dx(x.shape(), dtype);
    DispatchDType(dtype, [&](auto zero) {
      using T = decltype(zero);
      internal::VecGelu(x.value().data<T>(), expected_y.data<T>(), x.numel());
      internal::VecGeluBackward(g.value().data<T>(), x.value().data<T>(), expected_dx.data<T>(),
                                x.numel());
    });
    for (int threads : {1, 2}) {
      ScopedNumThreads scoped(threads);
      const Var y = gelu(x);
      const Var dx = grad({y}, {x}, {g})[0];
      EXPECT_EQ(MaxAbsDiff(y.value(), expected_y), 0.0)
          << ToString(dtype) << ", " << threads << " threads";
      EXPECT_EQ(MaxAbsDiff(dx.value(), expected_dx), 0.0)
          << ToString(dtype) << ", " << threads << " threads";
      NoGrad no_grad;
      EXPECT_EQ(MaxAbsDiff(gelu(x).value(), expected_y), 0.0);
    }
  }
}

}  // namespace
}  // namespace stillpoint::ops_elementwise_test
