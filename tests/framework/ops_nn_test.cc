// Fused row ops: logsumexp, softmax, log_softmax, layer_norm,
// layer_norm_of_sum and cross_entropy. Values, numerical stability, -inf entries, first and second
// order gradients (both the fused and the differentiable VJP), float32,
// errors and independence from the thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "framework/gradcheck.h"
#include "framework/ops.h"
#include "framework/parallel.h"
#include "framework/random.h"

namespace stillpoint::ops_nn_test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

Var Random(const Shape& shape, uint64_t seed, DType dtype = DType::kFloat64, double stddev = 1.0) {
  Rng rng(seed);
  return Var(RandomNormal(shape, 0.0, stddev, dtype, rng));
}

Var Values(const Shape& shape, const std::vector<double>& values, bool requires_grad = false) {
  return Var(Tensor::FromVector(shape, values, DType::kFloat64), requires_grad);
}

std::string ErrorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void ExpectErrorMentions(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  const std::string message = ErrorOf(fn);
  ASSERT_FALSE(message.empty()) << "no stillpoint::Error was thrown";
  for (const std::string& part : parts) {
    EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
  }
}

// ---------------------------------------------------------------- logsumexp

TEST(LogSumExpTest, KnownValue) {
  Var lse = logsumexp(Values(Shape{3}, {0.0, 1.0, 3.0}));
  EXPECT_EQ(lse.shape(), Shape{});
  EXPECT_NEAR(lse.item(), 3.1698460196, 1e-9);
}

TEST(LogSumExpTest, KeepdimShapeAndLargeInputs) {
  Var x = Values(Shape{2, 2}, {1000.0, 1000.0, -1000.0, -kInf});
  Var lse = logsumexp(x, /*keepdim=*/true);
  ASSERT_EQ(lse.shape(), (Shape{2, 1}));
  EXPECT_NEAR(lse.value().at(0), 1000.0 + std::log(2.0), 1e-9);
  EXPECT_NEAR(lse.value().at(1), -1000.0, 1e-9);
}

TEST(LogSumExpTest, Gradients) {
  auto f = [](const VarList& in) { return logsumexp(in[0]); };
  auto r = CheckGradients(f, {Random(Shape{2, 3, 5}, 1)});
  EXPECT_TRUE(r) << r;
  auto fk = [](const VarList& in) { return logsumexp(in[0], true); };
  auto rk = CheckGradients(fk, {Random(Shape{2, 3, 5}, 2)});
  EXPECT_TRUE(rk) << rk;
  auto r2 = CheckSecondOrderGradients(f, {Random(Shape{2, 3, 5}, 3)});
  EXPECT_TRUE(r2) << r2;
}

// ------------------------------------------------------------------ softmax

TEST(SoftmaxTest, RowsSumToOneAndStableForLargeInputs) {
  Var x = Random(Shape{3, 4, 7}, 4);
  Var big = add_scalar(x, 1000.0);
  Var p = softmax(x);
  Var p_big = softmax(big);
  EXPECT_FALSE(HasNonFinite(p_big.value()));
  for (int64_t r = 0; r < 12; ++r) {
    double s = 0.0;
    for (int64_t i = 0; i < 7; ++i) s += p.value().at(r * 7 + i);
    EXPECT_NEAR(s, 1.0, 1e-12);
  }
  // Softmax is shift invariant.
  EXPECT_LT(MaxAbsDiff(p.value(), p_big.value()), 1e-12);
  Var ls_big = log_softmax(big);
  EXPECT_FALSE(HasNonFinite(ls_big.value()));
  EXPECT_LT(MaxAbsDiff(log_softmax(x).value(), ls_big.value()), 1e-10);
}

