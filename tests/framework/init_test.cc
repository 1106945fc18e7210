#include "framework/init.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace stillpoint::init_test {
namespace {

struct Moments {
  double mean = 0.0;
  double variance = 0.0;
  double min = 0.0;
  double max = 0.0;
};

Moments ComputeMoments(const Tensor& t) {
  const std::vector<double> v = t.ToVector();
  Moments m;
  m.min = v.empty() ? 0.0 : v[0];
  m.max = m.min;
  for (const double x : v) {
    m.mean += x;
    m.min = std::min(m.min, x);
    m.max = std::max(m.max, x);
  }
  m.mean /= static_cast<double>(v.size());
  for (const double x : v) m.variance += (x - m.mean) * (x - m.mean);
  m.variance /= static_cast<double>(v.size());
  return m;
}

// The checks below use n = 200 * 300 = 60000 draws. The standard error of
// the sample mean is sigma / sqrt(n) ~ 0.004 sigma and that of the sample
// variance ~ sqrt(2 / n) ~ 0.006 relative (normal) or less (uniform), so a
// 3% relative band on the variance and 0.02 sigma on the mean are > 3
// standard errors while still catching a wrong formula (a factor of 2 or 3).
constexpr int64_t kIn = 200;
constexpr int64_t kOut = 300;
constexpr double kVarianceTolerance = 0.03;
constexpr double kMeanTolerance = 0.02;

class InitTest : public ::testing::TestWithParam<DType> {};

TEST_P(InitTest, XavierUniformBoundsAndVariance) {
  Rng rng(11);
  Tensor w(Shape{kIn, kOut}, GetParam());
  init::XavierUniform(w, rng);
  const double bound = std::sqrt(6.0 / (kIn + kOut));
  const Moments m = ComputeMoments(w);
  EXPECT_GE(m.min, -bound);
  EXPECT_LE(m.max, bound);
  // The draws reach close to both ends of the interval.
  EXPECT_LT(m.min, -0.99 * bound);
  EXPECT_GT(m.max, 0.99 * bound);
  const double variance = 2.0 / (kIn + kOut);
  EXPECT_NEAR(m.variance, variance, kVarianceTolerance * variance);
  EXPECT_NEAR(m.mean, 0.0, kMeanTolerance * std::sqrt(variance));
}

TEST_P(InitTest, XavierNormalVarianceWithGain) {
  Rng rng(12);
  const double gain = init::Gain(init::Nonlinearity::kTanh);
  Tensor w = init::XavierNormal({kIn, kOut}, GetParam(), rng, gain);
  EXPECT_EQ(w.dtype(), GetParam());
  const Moments m = ComputeMoments(w);
  const double variance = gain * gain * 2.0 / (kIn + kOut);
  EXPECT_NEAR(m.variance, variance, kVarianceTolerance * variance);
  EXPECT_NEAR(m.mean, 0.0, kMeanTolerance * std::sqrt(variance));
}

TEST_P(InitTest, KaimingUniformUsesFanInAndReluGain) {
  Rng rng(13);
  Tensor w(Shape{kIn, kOut}, GetParam());
  init::KaimingUniform(w, rng);
  const double bound = std::sqrt(2.0) * std::sqrt(3.0 / kIn);
  const Moments m = ComputeMoments(w);
  EXPECT_GE(m.min, -bound);
  EXPECT_LE(m.max, bound);
  EXPECT_LT(m.min, -0.99 * bound);
  const double variance = 2.0 / kIn;
  EXPECT_NEAR(m.variance, variance, kVarianceTolerance * variance);
}

TEST_P(InitTest, KaimingNormalUsesFanIn) {
  Rng rng(14);
  // Leading axes are independent matrices: the fans are those of [in, out].
  Tensor w(Shape{3, kIn / 2, kOut / 3 * 2}, GetParam());
  init::KaimingNormal(w, rng, 1.0);
  const Moments m = ComputeMoments(w);
  const double variance = 1.0 / (kIn / 2);
  EXPECT_NEAR(m.variance, variance, kVarianceTolerance * variance);
  EXPECT_NEAR(m.mean, 0.0, kMeanTolerance * std::sqrt(variance));
}

TEST_P(InitTest, UniformAndNormalMoments) {
  Rng rng(15);
  Tensor u(Shape{kIn, kOut}, GetParam());
  init::Uniform(u, 2.0, 5.0, rng);
  const Moments mu = ComputeMoments(u);
  EXPECT_GE(mu.min, 2.0);
  EXPECT_LE(mu.max, 5.0);
  EXPECT_NEAR(mu.mean, 3.5, kMeanTolerance * std::sqrt(0.75));
  EXPECT_NEAR(mu.variance, 9.0 / 12.0, kVarianceTolerance * 0.75);

  Tensor n(Shape{kIn, kOut}, GetParam());
  init::Normal(n, -1.0, 0.5, rng);
  const Moments mn = ComputeMoments(n);
  EXPECT_NEAR(mn.mean, -1.0, kMeanTolerance * 0.5);
  EXPECT_NEAR(mn.variance, 0.25, kVarianceTolerance * 0.25);
}

TEST_P(InitTest, ConstantsFillEveryElement) {
  Tensor t(Shape{3, 4}, GetParam());
  init::Constant(t, -2.5);
  for (const double x : t.ToVector()) EXPECT_EQ(x, -2.5);
  init::Ones(t);
  for (const double x : t.ToVector()) EXPECT_EQ(x, 1.0);
  init::Zeros(t);
  for (const double x : t.ToVector()) EXPECT_EQ(x, 0.0);
}

INSTANTIATE_TEST_SUITE_P(DTypes,
                         InitTest,
                         ::testing::Values(DType::kFloat32, DType::kFloat64),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(ToString(info.param));
                         });

