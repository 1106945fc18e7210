// The Hopfield map (framework/ops_hopfield.h): the differentiable op is the
// composition the layer uses, bitwise; the values-only kernels agree with it
// (float64 to rounding, float32 to float32 rounding); its gradients match
// finite differences; stored patterns are fixed points with energy and
// nearest pattern as computed directly; bad shapes are errors.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "framework/gradcheck.h"
#include "framework/ops_hopfield.h"
#include "framework/init.h"
#include "framework/ops.h"
#include "framework/random.h"

namespace stillpoint::ops_hopfield_test {
namespace {

Tensor RandomTensor(const Shape& shape, uint64_t seed, DType dtype = DType::kFloat64) {
  Rng rng(seed);
  return RandomNormal(shape, 0.0, 1.0, dtype, rng);
}

// N patterns of +-1/sqrt(d) (unit norm), drawn from seed.
Tensor SignPatterns(int64_t n, int64_t d, uint64_t seed, DType dtype) {
  Rng rng(seed);
  std::vector<double> values(n * d);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (double& v : values) v = rng.UniformInt(2) == 0 ? -scale : scale;
  return Tensor::FromVector(Shape{n, d}, values, dtype);
}

double LargestDifference(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const std::vector<double> x = a.ToVector();
  const std::vector<double> y = b.ToVector();
  double worst = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
  return worst;
}

// softmax(beta xi X^T + mask) X written out with the ops.
Var Composed(const Var& xi, const Var& patterns, const Var& beta, const Var& mask = Var()) {
  Var scores = mul(matmul(xi, patterns, false, true), beta);
  if (mask.defined()) scores = add(scores, mask);
  return matmul(softmax(scores), patterns);
}

TEST(HopfieldUpdateTest, RecordedUpdateIsTheComposedOpsBitwise) {
  // [B, H, N, dk] states and keys, one beta per head, a mask: the layer's case.
  const Var xi(RandomTensor(Shape{2, 3, 5, 4}, 1), true);
  const Var keys(RandomTensor(Shape{2, 3, 7, 4}, 2), true);
  const Var beta(Tensor::FromVector(Shape{1, 3, 1, 1}, {0.5, 1.0, 2.0}, DType::kFloat64), true);
  const Var mask(RandomTensor(Shape{2, 3, 5, 7}, 3));
  const Var out = hopfield_update(xi, keys, beta, mask);
  EXPECT_TRUE(out.requires_grad());
  EXPECT_EQ(out.value().ToVector(), Composed(xi, keys, beta, mask).value().ToVector());
}

TEST(HopfieldUpdateTest, ValuesOnlyPathAgreesWithTheComposedOps) {
  for (DType dtype : {DType::kFloat64, DType::kFloat32}) {
    SCOPED_TRACE(ToString(dtype));
    const Tensor patterns = SignPatterns(40, 16, 4, dtype);
    // 30 queries: more than one query block of the float32 kernel.
    const Tensor queries = RandomTensor(Shape{30, 16}, 5, dtype);
    const Var beta(Tensor::Scalar(4.0, dtype));
    Tensor reference;
    {
      // A grad-requiring input takes the composed path.
      const Var xi(queries, true);
      reference = hopfield_update(xi, constant(patterns), beta).value();
    }
    NoGrad no_grad;
    const Var fast = hopfield_update(constant(queries), constant(patterns), beta);
    EXPECT_FALSE(fast.requires_grad());
    Tensor into(queries.shape(), dtype);
    HopfieldUpdateInto(patterns, 4.0, queries, &into);
    EXPECT_EQ(fast.value().ToVector(), into.ToVector());
    // Outputs are convex combinations of unit-norm patterns (entries
    // <= 0.25): float32 rounding of N = 40 terms stays well below 1e-5.
    EXPECT_LT(LargestDifference(into, reference), dtype == DType::kFloat64 ? 1e-14 : 1e-5);
  }
}

TEST(HopfieldUpdateTest, GradientsMatchFiniteDifferences) {
  const Var xi(RandomTensor(Shape{2, 3, 4}, 6));
  const Var patterns(RandomTensor(Shape{2, 5, 4}, 7));
  const Var beta(Tensor::Scalar(0.7, DType::kFloat64));
  const Var mask(RandomTensor(Shape{2, 3, 5}, 8));
  const auto result = CheckGradients(
      [](const VarList& in) { return hopfield_update(in[0], in[1], in[2], in[3]); },
      {xi, patterns, beta, mask});
  EXPECT_TRUE(result) << result;
}

TEST(HopfieldUpdateTest, StoredPatternsAreFixedPointsWithTheirEnergy) {
  const double beta = 32.0;
  const Tensor patterns = SignPatterns(24, 32, 9, DType::kFloat64);
  Tensor out(patterns.shape(), DType::kFloat64);
  HopfieldUpdateInto(patterns, beta, patterns, &out);
  // Separated patterns at large beta retrieve themselves.
  EXPECT_LT(LargestDifference(out, patterns), 1e-3);

  std::vector<int64_t> nearest;
  std::vector<double> energy;
  HopfieldNearestAndEnergy(patterns, beta, out, &nearest, &energy);
  ASSERT_EQ(nearest.size(), 24u);
  ASSERT_EQ(energy.size(), 24u);
  const std::vector<double> x = patterns.ToVector();
  const std::vector<double> xi = out.ToVector();
  for (int64_t r = 0; r < 24; ++r) {
    EXPECT_EQ(nearest[r], r);
    // E = 1/2 |xi|^2 - (1/beta) log sum_j exp(beta <x_j, xi>), directly.
    double norm = 0.0, sum = 0.0;
    for (int64_t k = 0; k < 32; ++k) norm += xi[r * 32 + k] * xi[r * 32 + k];
    for (int64_t j = 0; j < 24; ++j) {
      double dot = 0.0;
      for (int64_t k = 0; k < 32; ++k) dot += x[j * 32 + k] * xi[r * 32 + k];
      sum += std::exp(beta * dot);
    }
    EXPECT_NEAR(energy[r], 0.5 * norm - std::log(sum) / beta, 1e-12);
  }
}

TEST(HopfieldUpdateTest, MismatchedShapesAreErrors) {
  const Tensor patterns = SignPatterns(4, 8, 10, DType::kFloat64);
  const Tensor queries = RandomTensor(Shape{3, 6}, 11);
  Tensor out(queries.shape(), DType::kFloat64);
  EXPECT_THROW(HopfieldUpdateInto(patterns, 1.0, queries, &out), Error);
  std::vector<int64_t> nearest;
  std::vector<double> energy;
  EXPECT_THROW(HopfieldNearestAndEnergy(patterns, 1.0, queries, &nearest, &energy), Error);
}

}  // namespace
}  // namespace stillpoint::ops_hopfield_test