TEST(SoftmaxTest, RowWithSomeNegativeInfinityEntries) {
  Var x = Values(Shape{1, 3}, {-kInf, 0.0, std::log(3.0)}, true);
  Var p = softmax(x);
  EXPECT_EQ(p.value().at(0), 0.0);
  EXPECT_NEAR(p.value().at(1), 0.25, 1e-15);
  EXPECT_NEAR(p.value().at(2), 0.75, 1e-15);
  Var lp = log_softmax(x);
  EXPECT_EQ(lp.value().at(0), -kInf);
  EXPECT_NEAR(lp.value().at(1), std::log(0.25), 1e-15);
  // Gradients stay finite.
  backward(sum(mul(p, Values(Shape{1, 3}, {1.0, 2.0, 3.0}))));
  EXPECT_FALSE(HasNonFinite(x.grad().value()));
  EXPECT_EQ(x.grad().value().at(0), 0.0);
}

TEST(SoftmaxTest, LogSoftmaxIsLogOfSoftmax) {
  Var x = Random(Shape{2, 3, 5}, 5);
  Var expected = log(softmax(x));
  EXPECT_LT(MaxAbsDiff(log_softmax(x).value(), expected.value()), 1e-12);
}

TEST(SoftmaxTest, Gradients) {
  for (auto op : {&softmax, &log_softmax}) {
    auto f = [op](const VarList& in) { return op(in[0]); };
    auto r = CheckGradients(f, {Random(Shape{2, 3, 5}, 6)});
    EXPECT_TRUE(r) << r;
    auto r2 = CheckSecondOrderGradients(f, {Random(Shape{2, 3, 5}, 7)});
    EXPECT_TRUE(r2) << r2;
  }
}

TEST(SoftmaxTest, FusedAndDifferentiableBackwardAgree) {
  Var x(Random(Shape{4, 6}, 8).value(), true);
  Var probe = Random(Shape{4, 6}, 9);
  for (auto op : {&softmax, &log_softmax}) {
    Var loss = sum(mul(op(x), probe));
    VarList fused = grad({loss}, {x}, {}, {.retain_graph = true});
    VarList composite = grad({loss}, {x}, {}, {.create_graph = true});
    EXPECT_LT(MaxAbsDiff(fused[0].value(), composite[0].value()), 1e-14);
  }
}

TEST(SoftmaxTest, Float32MatchesFloat64) {
  Var x64 = Random(Shape{5, 9}, 10, DType::kFloat64, 3.0);
  Var x32(x64.value().To(DType::kFloat32));
  EXPECT_EQ(softmax(x32).dtype(), DType::kFloat32);
  EXPECT_LT(MaxAbsDiff(softmax(x32).value().To(DType::kFloat64), softmax(x64).value()), 1e-6);
  EXPECT_LT(MaxAbsDiff(log_softmax(x32).value().To(DType::kFloat64), log_softmax(x64).value()),
            1e-5);
  EXPECT_LT(MaxAbsDiff(logsumexp(x32).value().To(DType::kFloat64), logsumexp(x64).value()), 1e-5);
}

TEST(SoftmaxTest, BitwiseIndependentOfThreadCount) {
  Var x(Random(Shape{64, 48, 33}, 11, DType::kFloat32).value(), true);
  Var probe = Random(Shape{64, 48, 33}, 12, DType::kFloat32);
  Tensor value[2], gradient[2];
  for (int threads : {1, 2}) {
    ScopedNumThreads scoped(threads);
    Var p = softmax(x);
    value[threads - 1] = p.value();
    gradient[threads - 1] = grad({sum(mul(p, probe))}, {x})[0].value();
  }
  EXPECT_EQ(MaxAbsDiff(value[0], value[1]), 0.0);
  EXPECT_EQ(MaxAbsDiff(gradient[0], gradient[1]), 0.0);
}

TEST(SoftmaxTest, ScalarInputIsAnError) {
  ExpectErrorMentions([] { softmax(Var(Tensor::Scalar(1.0, DType::kFloat64))); },
                      {"softmax", "[]"});
}

// --------------------------------------------------------------- layer_norm

TEST(LayerNormTest, RowsHaveZeroMeanAndUnitVariance) {
  Var x = add_scalar(Random(Shape{3, 4, 16}, 13, DType::kFloat64, 5.0), 2.0);
  Var y = layer_norm(x, Var(), Var(), 1e-5);
  for (int64_t r = 0; r < 12; ++r) {
    double mean = 0.0, var = 0.0;
    for (int64_t i = 0; i < 16; ++i) mean += y.value().at(r * 16 + i);
    mean /= 16;
    for (int64_t i = 0; i < 16; ++i) var += std::pow(y.value().at(r * 16 + i) - mean, 2);
    var /= 16;
    EXPECT_NEAR(mean, 0.0, 1e-12);
    EXPECT_NEAR(var, 1.0, 1e-5);  // eps makes it slightly less than 1
  }
}

