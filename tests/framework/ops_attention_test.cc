// Fused multi-head attention: values against the unfused reference (masks,
// cross-attention, float32 by query blocks), first and second order
// gradients, skipped gradients, the packed self-attention form against the
// three-input one, independence from the thread count, and errors.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "framework/buffer_pool.h"
#include "framework/gradcheck.h"
#include "framework/ops.h"
#include "framework/parallel.h"
#include "framework/random.h"

namespace stillpoint::ops_attention_test {
namespace {

Var Random(const Shape& shape,
           uint64_t seed,
           DType dtype = DType::kFloat64,
           bool requires_grad = false) {
  Rng rng(seed);
  return Var(RandomNormal(shape, 0.0, 1.0, dtype, rng), requires_grad);
}

double LargestDifference(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const std::vector<double> x = a.ToVector();
  const std::vector<double> y = b.ToVector();
  double worst = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
  return worst;
}

struct Case {
  int64_t batch, tq, tk, heads, dh;
  bool causal;
};

class AttentionCaseTest : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionCaseTest, MatchesReferenceValuesAndGradients) {
  const Case c = GetParam();
  const int64_t dim = c.heads * c.dh;
  const Var q = Random(Shape{c.batch, c.tq, dim}, 1, DType::kFloat64, true);
  const Var k = Random(Shape{c.batch, c.tk, dim}, 2, DType::kFloat64, true);
  const Var v = Random(Shape{c.batch, c.tk, dim}, 3, DType::kFloat64, true);
  const Var g = Random(Shape{c.batch, c.tq, dim}, 4);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.dh));

  const Var fused = multi_head_attention(q, k, v, c.heads, scale, c.causal);
  const Var reference = multi_head_attention_reference(q, k, v, c.heads, scale, c.causal);
  EXPECT_LT(LargestDifference(fused.value(), reference.value()), 1e-13);

  const VarList fused_grads = grad({fused}, {q, k, v}, {g});
  const VarList reference_grads = grad({reference}, {q, k, v}, {g});
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(fused_grads[i].defined()) << i;
    EXPECT_LT(LargestDifference(fused_grads[i].value(), reference_grads[i].value()), 1e-12) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes,
                         AttentionCaseTest,
                         ::testing::Values(Case{2, 5, 5, 2, 3, false},
                                           Case{2, 5, 5, 2, 3, true},
                                           Case{1, 3, 6, 3, 2, false},  // cross-attention
                                           Case{1, 6, 4, 1, 4, true},   // Tq > Tk, causal
                                           Case{3, 9, 9, 4, 8, false},
                                           // Probabilities larger than q, k, v: not kept by
                                           // the forward pass, recomputed in backward.
                                           Case{2, 24, 24, 2, 2, false},
                                           Case{1, 20, 20, 2, 2, true}));

TEST(MultiHeadAttentionTest, GradCheck) {
  const VarFunction f = [](const VarList& in) {
    return multi_head_attention(in[0], in[1], in[2], 2, 0.7, false);
  };
  auto r = CheckGradients(
      f, {Random(Shape{2, 3, 4}, 5), Random(Shape{2, 4, 4}, 6), Random(Shape{2, 4, 4}, 7)});
  EXPECT_TRUE(r) << r;
  const VarFunction causal = [](const VarList& in) {
    return multi_head_attention(in[0], in[1], in[2], 2, 0.5, true);
  };
  r = CheckGradients(
      causal, {Random(Shape{1, 4, 4}, 8), Random(Shape{1, 4, 4}, 9), Random(Shape{1, 4, 4}, 10)});
  EXPECT_TRUE(r) << r;
}

TEST(MultiHeadAttentionTest, SecondOrderGradCheck) {
  const VarFunction f = [](const VarList& in) {
    return multi_head_attention(in[0], in[1], in[2], 2, 0.6, true);
  };
  auto r = CheckSecondOrderGradients(
      f, {Random(Shape{1, 3, 4}, 11), Random(Shape{1, 3, 4}, 12), Random(Shape{1, 3, 4}, 13)});
  EXPECT_TRUE(r) << r;
}

