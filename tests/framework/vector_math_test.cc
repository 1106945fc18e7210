// The vectorised float32 kernels against float64 libm (relative error about
// 1e-6 or better), special values, and independence from an element's
// position (tails shorter than a SIMD packet take the same code path).
#include "framework/kernels/vector_math.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace stillpoint::internal::vector_math_test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
// Room for eight special inputs in whole packets: a packet load or store
// on a shorter array would run past its end when a packet holds 16.
constexpr int64_t kSpecialFloats = (8 + kVecBlock - 1) / kVecBlock * kVecBlock;

std::vector<float> Grid(float lo, float hi, int n) {
  std::vector<float> x(n);
  for (int i = 0; i < n; ++i) x[i] = lo + (hi - lo) * static_cast<float>(i) / (n - 1);
  return x;
}

// max over i of |y[i] - ref(x[i])| / max(|ref(x[i])|, floor).
template <typename Ref>
double MaxRelError(const std::vector<float>& x,
                   const std::vector<float>& y,
                   Ref ref,
                   double floor = 1e-30) {
  double worst = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double r = ref(static_cast<double>(x[i]));
    worst = std::max(worst, std::abs(y[i] - r) / std::max(std::abs(r), floor));
  }
  return worst;
}

TEST(VectorMathTest, ExpIsAccurate) {
  const std::vector<float> x = Grid(-87.0f, 88.0f, 100003);
  std::vector<float> y(x.size());
  VecExp(x.data(), y.data(), static_cast<int64_t>(x.size()));
  EXPECT_LT(MaxRelError(x, y, [](double v) { return std::exp(v); }), 1e-6);
}

TEST(VectorMathTest, TanhAndSigmoidAreAccurate) {
  const std::vector<float> x = Grid(-20.0f, 20.0f, 100003);
  std::vector<float> y(x.size());
  VecTanh(x.data(), y.data(), static_cast<int64_t>(x.size()));
  EXPECT_LT(MaxRelError(x, y, [](double v) { return std::tanh(v); }), 1e-6);
  VecSigmoid(x.data(), y.data(), static_cast<int64_t>(x.size()));
  EXPECT_LT(MaxRelError(x, y, [](double v) { return StableSigmoid(v); }), 1e-6);
}

TEST(VectorMathTest, GeluAndItsDerivativeAreAccurate) {
  const std::vector<float> x = Grid(-9.0f, 9.0f, 100003);
  const std::vector<float> ones(x.size(), 1.0f);
  std::vector<float> y(x.size());
  const int64_t n = static_cast<int64_t>(x.size());
  // Relative to max(|value|, 0.1): gelu and gelu' cross 0 inside the range.
  VecGelu(x.data(), y.data(), n);
  const auto gelu = [](double v) { return GeluValue(v); };
  EXPECT_LT(MaxRelError(x, y, gelu, 0.1), 2e-6);
  VecGeluBackward(ones.data(), x.data(), y.data(), n);
  const auto derivative = [](double v) { return GeluDerivative(v); };
  EXPECT_LT(MaxRelError(x, y, derivative, 0.1), 2e-6);
  // The gradient scales with g.
  const std::vector<float> twos(x.size(), 2.0f);
  std::vector<float> y2(x.size());
  VecGeluBackward(twos.data(), x.data(), y2.data(), n);
  for (int64_t i = 0; i < n; i += 997) EXPECT_EQ(y2[i], 2.0f * y[i]) << x[i];
}

// linear_gelu maps each block of its product in place: out = x must give
// what separate buffers give, in float (packets and the padded tail) and in
// double.
TEST(VectorMathTest, GeluWithDerivativeInPlaceMatchesSeparateBuffers) {
  const std::vector<float> x = Grid(-6.0f, 6.0f, 1003);  // 1003 = 125 packets + a tail of 3
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> y(x.size()), d(x.size()), d_in_place(x.size());
  VecGeluWithDerivative(x.data(), y.data(), d.data(), n);
  std::vector<float> in_place = x;
  VecGeluWithDerivative(in_place.data(), in_place.data(), d_in_place.data(), n);
  EXPECT_EQ(in_place, y);
  EXPECT_EQ(d_in_place, d);
  std::vector<double> xd(x.begin(), x.end());
  std::vector<double> yd(xd.size()), dd(xd.size()), dd_in_place(xd.size());
  VecGeluWithDerivative(xd.data(), yd.data(), dd.data(), n);
  VecGeluWithDerivative(xd.data(), xd.data(), dd_in_place.data(), n);
  EXPECT_EQ(xd, yd);
  EXPECT_EQ(dd_in_place, dd);
}