TEST(LayerNormTest, GainAndBiasApplyPerFeature) {
  Var x = Values(Shape{1, 2}, {1.0, 3.0});
  Var gain = Values(Shape{2}, {2.0, 3.0});
  Var bias = Values(Shape{2}, {0.5, -0.5});
  Var y = layer_norm(x, gain, bias, 0.0);
  // xhat = (-1, 1).
  EXPECT_NEAR(y.value().at(0), -1.5, 1e-15);
  EXPECT_NEAR(y.value().at(1), 2.5, 1e-15);
}

TEST(LayerNormTest, GradientsWithAndWithoutGainAndBias) {
  auto plain = [](const VarList& in) { return layer_norm(in[0], Var(), Var(), 1e-5); };
  auto r = CheckGradients(plain, {Random(Shape{2, 3, 5}, 14)});
  EXPECT_TRUE(r) << r;
  auto full = [](const VarList& in) { return layer_norm(in[0], in[1], in[2], 1e-5); };
  auto r_full = CheckGradients(
      full, {Random(Shape{2, 3, 5}, 15), Random(Shape{5}, 16), Random(Shape{5}, 17)});
  EXPECT_TRUE(r_full) << r_full;
  auto gain_only = [](const VarList& in) { return layer_norm(in[0], in[1], Var(), 1e-5); };
  auto r_gain = CheckGradients(gain_only, {Random(Shape{4, 6}, 18), Random(Shape{6}, 19)});
  EXPECT_TRUE(r_gain) << r_gain;
}

TEST(LayerNormTest, SecondOrderGradients) {
  auto full = [](const VarList& in) { return layer_norm(in[0], in[1], in[2], 1e-5); };
  auto r = CheckSecondOrderGradients(
      full, {Random(Shape{3, 4}, 20), Random(Shape{4}, 21), Random(Shape{4}, 22)});
  EXPECT_TRUE(r) << r;
  auto plain = [](const VarList& in) { return layer_norm(in[0], Var(), Var(), 1e-5); };
  auto r_plain = CheckSecondOrderGradients(plain, {Random(Shape{2, 2, 5}, 23)});
  EXPECT_TRUE(r_plain) << r_plain;
}

TEST(LayerNormTest, FusedAndDifferentiableBackwardAgree) {
  // More rows than one reduction block, so the blocked gain/bias sums are used.
  Var x(Random(Shape{70, 8}, 24).value(), true);
  Var gain(Random(Shape{8}, 25).value(), true);
  Var bias(Random(Shape{8}, 26).value(), true);
  Var loss = sum(mul(layer_norm(x, gain, bias), Random(Shape{70, 8}, 27)));
  VarList fused = grad({loss}, {x, gain, bias}, {}, {.retain_graph = true});
  VarList composite = grad({loss}, {x, gain, bias}, {}, {.create_graph = true});
  for (int i = 0; i < 3; ++i) {
    EXPECT_LT(MaxAbsDiff(fused[i].value(), composite[i].value()), 1e-11) << "input " << i;
  }
}

TEST(LayerNormTest, BitwiseIndependentOfThreadCount) {
  Var x(Random(Shape{300, 64}, 28, DType::kFloat32).value(), true);
  Var gain(Random(Shape{64}, 29, DType::kFloat32).value(), true);
  Var probe = Random(Shape{300, 64}, 30, DType::kFloat32);
  Tensor results[2][2];
  for (int threads : {1, 2}) {
    ScopedNumThreads scoped(threads);
    Var y = layer_norm(x, gain, Var());
    VarList g = grad({sum(mul(y, probe))}, {x, gain});
    results[threads - 1][0] = g[0].value();
    results[threads - 1][1] = g[1].value();
  }
  EXPECT_EQ(MaxAbsDiff(results[0][0], results[1][0]), 0.0);
  EXPECT_EQ(MaxAbsDiff(results[0][1], results[1][1]), 0.0);
}