// One Var in all three slots: the create_graph path (which differentiates
// the unfused form) must give the same gradient as the fused VJP, not each
// slot the total.
TEST(MultiHeadAttentionTest, CreateGraphGradientOfSharedInputMatchesFusedVjp) {
  const Var x = Random(Shape{1, 3, 4}, 70, DType::kFloat64, true);
  const Var loss = sum(square(multi_head_attention(x, x, x, 2, 0.5, true)));
  const Var fused = grad({loss}, {x}, {}, {.retain_graph = true})[0];
  const Var recorded = grad({loss}, {x}, {}, {.create_graph = true})[0];
  EXPECT_LT(LargestDifference(recorded.value(), fused.value()), 1e-12);
}

TEST(MultiHeadAttentionTest, CausalFirstQuerySeesOnlyFirstKey) {
  // With Tq = Tk the first query sees only key 0: its output is v's row 0.
  const Var q = Random(Shape{1, 4, 6}, 14);
  const Var k = Random(Shape{1, 4, 6}, 15);
  const Var v = Random(Shape{1, 4, 6}, 16);
  const Var out = multi_head_attention(q, k, v, 3, 1.0, true);
  for (int64_t j = 0; j < 6; ++j) EXPECT_DOUBLE_EQ(out.value().at(j), v.value().at(j)) << j;
}

TEST(MultiHeadAttentionTest, Float32CloseToFloat64) {
  const Var q = Random(Shape{2, 16, 32}, 17);
  const Var k = Random(Shape{2, 16, 32}, 18);
  const Var v = Random(Shape{2, 16, 32}, 19);
  const Var out64 = multi_head_attention(q, k, v, 4, 0.35, false);
  const Var out32 =
      multi_head_attention(Var(q.value().To(DType::kFloat32)), Var(k.value().To(DType::kFloat32)),
                           Var(v.value().To(DType::kFloat32)), 4, 0.35, false);
  EXPECT_LT(LargestDifference(out32.value().To(DType::kFloat64), out64.value()), 2e-6);
}

TEST(MultiHeadAttentionTest, SkipsUnneededGradientsWithoutChangingOthers) {
  const Var q = Random(Shape{2, 5, 8}, 20, DType::kFloat64, true);
  const Var k = Random(Shape{2, 5, 8}, 21, DType::kFloat64, true);
  const Var v = Random(Shape{2, 5, 8}, 22, DType::kFloat64, true);
  const Var g = Random(Shape{2, 5, 8}, 23);
  const VarList all = grad({multi_head_attention(q, k, v, 2, 0.5)}, {q, k, v}, {g});
  const VarList only_v = grad({multi_head_attention(q, k, v, 2, 0.5)}, {v}, {g});
  const VarList only_q = grad({multi_head_attention(q, k, v, 2, 0.5)}, {q}, {g});
  ASSERT_TRUE(only_v[0].defined() && only_q[0].defined());
  EXPECT_EQ(LargestDifference(only_v[0].value(), all[2].value()), 0.0);
  EXPECT_EQ(LargestDifference(only_q[0].value(), all[0].value()), 0.0);
}

// The adjoint iterations of an implicit layer take many VJPs through one
// node: the first call recomputes the probabilities block by block, the
// second keeps them, later calls reuse them. All must agree bitwise.
TEST(MultiHeadAttentionTest, RepeatedVjpsThroughOneGraphAgreeBitwise) {
  // [B, T, heads * dh]: probabilities larger than q, k, v (recomputed in
  // backward), and smaller (kept by the forward pass).
  for (const Shape& shape : {Shape{2, 24, 4}, Shape{2, 6, 16}}) {
    const Var q = Random(shape, 40, DType::kFloat32, true);
    const Var k = Random(shape, 41, DType::kFloat32, true);
    const Var v = Random(shape, 42, DType::kFloat32, true);
    const Var g = Random(shape, 43, DType::kFloat32);
    const Var out = multi_head_attention(q, k, v, 2, 0.6, false);
    const VarList first = grad({out}, {q, k, v}, {g}, {.retain_graph = true});
    for (int call = 2; call <= 4; ++call) {
      const VarList again = grad({out}, {q, k, v}, {g}, {.retain_graph = true});
      for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(LargestDifference(again[i].value(), first[i].value()), 0.0)
            << shape << ", call " << call << ", input " << i;
      }
    }
    const VarList reference =
        grad({multi_head_attention_reference(q, k, v, 2, 0.6, false)}, {q, k, v}, {g});
    for (int i = 0; i < 3; ++i) {
      EXPECT_LT(LargestDifference(first[i].value(), reference[i].value()), 1e-5) << shape;
    }
  }
}

