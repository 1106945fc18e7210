// Explicit multi-head attention against a direct float64 computation of
// softmax(Q K^T / sqrt(dh)) V per head, written with plain loops (no ops),
// with and without causal and key masks.
#include "layers/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "framework/ops.h"
#include "framework/random.h"

namespace stillpoint::attention_test {
namespace {

constexpr DType kF64 = DType::kFloat64;

// Row-major [rows, cols] matrix helpers on std::vector<double>.
std::vector<double> Affine(
    const std::vector<double>& x, int64_t rows, int64_t in, const Tensor& w, const Tensor& b) {
  const int64_t out = w.dim(1);
  std::vector<double> y(rows * out);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      double acc = b.at(o);
      for (int64_t i = 0; i < in; ++i) acc += x[r * in + i] * w.at(i * out + o);
      y[r * out + o] = acc;
    }
  }
  return y;
}

// The reference: x [T, d] of one sample -> [T, d]. hidden(i, j) says whether
// query i may not see key j.
template <typename Hidden>
std::vector<double> ReferenceAttention(const MultiHeadAttention& layer,
                                       const std::vector<double>& x,
                                       int64_t length,
                                       double scale,
                                       Hidden hidden) {
  const int64_t d = layer.dim();
  const int64_t dh = layer.head_dim();
  const std::vector<double> q =
      Affine(x, length, d, layer.wq()->weight().value(), layer.wq()->bias().value());
  const std::vector<double> k =
      Affine(x, length, d, layer.wk()->weight().value(), layer.wk()->bias().value());
  const std::vector<double> v =
      Affine(x, length, d, layer.wv()->weight().value(), layer.wv()->bias().value());
  std::vector<double> merged(length * d, 0.0);
  for (int64_t h = 0; h < layer.heads(); ++h) {
    for (int64_t i = 0; i < length; ++i) {
      std::vector<double> scores(length);
      double max_score = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < length; ++j) {
        double dot = 0;
        for (int64_t c = 0; c < dh; ++c) dot += q[i * d + h * dh + c] * k[j * d + h * dh + c];
        scores[j] = hidden(i, j) ? -std::numeric_limits<double>::infinity() : dot * scale;
        max_score = std::max(max_score, scores[j]);
      }
      double total = 0;
      for (double& s : scores) {
        s = std::exp(s - max_score);
        total += s;
      }
      for (int64_t c = 0; c < dh; ++c) {
        double acc = 0;
        for (int64_t j = 0; j < length; ++j) acc += scores[j] / total * v[j * d + h * dh + c];
        merged[i * d + h * dh + c] = acc;
      }
    }
  }
  return Affine(merged, length, d, layer.wo()->weight().value(), layer.wo()->bias().value());
}

struct Fixture {
  Rng rng{21};
  MultiHeadAttention layer;
  Var x;
  Fixture(
      bool causal, int64_t batch, int64_t length, int64_t dim, int64_t heads, double scale = 0.0)
      : layer(dim, heads, rng, {.causal = causal, .scale = scale, .dtype = kF64}) {
    // Non-zero biases so the reference exercises them.
    for (Var& p : layer.parameters()) {
      Tensor noise = RandomNormal(p.shape(), 0.0, 0.5, kF64, rng);
      for (int64_t i = 0; i < noise.numel(); ++i) p.mutable_value().set(i, noise.at(i));
    }
    x = Var(RandomNormal({batch, length, dim}, 0.0, 1.0, kF64, rng));
  }
  std::vector<double> Sample(int64_t b) const {
    const int64_t n = x.dim(1) * x.dim(2);
    std::vector<double> all = x.value().ToVector();
    return std::vector<double>(all.begin() + b * n, all.begin() + (b + 1) * n);
  }
};

void ExpectMatches(const Tensor& actual, int64_t b, const std::vector<double>& expected) {
  const int64_t n = static_cast<int64_t>(expected.size());
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::abs(actual.at(b * n + i) - expected[i]));
  }
  EXPECT_LT(worst, 1e-12) << "sample " << b;
}