// Float rows of 1 to 8 whole SIMD packets are normalised in registers, all
// other rows by a generic loop. These widths give 1 to 8 packets whatever
// the build's packet (4, 8 or 16 floats), and more, for the generic path:
// values and gradients against the same computation in float64.
TEST(LayerNormTest, FloatRowsOfEveryWidthMatchFloat64) {
  const std::vector<int64_t> widths = {4, 8, 12, 16, 20, 24, 28, 32, 48, 64, 80, 96, 112, 128, 131};
  for (const int64_t n : widths) {
    // 70 rows: more than two blocks of the gain and bias sums, and a partial one.
    const Shape shape{70, n};
    const VarList parts64 = {Random(shape, 60 + n), Random(shape, 61 + n), Random(shape, 62 + n)};
    const Var gain64 = Random(Shape{n}, 63 + n), bias64 = Random(Shape{n}, 64 + n);
    const Var probe64 = Random(shape, 65 + n);
    auto as_float = [](const Var& v) { return Var(v.value().To(DType::kFloat32), true); };
    for (std::size_t count : {1, 3}) {
      for (const bool affine : {false, true}) {
        // One part: layer_norm; three: layer_norm_of_sum.
        auto run = [&](DType dtype) {
          VarList parts;
          for (std::size_t k = 0; k < count; ++k) {
            parts.push_back(dtype == DType::kFloat32 ? as_float(parts64[k])
                                                     : Var(parts64[k].value(), true));
          }
          const Var gain = dtype == DType::kFloat32 ? as_float(gain64) : Var(gain64.value(), true);
          const Var bias = dtype == DType::kFloat32 ? as_float(bias64) : Var(bias64.value(), true);
          const Var y = layer_norm_of_sum(parts, affine ? gain : Var(), affine ? bias : Var());
          VarList inputs = parts;
          if (affine) inputs.insert(inputs.end(), {gain, bias});
          VarList grads = grad({sum(mul(y, Var(probe64.value().To(dtype))))}, inputs);
          grads.insert(grads.begin(), y);
          return grads;
        };
        const VarList single = run(DType::kFloat32);
        const VarList reference = run(DType::kFloat64);
        ASSERT_EQ(single.size(), reference.size());
        for (std::size_t i = 0; i < single.size(); ++i) {
          // Gain and bias gradients sum 70 rows; the rest are per row.
          const double tolerance = i == 0 ? 1e-5 : (affine && i > count ? 1e-3 : 1e-4);
          EXPECT_LT(MaxAbsDiff(single[i].value().To(DType::kFloat64), reference[i].value()),
                    tolerance)
              << "width " << n << ", " << count << " parts, gain and bias " << affine << ", output "
              << i << " (0: y, then the inputs' gradients)";
        }
      }
    }
  }
}

TEST(LayerNormTest, BadParameterShapeOrDType) {
  Var x = Random(Shape{2, 5}, 31);
  ExpectErrorMentions([&] { layer_norm(x, Random(Shape{4}, 32), Var()); },
                      {"layer_norm", "[4]", "[2, 5]"});
  ExpectErrorMentions([&] { layer_norm(x, Var(), Random(Shape{5}, 33, DType::kFloat32)); },
                      {"layer_norm", "float32", "float64"});
}

// -------------------------------------------------------- layer_norm_of_sum

// The unfused computation layer_norm_of_sum stands for.
Var AddThenLayerNorm(const VarList& parts, const Var& gain, const Var& bias, double eps = 1e-5) {
  Var x = parts[0];
  for (std::size_t k = 1; k < parts.size(); ++k) x = add(x, parts[k]);
  return layer_norm(x, gain, bias, eps);
}

Var Leaf(const Shape& shape, uint64_t seed, DType dtype) {
  return Var(Random(shape, seed, dtype).value(), /*requires_grad=*/true);
}