// Equal bit for bit, NaN where the other is NaN.
bool SameValues(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.ToVector();
  const std::vector<double> y = b.ToVector();
  if (x.size() != y.size()) return false;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) != std::isnan(y[i])) return false;
    if (!std::isnan(x[i]) && x[i] != y[i]) return false;
  }
  return true;
}

// A forward pass with no tape (an implicit layer's solver iterations) goes
// through each (b, h) block by blocks of query rows, in both dtypes, and
// holds no [Tq, Tk] block: in float64 its values match the unfused
// reference to rounding, with several blocks and a partial last one (Tk =
// 300: blocks of 18 queries), causal rows, cross-attention with Tq > Tk and
// the packed self-attention form; a recorded pass that does not keep the
// probabilities gives bitwise the same output.
TEST(MultiHeadAttentionTest, TapeOffForwardByQueryBlocksMatchesTheReferenceInFloat64) {
  for (const Case& c : {Case{2, 200, 300, 2, 16, false}, Case{1, 300, 300, 4, 8, true},
                        Case{1, 50, 40, 2, 4, true}, Case{3, 7, 5, 1, 3, false}}) {
    const int64_t dim = c.heads * c.dh;
    const Var q = Random(Shape{c.batch, c.tq, dim}, 80, DType::kFloat64, true);
    const Var k = Random(Shape{c.batch, c.tk, dim}, 81, DType::kFloat64, true);
    const Var v = Random(Shape{c.batch, c.tk, dim}, 82, DType::kFloat64, true);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.dh));
    const Var reference = multi_head_attention_reference(q, k, v, c.heads, scale, c.causal);
    const Var recorded = multi_head_attention(q, k, v, c.heads, scale, c.causal);
    Var tape_off;
    {
      NoGrad no_tape;
      tape_off = multi_head_attention(q, k, v, c.heads, scale, c.causal);
    }
    ASSERT_FALSE(tape_off.requires_grad());
    // Rows that see no key are NaN in all three.
    const std::vector<double> off = tape_off.value().ToVector();
    const std::vector<double> ref = reference.value().ToVector();
    double worst = 0.0;
    for (size_t i = 0; i < off.size(); ++i) {
      ASSERT_EQ(std::isnan(off[i]), std::isnan(ref[i])) << i;
      if (!std::isnan(off[i])) worst = std::max(worst, std::abs(off[i] - ref[i]));
    }
    EXPECT_LT(worst, 1e-13) << "tq " << c.tq << " tk " << c.tk;
    // A recorded pass that keeps the probabilities (no larger than q, k and
    // v) normalises them before P V instead of the output rows after.
    if (c.heads * c.tq * c.tk > (c.tq + 2 * c.tk) * dim) {
      EXPECT_TRUE(SameValues(tape_off.value(), recorded.value())) << "tq " << c.tq;
    } else {
      EXPECT_LT(LargestDifference(tape_off.value(), recorded.value()), 1e-14) << "tq " << c.tq;
    }
    if (c.tq == c.tk) {
      NoGrad no_tape;
      const Var packed =
          multi_head_self_attention(concat({q, k, v}, 2), c.heads, scale, c.causal);
      EXPECT_TRUE(SameValues(packed.value(), tape_off.value())) << "packed, tq " << c.tq;
    }
  }
}

// Peak bytes the pool hands out over f(), above what was in use before.
int64_t PoolPeakOf(const std::function<void()>& f) {
  ResetBufferPoolStats();
  const int64_t base = GetBufferPoolStats().bytes_in_use;
  f();
  return GetBufferPoolStats().peak_bytes_in_use - base;
}