TEST(AttentionReferenceTest, NonCausalMatchesDirectComputation) {
  Fixture f(/*causal=*/false, 3, 5, 8, 2);
  EXPECT_DOUBLE_EQ(f.layer.scale(), 1.0 / std::sqrt(4.0));
  const Tensor y = f.layer.Forward(f.x).value();
  ASSERT_EQ(y.shape(), Shape({3, 5, 8}));
  for (int64_t b = 0; b < 3; ++b) {
    ExpectMatches(y, b, ReferenceAttention(f.layer, f.Sample(b), 5, 0.5, [](int64_t, int64_t) {
                    return false;
                  }));
  }
}

TEST(AttentionReferenceTest, CausalMatchesDirectComputationAndIgnoresTheFuture) {
  Fixture f(/*causal=*/true, 2, 6, 8, 4);
  const double scale = 1.0 / std::sqrt(2.0);
  const Tensor y = f.layer.Forward(f.x).value();
  for (int64_t b = 0; b < 2; ++b) {
    ExpectMatches(y, b,
                  ReferenceAttention(f.layer, f.Sample(b), 6, scale,
                                     [](int64_t i, int64_t j) { return j > i; }));
  }
  // Changing the last token leaves every earlier output unchanged.
  Tensor changed = f.x.value().Clone();
  for (int64_t c = 0; c < 8; ++c) changed.set(5 * 8 + c, 10.0);
  const Tensor y2 = f.layer.Forward(Var(changed)).value();
  for (int64_t i = 0; i < 5 * 8; ++i) EXPECT_EQ(y.at(i), y2.at(i));
  EXPECT_GT(std::abs(y.at(5 * 8) - y2.at(5 * 8)), 1e-6);
}

TEST(AttentionReferenceTest, KeyMaskAndAdditiveMaskMatchDirectComputation) {
  Fixture f(/*causal=*/false, 2, 4, 6, 3);
  const double scale = 1.0 / std::sqrt(2.0);
  AttentionMask mask;
  mask.key_mask = Tensor::FromVector({2, 4}, {0, 1, 0, 0, 0, 0, 1, 1}, DType::kFloat32);
  const Tensor y = f.layer.Forward(f.x, mask).value();
  ExpectMatches(y, 0, ReferenceAttention(f.layer, f.Sample(0), 4, scale, [](int64_t, int64_t j) {
                  return j == 1;
                }));
  ExpectMatches(y, 1, ReferenceAttention(f.layer, f.Sample(1), 4, scale, [](int64_t, int64_t j) {
                  return j >= 2;
                }));
  // An additive -inf mask is the same as the boolean one.
  AttentionMask additive;
  Tensor bias = Tensor::Zeros({2, 1, 1, 4}, kF64);
  const double inf = std::numeric_limits<double>::infinity();
  bias.set(1, -inf);
  bias.set(4 + 2, -inf);
  bias.set(4 + 3, -inf);
  additive.additive = bias;
  EXPECT_LT(MaxAbsDiff(y, f.layer.Forward(f.x, additive).value()), 1e-15);
}

TEST(AttentionReferenceTest, CustomScaleIsUsed) {
  Fixture f(/*causal=*/false, 1, 4, 4, 2, /*scale=*/0.2);
  const Tensor y = f.layer.Forward(f.x).value();
  ExpectMatches(y, 0, ReferenceAttention(f.layer, f.Sample(0), 4, 0.2, [](int64_t, int64_t) {
                  return false;
                }));
}

TEST(AttentionReferenceTest, Float32AgreesWithFloat64) {
  Fixture f(/*causal=*/true, 2, 5, 8, 2);
  Rng rng(3);
  MultiHeadAttention single(8, 2, rng, {.causal = true});
  NamedTensors values;
  for (const auto& [name, p] : f.layer.named_parameters()) values.emplace_back(name, p.value());
  single.LoadParameters(values);
  const Tensor y32 = single.Forward(Var(f.x.value().To(DType::kFloat32))).value();
  const Tensor y64 = f.layer.Forward(f.x).value();
  EXPECT_LT(MaxAbsDiff(y32.To(kF64), y64), 1e-4);
}

}  // namespace
}  // namespace stillpoint::attention_test