TEST(LayerNormOfSumTest, ValuesEqualAddThenLayerNormBitwise) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    // 3 x 37 = 111 rows of 67: rows not a multiple of a packet or of a task.
    const VarList parts = {Leaf(Shape{3, 37, 67}, 40, dtype), Leaf(Shape{3, 37, 67}, 41, dtype),
                           Leaf(Shape{3, 37, 67}, 42, dtype)};
    const Var gain = Leaf(Shape{67}, 43, dtype);
    const Var bias = Leaf(Shape{67}, 44, dtype);
    for (std::size_t count : {2, 3}) {
      const VarList some(parts.begin(), parts.begin() + count);
      const Tensor expected = AddThenLayerNorm(some, gain, bias).value();
      // Recording (the sum is kept for backward) and not (normalised in place).
      EXPECT_EQ(MaxAbsDiff(layer_norm_of_sum(some, gain, bias).value(), expected), 0.0)
          << ToString(dtype) << ", " << count << " parts";
      NoGrad no_grad;
      EXPECT_EQ(MaxAbsDiff(layer_norm_of_sum(some, gain, bias).value(), expected), 0.0)
          << ToString(dtype) << ", " << count << " parts, no grad";
      EXPECT_EQ(MaxAbsDiff(layer_norm_of_sum(some, gain, Var()).value(),
                           AddThenLayerNorm(some, gain, Var()).value()),
                0.0);
      EXPECT_EQ(MaxAbsDiff(layer_norm_of_sum(some, Var(), bias).value(),
                           AddThenLayerNorm(some, Var(), bias).value()),
                0.0);
      EXPECT_EQ(MaxAbsDiff(layer_norm_of_sum(some, Var(), Var(), 0.0).value(),
                           AddThenLayerNorm(some, Var(), Var(), 0.0).value()),
                0.0);
    }
  }
}

TEST(LayerNormOfSumTest, OnePartIsLayerNorm) {
  const Var x = Leaf(Shape{4, 6}, 45, DType::kFloat64);
  const Var gain = Leaf(Shape{6}, 46, DType::kFloat64);
  EXPECT_EQ(
      MaxAbsDiff(layer_norm_of_sum({x}, gain, Var()).value(), layer_norm(x, gain, Var()).value()),
      0.0);
}

TEST(LayerNormOfSumTest, GradientsEqualAddThenLayerNormBitwise) {
  // More rows than one reduction block, so the blocked gain/bias sums are used.
  const DType dtype = DType::kFloat32;
  const VarList parts = {Leaf(Shape{5, 19, 64}, 47, dtype), Leaf(Shape{5, 19, 64}, 48, dtype),
                         Leaf(Shape{5, 19, 64}, 49, dtype)};
  const Var gain = Leaf(Shape{64}, 50, dtype);
  const Var bias = Leaf(Shape{64}, 51, dtype);
  const Var probe = Random(Shape{5, 19, 64}, 52, dtype);
  const VarList inputs = {parts[0], parts[1], parts[2], gain, bias};
  const VarList fused = grad({sum(mul(layer_norm_of_sum(parts, gain, bias), probe))}, inputs);
  const VarList unfused = grad({sum(mul(AddThenLayerNorm(parts, gain, bias), probe))}, inputs);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    ASSERT_TRUE(fused[i].defined()) << "input " << i;
    EXPECT_EQ(MaxAbsDiff(fused[i].value(), unfused[i].value()), 0.0) << "input " << i;
  }
}

TEST(LayerNormOfSumTest, GradientsMatchFiniteDifferences) {
  auto full = [](const VarList& in) {
    return layer_norm_of_sum({in[0], in[1], in[2]}, in[3], in[4], 1e-5);
  };
  auto r = CheckGradients(
      full, {Random(Shape{2, 3, 5}, 53), Random(Shape{2, 3, 5}, 54), Random(Shape{2, 3, 5}, 55),
             Random(Shape{5}, 56), Random(Shape{5}, 57)});
  EXPECT_TRUE(r) << r;
  auto plain = [](const VarList& in) { return layer_norm_of_sum({in[0], in[1]}, Var(), Var()); };
  auto r_plain = CheckGradients(plain, {Random(Shape{4, 6}, 58), Random(Shape{4, 6}, 59)});
  EXPECT_TRUE(r_plain) << r_plain;
}