// The VJPs after the first through one node keep the probabilities only
// while they are at most 8 times the size of q, k and v; longer rows (an
// implicit layer's adjoint at long sequences) recompute them in every call,
// so repeated VJPs hold no [B, heads, Tq, Tk] tensor, and give bitwise the
// gradients of the first call.
TEST(MultiHeadAttentionTest, RepeatedVjpsKeepTheProbabilitiesOnlyUpToABound) {
  struct Size {
    int64_t t, heads, dh;
    bool kept;
  };
  // T 512, 2 heads of 4: probabilities 42.7x q, k and v; T 100, 2 heads of
  // 16: 2.1x (larger than q, k and v, so not kept by the forward pass).
  for (const Size& size : {Size{512, 2, 4, false}, Size{100, 2, 16, true}}) {
    const Shape shape{1, size.t, size.heads * size.dh};
    const Var q = Random(shape, 90, DType::kFloat32, true);
    const Var k = Random(shape, 91, DType::kFloat32, true);
    const Var v = Random(shape, 92, DType::kFloat32, true);
    const Var g = Random(shape, 93, DType::kFloat32);
    const Var out = multi_head_attention(q, k, v, size.heads, 0.5, false);
    const int64_t probs_bytes = size.heads * size.t * size.t * 4;
    const int64_t grads_bytes = 3 * shape.numel() * 4;
    VarList first;
    const int64_t first_peak =
        PoolPeakOf([&] { first = grad({out}, {q, k, v}, {g}, {.retain_graph = true}); });
    EXPECT_LT(first_peak, probs_bytes);  // the first call never keeps them
    for (int call = 2; call <= 4; ++call) {
      VarList again;
      const int64_t peak =
          PoolPeakOf([&] { again = grad({out}, {q, k, v}, {g}, {.retain_graph = true}); });
      if (size.kept && call == 2) {
        EXPECT_GE(peak, probs_bytes) << "T " << size.t;
      } else {
        EXPECT_LE(peak, 2 * grads_bytes) << "T " << size.t << ", call " << call;
      }
      for (int i = 0; i < 3; ++i) {
        EXPECT_TRUE(SameValues(again[i].value(), first[i].value()))
            << "T " << size.t << ", call " << call << ", input " << i;
      }
    }
  }
}


// The first VJP of a graph recomputes the probabilities from the row max and
// 1 / sum its forward pass kept; the second makes them afresh, with their
// own max and sum, and keeps them. Both must give bitwise the same
// gradients: in both dtypes, in several float32 query blocks (Tk = 300:
// forward blocks of 18 queries, backward blocks of 78) with a partial last
// one, and with causal rows that see no key (NaN).
TEST(MultiHeadAttentionTest, ProbabilitiesFromRowStatisticsAreBitwiseTheForwardOnes) {
  for (const DType dtype : {DType::kFloat32, DType::kFloat64}) {
    // (Heads of 16 in the first case: its probabilities are larger than q, k
    // and v, so the forward pass does not keep them, but within the factor
    // the second VJP keeps them up to.)
    for (const Case& c : {Case{1, 200, 300, 2, 16, false}, Case{1, 40, 30, 2, 2, true}}) {
      const int64_t dim = c.heads * c.dh;
      const Var q = Random(Shape{c.batch, c.tq, dim}, 60, dtype, true);
      const Var k = Random(Shape{c.batch, c.tk, dim}, 61, dtype, true);
      const Var v = Random(Shape{c.batch, c.tk, dim}, 62, dtype, true);
      const Var g = Random(Shape{c.batch, c.tq, dim}, 63, dtype);
      const Var out = multi_head_attention(q, k, v, c.heads, 0.7, c.causal);
      const VarList from_stats = grad({out}, {q, k, v}, {g}, {.retain_graph = true});
      const VarList from_kept = grad({out}, {q, k, v}, {g}, {.retain_graph = true});
      bool any_nan = false;
      for (int i = 0; i < 3; ++i) {
        EXPECT_TRUE(SameValues(from_stats[i].value(), from_kept[i].value()))
            << ToString(dtype) << " tq " << c.tq << " tk " << c.tk << " input " << i;
        for (double x : from_stats[i].value().ToVector()) any_nan = any_nan || std::isnan(x);
      }
      // Causal with Tq > Tk: the first Tq - Tk queries see no key.
      EXPECT_EQ(any_nan, c.causal) << ToString(dtype);
    }
  }
}

// No queries: the output is empty and the keys and values get zero
// gradients. (Gradient buffers come from a pool that reuses memory, so one
// of the same size is dirtied first.)
TEST(MultiHeadAttentionTest, EmptyQueriesGiveZeroKeyAndValueGradients) {
  for (const DType dtype : {DType::kFloat32, DType::kFloat64}) {
    const Var q = Random(Shape{2, 0, 4}, 70, dtype, true);
    const Var k = Random(Shape{2, 3, 4}, 71, dtype, true);
    const Var v = Random(Shape{2, 3, 4}, 72, dtype, true);
    const Var out = multi_head_attention(q, k, v, 2, 0.5, false);
    EXPECT_EQ(out.shape(), (Shape{2, 0, 4}));
    {
      Tensor dirty(k.shape(), dtype);
      dirty.Fill(7.0);
    }
    const VarList grads = grad({out}, {q, k, v}, {Var(Tensor::Zeros(out.shape(), dtype))});
    for (int i = 1; i < 3; ++i) {
      for (double x : grads[i].value().ToVector()) EXPECT_EQ(x, 0.0) << ToString(dtype) << " " << i;
    }
  }
}