TEST(VectorMathTest, SpecialValues) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> x = {-kInf, -1000.0f, -88.5f, 0.0f, 100.0f, kInf, nan};
  std::vector<float> y(x.size());
  VecExp(x.data(), y.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(y[0], 0.0f);  // masked entries get weight exactly 0
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_LT(y[2], 1e-37f);
  EXPECT_EQ(y[3], 1.0f);
  EXPECT_EQ(y[4], kInf);
  EXPECT_EQ(y[5], kInf);
  EXPECT_TRUE(std::isnan(y[6]));
  VecSigmoid(x.data(), y.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[3], 0.5f);
  EXPECT_EQ(y[5], 1.0f);
  VecTanh(x.data(), y.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(y[0], -1.0f);
  EXPECT_EQ(y[3], 0.0f);
  EXPECT_EQ(y[5], 1.0f);
}

TEST(VectorMathTest, ResultDoesNotDependOnPosition) {
  // The same inputs at every offset and length (full packets and tails).
  const std::vector<float> base = Grid(-4.0f, 4.0f, 37);
  std::vector<float> reference(base.size());
  VecGelu(base.data(), reference.data(), static_cast<int64_t>(base.size()));
  for (int64_t offset = 0; offset < 9; ++offset) {
    for (int64_t length = 1; length + offset <= static_cast<int64_t>(base.size()); length += 5) {
      std::vector<float> y(length);
      VecGelu(base.data() + offset, y.data(), length);
      for (int64_t i = 0; i < length; ++i) {
        ASSERT_EQ(y[i], reference[offset + i]) << "offset " << offset << " length " << length;
      }
    }
  }
}

TEST(VectorMathTest, ExpShiftedReturnsTheSum) {
  const std::vector<float> x = Grid(-3.0f, 2.0f, 19);
  std::vector<float> y(x.size());
  const float sum = VecExpShifted(x.data(), 2.0f, y.data(), static_cast<int64_t>(x.size()));
  float expected = 0.0f;
  for (std::size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(y[i], std::exp(static_cast<double>(x[i]) - 2.0), 1e-6 * y[i]) << i;
    expected += y[i];
  }
  EXPECT_NEAR(sum, expected, 1e-6 * expected);
  EXPECT_EQ(y.back(), 1.0f);
}

TEST(VectorMathTest, ExpFlushIsAccurateAndFlushesBelowTheNormalRange) {
  namespace ei = Eigen::internal;
  const std::vector<float> x = Grid(kExpFloatNormalLowest, 88.0f, 4001);
  for (std::size_t i = 0; i + kVecBlock <= x.size(); i += kVecBlock) {
    float y[kVecBlock];
    ei::pstoreu(y, ExpFlushPacket(ei::ploadu<FloatPacket>(x.data() + i)));
    for (int64_t l = 0; l < kVecBlock; ++l) {
      const double exact = std::exp(static_cast<double>(x[i + l]));
      ASSERT_NEAR(y[l], exact, 3e-7 * exact) << "x = " << x[i + l];
    }
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  // Eight cases, zero-padded to whole packets (16 floats with AVX-512).
  float special[kSpecialFloats] = {-inf, -100.0f, -87.4f, nan, 0.0f, -1e-30f, -87.3f, 1.0f};
  float y[kSpecialFloats];
  for (int64_t i = 0; i < kSpecialFloats; i += kVecBlock) {
    ei::pstoreu(y + i, ExpFlushPacket(ei::ploadu<FloatPacket>(special + i)));
  }
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_EQ(y[2], 0.0f);
  EXPECT_TRUE(std::isnan(y[3]));
  EXPECT_EQ(y[4], 1.0f);
  EXPECT_EQ(y[5], 1.0f);
  for (int i : {6, 7}) {
    const double exact = std::exp(static_cast<double>(special[i]));
    EXPECT_NEAR(y[i], exact, 3e-7 * exact) << special[i];
  }
}

TEST(VectorMathTest, Exp2FlushIsAccurateOnTheNonPositiveRangeAndFlushesBelowIt) {
  namespace ei = Eigen::internal;
  // Every float in a dense sweep of [-126, 0], and the points where the
  // range reduction switches m (half-integers) from both sides.
  std::vector<float> x = Grid(kExp2FloatNormalLowest, 0.0f, 200001);
  for (float m = -125.5f; m < 0.0f; m += 1.0f) {
    x.push_back(m);
    x.push_back(std::nextafter(m, 0.0f));
    x.push_back(std::nextafter(m, -200.0f));
  }
  while (x.size() % kVecBlock != 0) x.push_back(0.0f);
  double worst = 0.0;
  for (std::size_t i = 0; i < x.size(); i += kVecBlock) {
    float y[kVecBlock];
    ei::pstoreu(y, Exp2FlushPacket(ei::ploadu<FloatPacket>(x.data() + i)));
    for (int64_t l = 0; l < kVecBlock; ++l) {
      const double exact = std::exp2(static_cast<double>(x[i + l]));
      worst = std::max(worst, std::abs(y[l] - exact) / exact);
    }
  }
  // About one unit in the last place (2^-23 = 1.19e-7), as ExpFlushPacket.
  EXPECT_LT(worst, 1.5e-7);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float special[kSpecialFloats] = {-kInf, -1000.0f, -126.001f, nan, 0.0f, -1e-30f, -126.0f, -0.5f};
  float y[kSpecialFloats];
  for (int64_t i = 0; i < kSpecialFloats; i += kVecBlock) {
    ei::pstoreu(y + i, Exp2FlushPacket(ei::ploadu<FloatPacket>(special + i)));
  }
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_EQ(y[2], 0.0f);
  EXPECT_TRUE(std::isnan(y[3]));
  EXPECT_EQ(y[4], 1.0f);  // the largest entry of a softmax row is exactly 1
  EXPECT_EQ(y[5], 1.0f);
  EXPECT_EQ(y[6], std::numeric_limits<float>::min());  // 2^-126, still normal
  EXPECT_NEAR(y[7], std::sqrt(0.5), 1.5e-7 * std::sqrt(0.5));
}

TEST(VectorMathTest, Exp2ShiftedReturnsTheSumAndScaledMatchesIt) {
  std::vector<float> x = Grid(-30.0f, 2.0f, 45);
  x[7] = -kInf;  // a masked score
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> y(x.size());
  const float sum = VecExp2Shifted(x.data(), 2.0f, y.data(), n);
  float expected = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    // Against 2^ of the float difference (what the kernel exponentiates).
    EXPECT_NEAR(y[i], std::exp2(static_cast<double>(x[i] - 2.0f)), 1.5e-7 * y[i]) << i;
    expected += y[i];
  }
  EXPECT_EQ(y[7], 0.0f);
  EXPECT_EQ(y.back(), 1.0f);
  EXPECT_NEAR(sum, expected, 1e-6 * expected);
  // The one-pass recomputation is, entry by entry, the exponential times
  // the scale (tails included).
  const float scale = 1.0f / sum;
  for (int64_t length : {n, n - 3, int64_t{5}}) {
    std::vector<float> z(length);
    VecExp2ShiftedScaled(x.data(), 2.0f, scale, z.data(), length);
    for (int64_t i = 0; i < length; ++i) ASSERT_EQ(z[i], y[i] * scale) << i << " of " << length;
  }
}

TEST(VectorMathTest, MaxOverPacketsAndTail) {
  for (int n : {1, 7, 8, 9, 23, 64}) {
    std::vector<float> x = Grid(-5.0f, 3.0f, std::max(n, 2));
    x.resize(n);
    x[n / 2] = 11.0f;
    EXPECT_EQ(VecMax(x.data(), n), 11.0f) << n;
    x.back() = 12.0f;
    EXPECT_EQ(VecMax(x.data(), n), 12.0f) << n;
  }
  const std::vector<float> hidden(10, -kInf);
  EXPECT_EQ(VecMax(hidden.data(), 10), -kInf);
}

TEST(VectorMathTest, DoubleKeepsLibm) {
  const double x[3] = {-2.5, 0.3, 4.0};
  double y[3];
  VecTanh(x, y, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(y[i], std::tanh(x[i]));
  VecExp(x, y, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(y[i], std::exp(x[i]));
}

}  // namespace
}  // namespace stillpoint::internal::vector_math_test