TEST(LayerNormOfSumTest, SecondOrderGradients) {
  auto full = [](const VarList& in) {
    return layer_norm_of_sum({in[0], in[1], in[2]}, in[3], in[4], 1e-5);
  };
  auto r = CheckSecondOrderGradients(
      full, {Random(Shape{3, 4}, 60), Random(Shape{3, 4}, 61), Random(Shape{3, 4}, 62),
             Random(Shape{4}, 63), Random(Shape{4}, 64)});
  EXPECT_TRUE(r) << r;
  auto plain = [](const VarList& in) { return layer_norm_of_sum({in[0], in[1]}, Var(), Var()); };
  auto r_plain =
      CheckSecondOrderGradients(plain, {Random(Shape{2, 2, 5}, 65), Random(Shape{2, 2, 5}, 66)});
  EXPECT_TRUE(r_plain) << r_plain;
}

TEST(LayerNormOfSumTest, FusedAndDifferentiableBackwardAgree) {
  const VarList parts = {Leaf(Shape{70, 8}, 67, DType::kFloat64),
                         Leaf(Shape{70, 8}, 68, DType::kFloat64)};
  const Var gain = Leaf(Shape{8}, 69, DType::kFloat64);
  const Var bias = Leaf(Shape{8}, 70, DType::kFloat64);
  const Var loss = sum(mul(layer_norm_of_sum(parts, gain, bias), Random(Shape{70, 8}, 71)));
  const VarList inputs = {parts[0], parts[1], gain, bias};
  const VarList fused = grad({loss}, inputs, {}, {.retain_graph = true});
  const VarList composite = grad({loss}, inputs, {}, {.create_graph = true});
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    EXPECT_LT(MaxAbsDiff(fused[i].value(), composite[i].value()), 1e-11) << "input " << i;
  }
}

// Every part receives the same gradient Var. That is safe because the engine
// accumulates into fresh tensors: a later backward into one part leaves the
// other's gradient alone.
TEST(LayerNormOfSumTest, SharedPartGradientIsNeverMutated) {
  Var a = Leaf(Shape{6, 5}, 72, DType::kFloat64);
  Var b = Leaf(Shape{6, 5}, 73, DType::kFloat64);
  const Var probe = Random(Shape{6, 5}, 74);
  backward(sum(mul(layer_norm_of_sum({a, b}, Var(), Var()), probe)));
  const Tensor dx = a.grad().value().Clone();
  EXPECT_EQ(MaxAbsDiff(b.grad().value(), dx), 0.0);
  backward(sum(mul(a, probe)));  // a.grad += probe
  EXPECT_EQ(MaxAbsDiff(b.grad().value(), dx), 0.0);
  EXPECT_EQ(MaxAbsDiff(a.grad().value(), add(Var(dx), probe).value()), 0.0);
  // A part given twice gets both shares, as with add(a, a).
  const VarList twice = grad({sum(mul(layer_norm_of_sum({a, a}, Var(), Var()), probe))}, {a});
  const VarList reference = grad({sum(mul(layer_norm(add(a, a), Var(), Var()), probe))}, {a});
  EXPECT_EQ(MaxAbsDiff(twice[0].value(), reference[0].value()), 0.0);
  // The differentiable (create_graph) VJP counts a repeated part twice too, not more.
  const VarList twice_recorded = grad({sum(mul(layer_norm_of_sum({a, a}, Var(), Var()), probe))},
                                      {a}, {}, {.create_graph = true});
  EXPECT_LT(MaxAbsDiff(twice_recorded[0].value(), reference[0].value()), 1e-12);
}

