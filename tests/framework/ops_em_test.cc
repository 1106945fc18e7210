// The fused EM ops (framework/ops_em.h), the update and the query part of
// the logits: their values and every input's gradient agree with the
// composed ops (float64 to rounding, float32 to float32 rounding; for the
// update with the value term's -|v|^2 / 2 included and masked keys); their
// gradients match central differences in float64; second derivatives go
// through the composed form; results do not depend on the thread count;
// shapes they do not fuse fall back to the composed ops.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "framework/ops_em.h"
#include "framework/gradcheck.h"
#include "framework/init.h"
#include "framework/ops.h"
#include "framework/parallel.h"
#include "framework/random.h"

namespace stillpoint::ops_em_test {
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

// op(inputs)'s value and every input's gradient of sum(value * probe),
// flattened, on 1 and on 3 threads.
std::vector<std::vector<double>> OnOneAndThreeThreads(const std::function<Var()>& op,
                                                      const VarList& inputs,
                                                      const Var& probe) {
  const int threads = NumThreads();
  std::vector<std::vector<double>> runs;
  for (int n : {1, 3}) {
    SetNumThreads(n);
    const Var out = op();
    std::vector<double> all = out.value().ToVector();
    for (const Var& g : grad({sum(mul(out, probe))}, inputs)) {
      const std::vector<double> values = g.value().ToVector();
      all.insert(all.end(), values.begin(), values.end());
    }
    runs.push_back(all);
  }
  SetNumThreads(threads);
  return runs;
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
  const auto runs =
      OnOneAndThreeThreads([&] { return em_update(x.v, x.logits, x.mu, x.beta); }, x.All(), probe);
  EXPECT_EQ(runs[0], runs[1]);
}

TEST(EmUpdateTest, PerSampleBetaFallsBackToTheComposedOps) {
  const Inputs x = MakeInputs(DType::kFloat64, false);
  const Var beta(RandomTensor(Shape{2, 3, 1, 1}, 7));
  const Var out = em_update(x.v, x.logits, x.mu, beta);
  const Var reference = matmul(softmax(add(x.logits, mul(beta, matmul(x.v, x.mu, false, true)))), x.mu);
  EXPECT_LE(LargestDifference(out.value(), reference.value()), 1e-14);
}

// ------------------------------------------------------ em_query_logits

// The query part of the logits as probabilistic attention wrote it before
// the fused op: alpha (q xi^T) - alpha |q|^2 / 2.
Var ComposedLogits(const Var& q, const Var& xi, const Var& alpha) {
  return sub(mul(alpha, matmul(q, xi, false, true)),
             mul(alpha, mul_scalar(sum(square(q), -1, true), 0.5)));
}

// [B, H, N, d] queries, [B, H, S, d] keys, one alpha per head.
VarList LogitsInputs(DType dtype) {
  const int64_t b = 2, h = 3, n = 5, s = 6, d = 4;
  return {Var(RandomTensor(Shape{b, h, n, d}, 11, dtype), true),
          Var(RandomTensor(Shape{b, h, s, d}, 12, dtype), true),
          Var(Tensor::FromVector(Shape{1, h, 1, 1}, {0.25, 0.5, 1.5}, dtype), true)};
}

void ExpectLogitsAgreement(DType dtype, double tolerance) {
  const VarList x = LogitsInputs(dtype);
  const Var fused = em_query_logits(x[0], x[1], x[2]);
  const Var composed = ComposedLogits(x[0], x[1], x[2]);
  EXPECT_LE(LargestDifference(fused.value(), composed.value()), tolerance);
  const Var probe(RandomTensor(fused.shape(), 13, dtype));
  const VarList fused_grads = grad({sum(mul(fused, probe))}, x);
  const VarList composed_grads = grad({sum(mul(composed, probe))}, x);
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_TRUE(fused_grads[i].defined()) << i;
    // alpha's gradient sums 60 products per unit: a little more rounding.
    EXPECT_LE(LargestDifference(fused_grads[i].value(), composed_grads[i].value()),
              tolerance * 8)
        << "input " << i;
  }
}

TEST(EmQueryLogitsTest, AgreesWithTheComposedOpsInFloat64) {
  ExpectLogitsAgreement(DType::kFloat64, 1e-13);
}

TEST(EmQueryLogitsTest, AgreesWithTheComposedOpsInFloat32) {
  ExpectLogitsAgreement(DType::kFloat32, 2e-5);
}

TEST(EmQueryLogitsTest, GradientsMatchFiniteDifferences) {
  auto r = CheckGradients([](const VarList& in) { return em_query_logits(in[0], in[1], in[2]); },
                          LogitsInputs(DType::kFloat64));
  EXPECT_TRUE(r) << r;
}

TEST(EmQueryLogitsTest, SecondDerivativesGoThroughTheComposedForm) {
  const VarList x = LogitsInputs(DType::kFloat64);
  const Var probe(RandomTensor(Shape{2, 3, 5, 6}, 14));
  auto grad_norm = [&](auto logits) {
    const VarList g = grad({sum(mul(logits(x[0], x[1], x[2]), probe))}, {x[0]}, {},
                           {.create_graph = true});
    return sum(square(g[0]));
  };
  const VarList fused = grad({grad_norm(em_query_logits)}, x);
  const VarList composed = grad({grad_norm(ComposedLogits)}, x);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_LE(LargestDifference(fused[i].value(), composed[i].value()), 1e-12) << i;
  }
}

TEST(EmQueryLogitsTest, ResultsDoNotDependOnTheThreadCount) {
  const VarList x = LogitsInputs(DType::kFloat32);
  const Var probe(RandomTensor(Shape{2, 3, 5, 6}, 15, DType::kFloat32));
  const auto runs =
      OnOneAndThreeThreads([&] { return em_query_logits(x[0], x[1], x[2]); }, x, probe);
  EXPECT_EQ(runs[0], runs[1]);
}

TEST(EmQueryLogitsTest, PerKeyPrecisionFallsBackToTheComposedOps) {
  const VarList x = LogitsInputs(DType::kFloat64);
  const Var alpha(RandomTensor(Shape{2, 3, 1, 6}, 16));
  const Var out = em_query_logits(x[0], x[1], alpha);
  EXPECT_LE(LargestDifference(out.value(), ComposedLogits(x[0], x[1], alpha).value()), 1e-14);
}

}  // namespace
}  // namespace stillpoint::ops_em_test