TEST(InitSeedTest, SameSeedSameValuesDifferentSeedsDiffer) {
  Rng a(42), b(42), c(43);
  Tensor ta(Shape{16, 8}, DType::kFloat64), tb(Shape{16, 8}, DType::kFloat64),
      tc(Shape{16, 8}, DType::kFloat64);
  init::XavierUniform(ta, a);
  init::XavierUniform(tb, b);
  init::XavierUniform(tc, c);
  EXPECT_EQ(MaxAbsDiff(ta, tb), 0.0);
  EXPECT_GT(MaxAbsDiff(ta, tc), 0.01);
  // The generator advanced: a second draw from the same Rng differs.
  init::XavierUniform(tb, b);
  EXPECT_GT(MaxAbsDiff(ta, tb), 0.01);
}

TEST(InitSeedTest, MatchesRandomUniformAndRandomNormalStreams) {
  Rng a(5), b(5);
  Tensor t(Shape{4, 6}, DType::kFloat32);
  init::Uniform(t, -0.3, 0.7, a);
  EXPECT_EQ(MaxAbsDiff(t, RandomUniform(t.shape(), -0.3, 0.7, DType::kFloat32, b)), 0.0);
  init::Normal(t, 1.0, 2.0, a);
  EXPECT_EQ(MaxAbsDiff(t, RandomNormal(t.shape(), 1.0, 2.0, DType::kFloat32, b)), 0.0);
}

TEST(InitSeedTest, WritesIntoViewsOnly) {
  Tensor t = Tensor::Zeros({4, 3}, DType::kFloat64);
  Tensor rows = t.SliceRows(1, 3);
  Rng rng(1);
  init::Uniform(rows, 1.0, 2.0, rng);
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(t.at(i), 0.0);   // row 0 untouched
  for (int64_t i = 3; i < 9; ++i) EXPECT_GE(t.at(i), 1.0);   // rows 1, 2 written
  for (int64_t i = 9; i < 12; ++i) EXPECT_EQ(t.at(i), 0.0);  // row 3 untouched
}

TEST(InitFansTest, FansOfWeights) {
  const init::Fans fans = init::ComputeFans(Shape{7, 5});
  EXPECT_EQ(fans.fan_in, 7);
  EXPECT_EQ(fans.fan_out, 5);
  const init::Fans stacked = init::ComputeFans(Shape{2, 3, 7, 5});
  EXPECT_EQ(stacked.fan_in, 7);
  EXPECT_EQ(stacked.fan_out, 5);
  EXPECT_THROW(init::ComputeFans(Shape{5}), Error);
  EXPECT_THROW(init::ComputeFans(Shape{}), Error);
}

TEST(InitFansTest, GainsAndNames) {
  EXPECT_DOUBLE_EQ(init::Gain(init::Nonlinearity::kRelu), std::sqrt(2.0));
  EXPECT_DOUBLE_EQ(init::Gain(init::Nonlinearity::kTanh), 5.0 / 3.0);
  EXPECT_DOUBLE_EQ(init::Gain(init::Nonlinearity::kLinear), 1.0);
  init::Nonlinearity parsed = init::Nonlinearity::kLinear;
  ASSERT_TRUE(init::StringToNonlinearity("tanh", &parsed));
  EXPECT_EQ(parsed, init::Nonlinearity::kTanh);
  EXPECT_STREQ(init::ToString(init::Nonlinearity::kRelu), "relu");
  EXPECT_FALSE(init::StringToNonlinearity("swish", &parsed));
}

TEST(InitErrorsTest, RejectsMisuse) {
  Rng rng(0);
  Tensor bias(Shape{8}, DType::kFloat32);
  try {
    init::XavierUniform(bias, rng);
    ADD_FAILURE() << "expected an Error for a rank-1 tensor";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("[8]"), std::string::npos) << error.what();
  }
  Tensor w(Shape{2, 2}, DType::kFloat32);
  EXPECT_THROW(init::Uniform(w, 1.0, 0.0, rng), Error);
  EXPECT_THROW(init::Normal(w, 0.0, -1.0, rng), Error);
  EXPECT_THROW(init::KaimingNormal(w, rng, -1.0), Error);
  Tensor undefined;
  EXPECT_THROW(init::Zeros(undefined), Error);
}

TEST(InitErrorsTest, EmptyWeightIsLeftAlone) {
  Rng rng(0);
  Tensor w(Shape{0, 4}, DType::kFloat32);
  init::KaimingUniform(w, rng);  // fan_in 0 would divide by zero; nothing to fill
  EXPECT_EQ(w.numel(), 0);
  Rng fresh(0);
  EXPECT_EQ(rng.NextU64(), fresh.NextU64());  // no draws were made
}

}  // namespace
}  // namespace stillpoint::init_test