TEST(LayerNormOfSumTest, OnlyRequestedGradientsAreComputed) {
  Var a = Leaf(Shape{3, 4}, 75, DType::kFloat64);
  const Var b = Random(Shape{3, 4}, 76);  // a constant
  Var gain = Leaf(Shape{4}, 77, DType::kFloat64);
  const VarList g = grad({sum(square(layer_norm_of_sum({a, b}, gain, Var())))}, {a, gain});
  const VarList reference = grad({sum(square(AddThenLayerNorm({a, b}, gain, Var())))}, {a, gain});
  EXPECT_EQ(MaxAbsDiff(g[0].value(), reference[0].value()), 0.0);
  EXPECT_EQ(MaxAbsDiff(g[1].value(), reference[1].value()), 0.0);
}

TEST(LayerNormOfSumTest, BitwiseIndependentOfThreadCount) {
  // Enough rows (and reduction blocks) to be split across two threads.
  const DType dtype = DType::kFloat32;
  const VarList parts = {Leaf(Shape{1100, 64}, 78, dtype), Leaf(Shape{1100, 64}, 79, dtype),
                         Leaf(Shape{1100, 64}, 80, dtype)};
  const Var gain = Leaf(Shape{64}, 81, dtype);
  const Var bias = Leaf(Shape{64}, 82, dtype);
  const Var probe = Random(Shape{1100, 64}, 83, dtype);
  const VarList inputs = {parts[0], parts[1], parts[2], gain, bias};
  std::vector<Tensor> results[2];
  for (int threads : {1, 2}) {
    ScopedNumThreads scoped(threads);
    const Var y = layer_norm_of_sum(parts, gain, bias);
    results[threads - 1].push_back(y.value());
    for (const Var& g : grad({sum(mul(y, probe))}, inputs)) {
      results[threads - 1].push_back(g.value());
    }
  }
  ASSERT_EQ(results[0].size(), results[1].size());
  for (std::size_t k = 0; k < results[0].size(); ++k) {
    EXPECT_EQ(MaxAbsDiff(results[0][k], results[1][k]), 0.0) << "result " << k;
  }
}

TEST(LayerNormOfSumTest, BadPartsOrParameters) {
  const Var x = Random(Shape{2, 5}, 84);
  ExpectErrorMentions([&] { layer_norm_of_sum({}, Var(), Var()); },
                      {"layer_norm_of_sum", "at least one part"});
  ExpectErrorMentions(
      [&] {
        layer_norm_of_sum({x, Random(Shape{2, 4}, 85)}, Var(), Var());
      },
      {"layer_norm_of_sum", "part 1", "[2, 4]", "[2, 5]"});
  ExpectErrorMentions(
      [&] {
        layer_norm_of_sum({x, Random(Shape{5}, 86)}, Var(), Var());
      },
      {"layer_norm_of_sum", "[5]", "[2, 5]"});
  ExpectErrorMentions(
      [&] {
        layer_norm_of_sum({x, x, Random(Shape{2, 5}, 87, DType::kFloat32)}, Var(), Var());
      },
      {"layer_norm_of_sum", "part 2", "float32", "float64"});
  ExpectErrorMentions(
      [&] {
        layer_norm_of_sum({x, Var()}, Var(), Var());
      },
      {"layer_norm_of_sum", "part 1", "undefined"});
  ExpectErrorMentions(
      [&] {
        layer_norm_of_sum({x, x}, Random(Shape{4}, 88), Var());
      },
      {"layer_norm_of_sum", "gain", "[4]", "[2, 5]"});
  ExpectErrorMentions(
      [&] {
        layer_norm_of_sum({x, x}, Var(), Random(Shape{5}, 89, DType::kFloat32));
      },
      {"layer_norm_of_sum", "bias", "float32", "float64"});
  const Var scalar(Tensor::Scalar(1.0, DType::kFloat64));
  ExpectErrorMentions(
      [&] {
        layer_norm_of_sum({scalar, scalar}, Var(), Var());
      },
      {"layer_norm_of_sum", "[]"});
  ExpectErrorMentions(
      [&] {
        layer_norm_of_sum({x, x}, Var(), Var(), -1.0);
      },
      {"layer_norm_of_sum", "eps"});
}

// ------------------------------------------------------------ cross_entropy

