// The fused EM update (framework/em_update.h): its value and every input's
// gradient agree with the composed ops, with the value term's -|v|^2 / 2
// included (float64 to rounding, float32 to float32 rounding, masked keys
// included); its gradients match central differences in float64; second
// derivatives go through the composed form; results do not depend on the
// thread count; shapes it does not fuse fall back to the composed ops.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "framework/em_update.h"
#include "framework/gradcheck.h"
#include "framework/init.h"
#include "framework/ops.h"
#include "framework/parallel.h"
#include "framework/random.h"

namespace stillpoint {
namespace {

Tensor RandomTensor(const Shape& shape, uint64_t seed, DType dtype = DType::kFloat64) {
  Rng rng(seed);
  return RandomNormal(shape, 0.0, 1.0, dtype, rng);
}

double LargestDifference(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const std::vector<double> x = a.ToVector();
  const std::vector<double> y = b.ToVector();
  double worst = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
  return worst;
}

// The update as probabilistic attention wrote it before the fused op:
// softmax(logits + beta (v mu^T - |v|^2 / 2)) mu.
Var Composed(const Var& v, const Var& logits, const Var& mu, const Var& beta) {
  Var value_term = sub(matmul(v, mu, false, true), mul_scalar(sum(square(v), -1, true), 0.5));
  return matmul(softmax(add(logits, mul(beta, value_term))), mu);
}

struct Inputs {
  Var v, logits, mu, beta;
  VarList All() const { return {v, logits, mu, beta}; }
};

// [B, H, N, dv] states, [B, H, S, dv] values, [B, H, N, S] logits with a
// causal -inf mask when masked, one beta per head.
Inputs MakeInputs(DType dtype, bool masked) {
  const int64_t b = 2, h = 3, n = 5, s = 6, d = 4;
  Tensor logits = RandomTensor(Shape{b, h, n, s}, 2, dtype);
  if (masked) {
    std::vector<double> values = logits.ToVector();
    for (int64_t u = 0; u < b * h; ++u) {
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = i + 2; j < s; ++j) {
          values[(u * n + i) * s + j] = -std::numeric_limits<double>::infinity();
        }
      }
    }
    logits = Tensor::FromVector(logits.shape(), values, dtype);
  }
  return {Var(RandomTensor(Shape{b, h, n, d}, 1, dtype), true), Var(logits, true),
          Var(RandomTensor(Shape{b, h, s, d}, 3, dtype), true),
          Var(Tensor::FromVector(Shape{1, h, 1, 1}, {0.3, 0.7, 1.2}, dtype), true)};
}

// Value and gradients of sum(update * probe) for both forms.
void ExpectAgreement(DType dtype, bool masked, double tolerance) {
  const Inputs x = MakeInputs(dtype, masked);
  const Var probe(RandomTensor(x.v.shape(), 4, dtype));
  const Var fused = em_update(x.v, x.logits, x.mu, x.beta);
  const Var composed = Composed(x.v, x.logits, x.mu, x.beta);
  EXPECT_LE(LargestDifference(fused.value(), composed.value()), tolerance);
  const VarList fused_grads = grad({sum(mul(fused, probe))}, x.All());
  const VarList composed_grads = grad({sum(mul(composed, probe))}, x.All());
  for (size_t i = 0; i < fused_grads.size(); ++i) {
    ASSERT_TRUE(fused_grads[i].defined()) << i;
    const Tensor& f = fused_grads[i].value();
    const Tensor& c = composed_grads[i].value();
    // Masked logits get a gradient of 0 either way.
    EXPECT_LE(LargestDifference(f, c), tolerance * 4) << "input " << i;
  }
}

TEST(EmUpdateTest, AgreesWithTheComposedOpsInFloat64) { ExpectAgreement(DType::kFloat64, false, 1e-13); }

TEST(EmUpdateTest, AgreesWithTheComposedOpsUnderAMask) { ExpectAgreement(DType::kFloat64, true, 1e-13); }

TEST(EmUpdateTest, AgreesWithTheComposedOpsInFloat32) { ExpectAgreement(DType::kFloat32, true, 2e-5); }

TEST(EmUpdateTest, GradientsMatchFiniteDifferences) {
  const Inputs x = MakeInputs(DType::kFloat64, true);
  auto r = CheckGradients(
      [](const VarList& in) { return em_update(in[0], in[1], in[2], in[3]); }, x.All());
  EXPECT_TRUE(r) << r;
}

TEST(EmUpdateTest, SecondDerivativesGoThroughTheComposedForm) {
  const Inputs x = MakeInputs(DType::kFloat64, false);
  const Var probe(RandomTensor(x.v.shape(), 5));
  auto grad_norm = [&](const VarList& in, auto update) {
    const VarList g = grad({sum(mul(update(in[0], in[1], in[2], in[3]), probe))}, {in[0]},
                           {}, {.create_graph = true});
    return sum(square(g[0]));
  };
  const VarList fused = grad({grad_norm(x.All(), em_update)}, x.All());
  const VarList composed = grad({grad_norm(x.All(), Composed)}, x.All());
  for (size_t i = 0; i < fused.size(); ++i) {
    EXPECT_LE(LargestDifference(fused[i].value(), composed[i].value()), 1e-12) << i;
  }
}

TEST(EmUpdateTest, ResultsDoNotDependOnTheThreadCount) {
  const Inputs x = MakeInputs(DType::kFloat32, true);
  const Var probe(RandomTensor(x.v.shape(), 6, DType::kFloat32));
  const int threads = NumThreads();
  std::vector<std::vector<double>> runs;
  for (int n : {1, 3}) {
    SetNumThreads(n);
    const Var out = em_update(x.v, x.logits, x.mu, x.beta);
    std::vector<double> all = out.value().ToVector();
    for (const Var& g : grad({sum(mul(out, probe))}, x.All())) {
      const std::vector<double> values = g.value().ToVector();
      all.insert(all.end(), values.begin(), values.end());
    }
    runs.push_back(all);
  }
  SetNumThreads(threads);
  EXPECT_EQ(runs[0], runs[1]);
}

TEST(EmUpdateTest, PerSampleBetaFallsBackToTheComposedOps) {
  const Inputs x = MakeInputs(DType::kFloat64, false);
  const Var beta(RandomTensor(Shape{2, 3, 1, 1}, 7));
  const Var out = em_update(x.v, x.logits, x.mu, beta);
  const Var reference = matmul(softmax(add(x.logits, mul(beta, matmul(x.v, x.mu, false, true)))), x.mu);
  EXPECT_LE(LargestDifference(out.value(), reference.value()), 1e-14);
}

}  // namespace
}  // namespace stillpoint