TEST(MultiHeadAttentionTest, BitwiseIndependentOfThreadCount) {
  const Var q = Random(Shape{3, 20, 16}, 24, DType::kFloat32, true);
  const Var k = Random(Shape{3, 20, 16}, 25, DType::kFloat32, true);
  const Var v = Random(Shape{3, 20, 16}, 26, DType::kFloat32, true);
  const Var g = Random(Shape{3, 20, 16}, 27, DType::kFloat32);
  std::vector<std::vector<double>> results[2];
  for (int threads : {1, 2}) {
    ScopedNumThreads scoped(threads);
    const Var out = multi_head_attention(q, k, v, 4, 0.5, true);
    const VarList grads = grad({out}, {q, k, v}, {g});
    auto& r = results[threads - 1];
    r.push_back(out.value().ToVector());
    for (const Var& d : grads) r.push_back(d.value().ToVector());
    const Var qkv = concat({q, k, v}, 2);
    const Var packed = multi_head_self_attention(qkv, 4, 0.5, true);
    r.push_back(packed.value().ToVector());
    r.push_back(grad({packed}, {qkv}, {g})[0].value().ToVector());
  }
  EXPECT_EQ(results[0], results[1]);
}

// The float32 forward works through blocks of queries (18 rows for
// Tk = 300, one block for short rows): more than one block, a partial last
// block, cross-attention, causal masks and queries that see no key (NaN, as
// the reference).
TEST(MultiHeadAttentionTest, Float32OutputByQueryBlocksMatchesFloat64) {
  for (const Case& c : {Case{2, 53, 300, 2, 8, false}, Case{1, 53, 40, 4, 4, false},
                        Case{2, 300, 300, 2, 8, true}, Case{1, 30, 20, 2, 8, true}}) {
    const int64_t dim = c.heads * c.dh;
    const Var q = Random(Shape{c.batch, c.tq, dim}, 50);
    const Var k = Random(Shape{c.batch, c.tk, dim}, 51);
    const Var v = Random(Shape{c.batch, c.tk, dim}, 52);
    const Var out64 = multi_head_attention_reference(q, k, v, c.heads, 0.4, c.causal);
    Var out32;
    {
      NoGrad no_grad;
      out32 = multi_head_attention(Var(q.value().To(DType::kFloat32)),
                                   Var(k.value().To(DType::kFloat32)),
                                   Var(v.value().To(DType::kFloat32)), c.heads, 0.4, c.causal);
    }
    const std::vector<double> got = out32.value().ToVector();
    const std::vector<double> want = out64.value().ToVector();
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      if (std::isnan(want[i])) {
        EXPECT_TRUE(std::isnan(got[i])) << "tq " << c.tq << " tk " << c.tk << " at " << i;
      } else {
        EXPECT_NEAR(got[i], want[i], 2e-6) << "tq " << c.tq << " tk " << c.tk << " at " << i;
      }
    }
  }
}

// The float32 VJP works through blocks of queries too (120 queries for
// Tk = 200, 78 for Tk = 300), accumulating dK and dV over the blocks:
// gradients against the float64 reference, with the probabilities
// recomputed (long rows) or kept (wide heads), in one block or several.
TEST(MultiHeadAttentionTest, Float32GradientsByQueryBlocksMatchFloat64) {
  for (const Case& c : {Case{2, 53, 300, 2, 8, false}, Case{1, 53, 40, 2, 8, false},
                        Case{1, 200, 200, 2, 8, true}, Case{1, 200, 200, 1, 256, false}}) {
    const int64_t dim = c.heads * c.dh;
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.dh));
    const Var q = Random(Shape{c.batch, c.tq, dim}, 53, DType::kFloat64, true);
    const Var k = Random(Shape{c.batch, c.tk, dim}, 54, DType::kFloat64, true);
    const Var v = Random(Shape{c.batch, c.tk, dim}, 55, DType::kFloat64, true);
    const Var g = Random(Shape{c.batch, c.tq, dim}, 56);
    const VarList want =
        grad({multi_head_attention_reference(q, k, v, c.heads, scale, c.causal)}, {q, k, v}, {g});
    const auto to32 = [](const Var& x) { return Var(x.value().To(DType::kFloat32), true); };
    const Var q32 = to32(q), k32 = to32(k), v32 = to32(v);
    const VarList got = grad({multi_head_attention(q32, k32, v32, c.heads, scale, c.causal)},
                             {q32, k32, v32}, {Var(g.value().To(DType::kFloat32))});
    for (int i = 0; i < 3; ++i) {
      EXPECT_LT(LargestDifference(got[i].value().To(DType::kFloat64), want[i].value()), 2e-5)
          << "tq " << c.tq << " tk " << c.tk << " input " << i;
    }
  }
}