TEST(CrossEntropyTest, EqualsMeanNegativeLogSoftmaxOfTargets) {
  Var logits = Random(Shape{2, 3, 4}, 34, DType::kFloat64, 2.0);
  const std::vector<int64_t> targets = {3, 0, -1, 1, 2, 2};
  Var loss = cross_entropy(logits, targets);
  EXPECT_EQ(loss.shape(), Shape{});
  Var ls = log_softmax(logits);
  double expected = 0.0;
  int kept = 0;
  for (int64_t r = 0; r < 6; ++r) {
    if (targets[r] == -1) continue;
    expected -= ls.value().at(r * 4 + targets[r]);
    ++kept;
  }
  EXPECT_NEAR(loss.item(), expected / kept, 1e-12);
}

TEST(CrossEntropyTest, CustomIgnoreIndexAndAllIgnored) {
  Var logits = Random(Shape{3, 5}, 35);
  Var a = cross_entropy(logits, {1, 7, 4}, 7);
  Var b = cross_entropy(slice(logits, 0, 0, 1), {1});
  Var c = cross_entropy(slice(logits, 0, 2, 3), {4});
  EXPECT_NEAR(a.item(), 0.5 * (b.item() + c.item()), 1e-12);
  Var x(logits.value(), true);
  Var none = cross_entropy(x, {-1, -1, -1});
  EXPECT_EQ(none.item(), 0.0);
  backward(none);
  EXPECT_EQ(MaxAbsDiff(x.grad().value(), Tensor::Zeros(Shape{3, 5}, DType::kFloat64)), 0.0);
}

TEST(CrossEntropyTest, GradientsWithAnIgnoredRow) {
  const std::vector<int64_t> targets = {2, -1, 0, 4, 1, 1};
  auto f = [targets](const VarList& in) { return cross_entropy(in[0], targets); };
  auto r = CheckGradients(f, {Random(Shape{2, 3, 5}, 36)});
  EXPECT_TRUE(r) << r;
  auto r2 = CheckSecondOrderGradients(f, {Random(Shape{2, 3, 5}, 37)});
  EXPECT_TRUE(r2) << r2;
}

TEST(CrossEntropyTest, FusedAndDifferentiableBackwardAgree) {
  Var x(Random(Shape{5, 7}, 38).value(), true);
  Var loss = mul_scalar(cross_entropy(x, {6, -1, 0, 3, 3}), 1.7);
  VarList fused = grad({loss}, {x}, {}, {.retain_graph = true});
  VarList composite = grad({loss}, {x}, {}, {.create_graph = true});
  EXPECT_LT(MaxAbsDiff(fused[0].value(), composite[0].value()), 1e-14);
  // An ignored row gets no gradient; a kept row's gradient sums to zero.
  double kept_row = 0.0;
  for (int64_t i = 0; i < 7; ++i) {
    EXPECT_EQ(fused[0].value().at(7 + i), 0.0);
    kept_row += fused[0].value().at(i);
  }
  EXPECT_NEAR(kept_row, 0.0, 1e-14);
}

TEST(CrossEntropyTest, StableForLargeLogitsInFloat32) {
  Var logits(Tensor::FromVector(Shape{2, 3}, {1000, 0, -1000, 50, 1050, 1000}, DType::kFloat32));
  Var loss = cross_entropy(logits, {0, 2});
  EXPECT_EQ(loss.dtype(), DType::kFloat32);
  // Row 0: ~0; row 1: 50 + log(1 + e^-50).
  EXPECT_NEAR(loss.item(), 0.5 * 50.0, 1e-4);
}

TEST(CrossEntropyTest, BadTargets) {
  Var logits = Random(Shape{2, 3, 4}, 39);
  ExpectErrorMentions(
      [&] {
        cross_entropy(logits, {0, 1, 4, 0, 0, 0});
      },
      {"cross_entropy", "4", "[2, 3, 4]"});
  ExpectErrorMentions(
      [&] {
        cross_entropy(logits, {0, 1});
      },
      {"cross_entropy", "2 targets", "[2, 3, 4]"});
  ExpectErrorMentions([&] { cross_entropy(logits, {0, 1, -2, 0, 0, 0}); }, {"cross_entropy", "-2"});
}

}  // namespace
}  // namespace stillpoint::ops_nn_test