// Self-attention on one packed [B, T, 3 D] projection gives bitwise the
// values and gradients of the three-input op on its column ranges, with
// probabilities kept (short) or recomputed (long), in both dtypes.
TEST(MultiHeadAttentionTest, PackedSelfAttentionMatchesSeparateInputsBitwise) {
  for (const DType dtype : {DType::kFloat64, DType::kFloat32}) {
    for (const Case& c : {Case{2, 6, 6, 2, 8, false}, Case{2, 30, 30, 2, 2, true}}) {
      const int64_t dim = c.heads * c.dh;
      const Var qkv = Random(Shape{c.batch, c.tq, 3 * dim}, 60, dtype, true);
      const Var q(slice(qkv, 2, 0, dim).value(), true);
      const Var k(slice(qkv, 2, dim, 2 * dim).value(), true);
      const Var v(slice(qkv, 2, 2 * dim, 3 * dim).value(), true);
      const Var g = Random(Shape{c.batch, c.tq, dim}, 61, dtype);
      const Var packed = multi_head_self_attention(qkv, c.heads, 0.45, c.causal);
      const Var separate = multi_head_attention(q, k, v, c.heads, 0.45, c.causal);
      EXPECT_EQ(packed.value().ToVector(), separate.value().ToVector()) << c.tq;
      const VarList d_packed = grad({packed}, {qkv}, {g});
      const VarList d_separate = grad({separate}, {q, k, v}, {g});
      const Var joined = concat({d_separate[0], d_separate[1], d_separate[2]}, 2);
      EXPECT_EQ(d_packed[0].value().ToVector(), joined.value().ToVector()) << c.tq;
    }
  }
}

TEST(MultiHeadAttentionTest, PackedSelfAttentionGradChecks) {
  const VarFunction f = [](const VarList& in) {
    return multi_head_self_attention(in[0], 2, 0.7, false);
  };
  auto r = CheckGradients(f, {Random(Shape{2, 3, 12}, 62)});
  EXPECT_TRUE(r) << r;
  const VarFunction causal = [](const VarList& in) {
    return multi_head_self_attention(in[0], 2, 0.6, true);
  };
  r = CheckGradients(causal, {Random(Shape{1, 4, 12}, 63)});
  EXPECT_TRUE(r) << r;
  r = CheckSecondOrderGradients(causal, {Random(Shape{1, 3, 12}, 64)});
  EXPECT_TRUE(r) << r;
}

TEST(MultiHeadAttentionTest, PackedSelfAttentionErrorsNameTheShape) {
  try {
    multi_head_self_attention(Random(Shape{2, 3, 10}, 65), 2, 1.0);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("multi_head_self_attention"), std::string::npos) << message;
    EXPECT_NE(message.find("[2, 3, 10]"), std::string::npos) << message;
  }
  EXPECT_THROW(multi_head_self_attention(Random(Shape{2, 12}, 66), 2, 1.0), Error);
  EXPECT_THROW(multi_head_self_attention(Random(Shape{2, 3, 12}, 67), 3, 1.0), Error);
  EXPECT_THROW(multi_head_self_attention(Random(Shape{2, 3, 12}, 68), 2, -1.0), Error);
}

TEST(MultiHeadAttentionTest, ErrorsNameTheOpAndShapes) {
  const Var q = Random(Shape{2, 3, 6}, 28);
  const Var k = Random(Shape{2, 4, 6}, 29);
  try {
    multi_head_attention(q, k, Random(Shape{2, 5, 6}, 30), 2, 1.0);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("multi_head_attention"), std::string::npos) << message;
    EXPECT_NE(message.find("[2, 5, 6]"), std::string::npos) << message;
  }
  EXPECT_THROW(multi_head_attention(q, k, k, 4, 1.0), Error);  // 6 is not a multiple of 4
  EXPECT_THROW(multi_head_attention(q, k, k, 2, 0.0), Error);
}

}  // namespace
}  // namespace stillpoint::ops_attention_test
