// matmul: values against a naive triple loop, first and second order
// gradients for every layout (2-D with all transposes, batched 3-D and 4-D,
// batched with a shared rank-2 operand), float32, errors, and independence
// from the thread count. linear: the fused bias against matmul + add.
// linear_gelu: values and gradients against gelu(linear(...)), gradients
// against finite differences. feed_forward: values and gradients (all of
// them, or only some) against linear(linear_gelu(...)), bitwise, and first
// and second order gradients against finite differences.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "framework/gradcheck.h"
#include "framework/ops.h"
#include "framework/parallel.h"
#include "framework/random.h"

namespace stillpoint::ops_linalg_test {
namespace {

Var Random(const Shape& shape, uint64_t seed, DType dtype = DType::kFloat64) {
  Rng rng(seed);
  return Var(RandomNormal(shape, 0.0, 1.0, dtype, rng));
}

// C[i, j] = sum_p op(A)[i, p] op(B)[p, j], for every batch entry; B may be
// rank 2 and shared.
Tensor NaiveMatmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  const int64_t m = ta ? a.dim(-1) : a.dim(-2);
  const int64_t k = ta ? a.dim(-2) : a.dim(-1);
  const int64_t n = tb ? b.dim(-2) : b.dim(-1);
  const int64_t batch = a.numel() / (m * k);
  const bool shared = b.rank() == 2 && a.rank() > 2;
  std::vector<int64_t> dims = a.shape().dims();
  dims[dims.size() - 2] = m;
  dims[dims.size() - 1] = n;
  Tensor c(Shape(dims), DType::kFloat64);
  for (int64_t e = 0; e < batch; ++e) {
    const int64_t ao = e * m * k;
    const int64_t bo = shared ? 0 : e * k * n;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double s = 0.0;
        for (int64_t p = 0; p < k; ++p) {
          const double av = ta ? a.at(ao + p * m + i) : a.at(ao + i * k + p);
          const double bv = tb ? b.at(bo + j * k + p) : b.at(bo + p * n + j);
          s += av * bv;
        }
        c.set(e * m * n + i * n + j, s);
      }
    }
  }
  return c;
}

// Shapes of A and B for op(A) [m, k] and op(B) [k, n] with leading dims.
std::pair<Shape, Shape> Operands(
    std::vector<int64_t> lead, int64_t m, int64_t k, int64_t n, bool ta, bool tb, bool shared_b) {
  std::vector<int64_t> a = lead;
  a.push_back(ta ? k : m);
  a.push_back(ta ? m : k);
  std::vector<int64_t> b = shared_b ? std::vector<int64_t>{} : lead;
  b.push_back(tb ? n : k);
  b.push_back(tb ? k : n);
  return {Shape(a), Shape(b)};
}

class MatmulLayoutTest : public ::testing::TestWithParam<std::tuple<int /*layout*/, bool, bool>> {
 protected:
  // layout 0: 2-D; 1: batched 3-D; 2: batched 4-D; 3: 3-D with shared B.
  std::pair<Shape, Shape> Shapes() const {
    const auto [layout, ta, tb] = GetParam();
    switch (layout) {
      case 0:
        return Operands({}, 3, 4, 5, ta, tb, false);
      case 1:
        return Operands({2}, 3, 4, 2, ta, tb, false);
      case 2:
        return Operands({2, 2}, 2, 3, 2, ta, tb, false);
      default:
        return Operands({3}, 2, 4, 3, ta, tb, true);
    }
  }
};

TEST_P(MatmulLayoutTest, ValueMatchesNaiveTripleLoop) {
  const auto [layout, ta, tb] = GetParam();
  const auto [sa, sb] = Shapes();
  Var a = Random(sa, 1);
  Var b = Random(sb, 2);
  Var c = matmul(a, b, ta, tb);
  Tensor expected = NaiveMatmul(a.value(), b.value(), ta, tb);
  ASSERT_EQ(c.shape(), expected.shape());
  EXPECT_LT(MaxAbsDiff(c.value(), expected), 1e-12);
}

TEST_P(MatmulLayoutTest, FirstOrderGradients) {
  const auto [layout, ta, tb] = GetParam();
  const auto [sa, sb] = Shapes();
  auto r =
      CheckGradients([ta = ta, tb = tb](const VarList& in) { return matmul(in[0], in[1], ta, tb); },
                     {Random(sa, 3), Random(sb, 4)});
  EXPECT_TRUE(r) << r;
}

TEST_P(MatmulLayoutTest, SecondOrderGradients) {
  const auto [layout, ta, tb] = GetParam();
  const auto [sa, sb] = Shapes();
  // matmul is bilinear: the second-order terms are the cross terms, and a
  // square makes the Hessian depend on the values too.
  auto r = CheckSecondOrderGradients(
      [ta = ta, tb = tb](const VarList& in) { return square(matmul(in[0], in[1], ta, tb)); },
      {Random(sa, 5), Random(sb, 6)});
  EXPECT_TRUE(r) << r;
}

std::string LayoutName(const ::testing::TestParamInfo<MatmulLayoutTest::ParamType>& info) {
  static const char* kLayouts[] = {"TwoD", "Batched3D", "Batched4D", "SharedB"};
  const auto [layout, ta, tb] = info.param;
  return std::string(kLayouts[layout]) + (ta ? "_Ta" : "_Na") + (tb ? "_Tb" : "_Nb");
}

INSTANTIATE_TEST_SUITE_P(AllLayouts,
                         MatmulLayoutTest,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3),
                                            ::testing::Bool(),
                                            ::testing::Bool()),
                         LayoutName);

TEST(MatmulTest, LargeProductSplitIntoRowBlocksMatchesNaive) {
  // 600 rows: more than one work unit (132 rows), so the product is split
  // into row blocks; in float32 they share one packed copy of op(B).
  for (DType dtype : {DType::kFloat64, DType::kFloat32}) {
    const double tol = dtype == DType::kFloat64 ? 1e-12 : 1e-4;
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        Var a = Random(ta ? Shape{20, 600} : Shape{600, 20}, 7, dtype);
        Var b = Random(tb ? Shape{9, 20} : Shape{20, 9}, 8, dtype);
        const Tensor expected =
            NaiveMatmul(a.value().To(DType::kFloat64), b.value().To(DType::kFloat64), ta, tb);
        EXPECT_LT(MaxAbsDiff(matmul(a, b, ta, tb).value().To(DType::kFloat64), expected), tol)
            << ToString(dtype) << " ta " << ta << " tb " << tb;
      }
    }
  }
}

TEST(MatmulTest, Float32RowBlocksAreBitwiseTheRowsComputedAlone) {
  // A row of a product must not depend on the row block it fell in, nor on
  // the packed operand being shared, nor on where its row tile starts: the
  // rows [301, 501) of a 600-row product (split over two blocks, row 301
  // inside a tile of 6) equal the product of those rows alone (one block,
  // which packs op(B) itself).
  Var a = Random(Shape{600, 70}, 11, DType::kFloat32);
  for (bool tb : {false, true}) {
    Var b = Random(tb ? Shape{40, 70} : Shape{70, 40}, 12, DType::kFloat32);
    const Tensor whole = slice(matmul(a, b, false, tb), 0, 301, 501).value();
    const Tensor alone = matmul(slice(a, 0, 301, 501), b, false, tb).value();
    EXPECT_EQ(MaxAbsDiff(whole, alone), 0.0) << "tb " << tb;
  }
}

TEST(MatmulTest, Float32MatchesFloat64) {
  Var a = Random(Shape{2, 5, 7}, 10);
  Var b = Random(Shape{7, 3}, 11);
  Var c64 = matmul(a, b);
  Var c32 = matmul(Var(a.value().To(DType::kFloat32)), Var(b.value().To(DType::kFloat32)));
  EXPECT_EQ(c32.dtype(), DType::kFloat32);
  EXPECT_LT(MaxAbsDiff(c32.value().To(DType::kFloat64), c64.value()), 1e-5);
}

TEST(MatmulTest, Float32GradientsMatchFloat64) {
  Var a64(Random(Shape{3, 4, 5}, 12).value(), true);
  Var b64(Random(Shape{5, 2}, 13).value(), true);
  Var a32(a64.value().To(DType::kFloat32), true);
  Var b32(b64.value().To(DType::kFloat32), true);
  backward(sum(square(matmul(a64, b64))));
  backward(sum(square(matmul(a32, b32))));
  EXPECT_LT(MaxAbsDiff(a32.grad().value().To(DType::kFloat64), a64.grad().value()), 1e-4);
  EXPECT_LT(MaxAbsDiff(b32.grad().value().To(DType::kFloat64), b64.grad().value()), 1e-4);
}

std::string ErrorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(MatmulTest, ErrorsNameTheOpAndShapes) {
  Var a = Random(Shape{2, 3}, 1);
  Var b = Random(Shape{4, 5}, 2);
  const std::string inner = ErrorOf([&] { matmul(a, b); });
  EXPECT_NE(inner.find("matmul"), std::string::npos) << inner;
  EXPECT_NE(inner.find("[2, 3]"), std::string::npos) << inner;
  EXPECT_NE(inner.find("[4, 5]"), std::string::npos) << inner;

  Var batched_a = Random(Shape{2, 3, 4}, 3);
  Var batched_b = Random(Shape{3, 4, 5}, 4);
  const std::string batch = ErrorOf([&] { matmul(batched_a, batched_b); });
  EXPECT_NE(batch.find("matmul"), std::string::npos) << batch;
  EXPECT_NE(batch.find("[3, 4, 5]"), std::string::npos) << batch;

  const std::string rank = ErrorOf([&] { matmul(Random(Shape{3}, 5), b); });
  EXPECT_NE(rank.find("matmul"), std::string::npos) << rank;
  EXPECT_NE(rank.find("[3]"), std::string::npos) << rank;

  Var b32(Tensor::Zeros(Shape{3, 5}, DType::kFloat32));
  const std::string dtype = ErrorOf([&] { matmul(a, b32); });
  EXPECT_NE(dtype.find("matmul"), std::string::npos) << dtype;
  EXPECT_NE(dtype.find("float32"), std::string::npos) << dtype;
}

TEST(MatmulTest, BatchedResultIsBitwiseIndependentOfThreadCount) {
  Var a(Random(Shape{8, 70, 33}, 20, DType::kFloat32).value(), true);
  Var b(Random(Shape{8, 33, 41}, 21, DType::kFloat32).value(), true);
  Var shared(Random(Shape{33, 41}, 22, DType::kFloat32).value(), true);
  // Per thread count: the two products and the gradients of both operands.
  std::vector<Tensor> results[2];
  for (int threads : {1, 2}) {
    ScopedNumThreads scoped(threads);
    Var batched = matmul(a, b);
    Var with_shared = matmul(a, shared);
    VarList g = grad({add(sum(square(batched)), sum(square(with_shared)))}, {a, b, shared});
    results[threads - 1] = {batched.value(), with_shared.value(), g[0].value(), g[1].value(),
                            g[2].value()};
  }
  for (std::size_t i = 0; i < results[0].size(); ++i) {
    EXPECT_EQ(MaxAbsDiff(results[0][i], results[1][i]), 0.0) << "result " << i;
  }
}

TEST(MatmulTest, WeightGradientCutAlongItsDepthMatchesNaiveAndIsThreadIndependent) {
  // x^T g with x [1536, 21], g [1536, 70]: a short, deep product, cut into
  // column blocks (32 columns: 3 blocks, the last partial) and along its depth
  // into parts summed in order (3 parts of 512 rows). Values against the
  // naive loop, each part's rows against the product of those rows alone,
  // and bitwise the same result on one and two threads.
  for (DType dtype : {DType::kFloat64, DType::kFloat32}) {
    SCOPED_TRACE(ToString(dtype));
    Var x = Random(Shape{1536, 21}, 23, dtype);
    Var g = Random(Shape{1536, 70}, 24, dtype);
    std::vector<Tensor> results;
    for (int threads : {1, 2}) {
      ScopedNumThreads scoped(threads);
      results.push_back(matmul(x, g, true, false).value());
    }
    EXPECT_EQ(MaxAbsDiff(results[0], results[1]), 0.0);
    const Tensor expected =
        NaiveMatmul(x.value().To(DType::kFloat64), g.value().To(DType::kFloat64), true, false);
    EXPECT_LT(MaxAbsDiff(results[0].To(DType::kFloat64), expected),
              dtype == DType::kFloat64 ? 1e-11 : 1e-3);
    // The parts in order: ((x_0^T g_0 + x_1^T g_1) + x_2^T g_2), rows [512 p, 512 (p + 1)).
    Var parts;
    for (int64_t p = 0; p < 3; ++p) {
      Var part = matmul(slice(x, 0, 512 * p, 512 * (p + 1)), slice(g, 0, 512 * p, 512 * (p + 1)),
                        true, false);
      parts = p == 0 ? part : add(parts, part);
    }
    EXPECT_EQ(MaxAbsDiff(results[0], parts.value()), 0.0);
  }
}

TEST(MatmulTest, WeightGradientOnOneThreadIsTheProductCutForTwoBitwise) {
  // A linear layer's weight gradient x^T g (and bias gradient, g's column
  // sums) of 512 rows: cut into 32-column blocks when two threads share
  // it, whole when it runs on one thread (one thread, or inside another
  // ParallelFor's task), where a g of one panel of columns is read in
  // place. Bitwise the same gradients every way, for 64 and 128 outputs.
  for (int64_t outputs : {64, 128}) {
    SCOPED_TRACE(outputs);
    Var x = Random(Shape{512, 48}, 25, DType::kFloat32);
    Var w(Random(Shape{48, outputs}, 26, DType::kFloat32).value(), true);
    Var b(Random(Shape{outputs}, 27, DType::kFloat32).value(), true);
    Var g = Random(Shape{512, outputs}, 28, DType::kFloat32);
    auto gradients = [&] {
      const VarList d = grad({linear(x, w, b)}, {w, b}, {g});
      return std::vector<Tensor>{d[0].value(), d[1].value()};
    };
    std::vector<Tensor> one_thread, two_threads, in_task;
    {
      ScopedNumThreads scoped(1);
      one_thread = gradients();
    }
    {
      ScopedNumThreads scoped(2);
      two_threads = gradients();
      ParallelFor(0, 2, 1, [&](int64_t begin, int64_t) {
        if (begin == 0) in_task = gradients();
      });
    }
    for (std::size_t i = 0; i < 2; ++i) {
      EXPECT_TRUE(BitwiseEqual(one_thread[i], two_threads[i])) << "gradient " << i;
      EXPECT_TRUE(BitwiseEqual(in_task[i], two_threads[i])) << "gradient " << i;
    }
    // And the values themselves.
    const Tensor expected =
        NaiveMatmul(x.value().To(DType::kFloat64), g.value().To(DType::kFloat64), true, false);
    EXPECT_LT(MaxAbsDiff(one_thread[0].To(DType::kFloat64), expected), 1e-3);
  }
}

TEST(MatmulTest, EmptyInnerExtentGivesZeros) {
  Var a(Tensor::Zeros(Shape{2, 0}, DType::kFloat64));
  Var b(Tensor::Zeros(Shape{0, 3}, DType::kFloat64));
  Var c = matmul(a, b);
  ASSERT_EQ(c.shape(), (Shape{2, 3}));
  EXPECT_EQ(MaxAbsDiff(c.value(), Tensor::Zeros(Shape{2, 3}, DType::kFloat64)), 0.0);
}

TEST(LinearTest, EqualsMatmulPlusBiasBitwise) {
  // 600 rows: several row blocks of the product, each getting the bias.
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    const Var x = Random(Shape{600, 24}, 30, dtype);
    const Var w = Random(Shape{24, 40}, 31, dtype);
    const Var b = Random(Shape{40}, 32, dtype);
    EXPECT_EQ(MaxAbsDiff(linear(x, w, b).value(), add(matmul(x, w), b).value()), 0.0)
        << ToString(dtype);
    EXPECT_EQ(MaxAbsDiff(linear(x, w, Var()).value(), matmul(x, w).value()), 0.0)
        << ToString(dtype);
  }
}

// The weight gradient x^T g also sums g's columns, the bias gradient, while
// it packs g where its cut allows. Both gradients must be bitwise those of
// the separate ops, for every cut: one column block or several, a depth
// short enough to read g in place or deep enough for several packed depth
// blocks, a cut along the depth (2048 rows), partial panels (n = 40, 3).
TEST(LinearTest, WeightAndBiasGradientsEqualTheSeparateOpsBitwise) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    for (const auto& [rows, in, out] :
         std::vector<std::tuple<int64_t, int64_t, int64_t>>{{512, 64, 192},
                                                            {600, 24, 40},
                                                            {40, 8, 32},
                                                            {2048, 64, 128},
                                                            {7, 5, 3},
                                                            {300, 64, 16}}) {
      const Var x(Random(Shape{rows, in}, 33, dtype).value(), true);
      const Var w(Random(Shape{in, out}, 34, dtype).value(), true);
      const Var b(Random(Shape{out}, 35, dtype).value(), true);
      const Var probe = Random(Shape{rows, out}, 36, dtype);
      for (const int threads : {1, 2}) {
        ScopedNumThreads scoped(threads);
        const VarList grads = grad({sum(mul(linear(x, w, b), probe))}, {x, w, b});
        const std::string where = std::string(ToString(dtype)) + " [" + std::to_string(rows) +
                                  ", " + std::to_string(in) + "] x [" + std::to_string(in) + ", " +
                                  std::to_string(out) + "], threads " + std::to_string(threads);
        EXPECT_EQ(MaxAbsDiff(grads[1].value(), matmul(x, probe, true, false).value()), 0.0)
            << where;
        EXPECT_EQ(MaxAbsDiff(grads[2].value(), sum(probe, 0).value()), 0.0) << where;
      }
    }
  }
}

using LinearOp = Var (*)(const Var& x, const Var& weight, const Var& bias);

// First and second order gradients of square(op(x, w, b)) against finite
// differences (float64), and first order without a bias.
void ExpectGradientsMatchFiniteDifferences(LinearOp op, uint64_t seed) {
  const auto fn = [op](const VarList& in) { return square(op(in[0], in[1], in[2])); };
  const VarList inputs{Random(Shape{5, 4}, seed), Random(Shape{4, 3}, seed + 1),
                       Random(Shape{3}, seed + 2)};
  auto first = CheckGradients(fn, inputs);
  EXPECT_TRUE(first) << first;
  auto second = CheckSecondOrderGradients(fn, inputs);
  EXPECT_TRUE(second) << second;
  auto no_bias = CheckGradients([op](const VarList& in) { return op(in[0], in[1], Var()); },
                                {Random(Shape{5, 4}, seed + 3), Random(Shape{4, 3}, seed + 4)});
  EXPECT_TRUE(no_bias) << no_bias;
}

TEST(LinearTest, FirstAndSecondOrderGradients) {
  ExpectGradientsMatchFiniteDifferences(&linear, 33);
}

// A wrong inner extent and a wrong bias length: errors naming op and shapes.
void ExpectErrorsNameTheOpAndShapes(LinearOp op, const std::string& name, uint64_t seed) {
  const Var x = Random(Shape{5, 4}, seed);
  const Var w = Random(Shape{4, 3}, seed + 1);
  const std::string inner = ErrorOf([&] { op(x, Random(Shape{5, 3}, seed + 2), Var()); });
  EXPECT_NE(inner.find(name + ": x [5, 4]"), std::string::npos) << inner;
  const std::string bias = ErrorOf([&] { op(x, w, Random(Shape{4}, seed + 3)); });
  EXPECT_NE(bias.find(name + ": bias [4]"), std::string::npos) << bias;
}

TEST(LinearTest, ErrorsNameTheOpAndShapes) {
  ExpectErrorsNameTheOpAndShapes(&linear, "linear", 38);
}

// The fused GELU runs on each block a work unit of the product writes: row
// blocks (600 rows), column blocks (one short, wide product: 40 rows, 100
// columns in blocks of 32), widths with a partial last packet, one and two
// threads, with and without bias, recording or not.
TEST(LinearGeluTest, ValuesAndGradientsAreThoseOfGeluOfLinearBitwise) {
  struct Case {
    int64_t m, k, n;
  };
  uint64_t seed = 60;
  for (const Case c : {Case{600, 24, 45}, Case{40, 64, 100}}) {
    for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
      for (bool with_bias : {true, false}) {
        const Var x(Random(Shape{c.m, c.k}, ++seed, dtype).value(), true);
        const Var w(Random(Shape{c.k, c.n}, ++seed, dtype).value(), true);
        const Var b = with_bias ? Var(Random(Shape{c.n}, ++seed, dtype).value(), true) : Var();
        const Var g = Random(Shape{c.m, c.n}, ++seed, dtype);
        const VarList wrt = with_bias ? VarList{x, w, b} : VarList{x, w};
        // (Appended piece by piece: GCC 12 at -O3 warns, wrongly, about
        // "literal" + std::string&&.)
        std::string label = "[";
        label += std::to_string(c.m) + ", " + std::to_string(c.k) + "] x [" + std::to_string(c.n) +
                 "] " + ToString(dtype) + (with_bias ? " with bias" : " without bias");
        for (int threads : {1, 2}) {
          ScopedNumThreads scoped(threads);
          const Var fused = linear_gelu(x, w, b);
          const Var unfused = gelu(linear(x, w, b));
          EXPECT_EQ(MaxAbsDiff(fused.value(), unfused.value()), 0.0) << label << ", " << threads;
          const VarList fused_grads = grad({fused}, wrt, {g});
          const VarList unfused_grads = grad({unfused}, wrt, {g});
          for (std::size_t i = 0; i < wrt.size(); ++i) {
            EXPECT_EQ(MaxAbsDiff(fused_grads[i].value(), unfused_grads[i].value()), 0.0)
                << label << ", " << threads << " threads, gradient " << i;
          }
          const GradModeGuard no_grad(false);
          EXPECT_EQ(MaxAbsDiff(linear_gelu(x, w, b).value(), unfused.value()), 0.0)
              << label << ", not recording, " << threads << " threads";
        }
      }
    }
  }
}

TEST(LinearGeluTest, FirstAndSecondOrderGradients) {
  ExpectGradientsMatchFiniteDifferences(&linear_gelu, 70);
}

TEST(LinearGeluTest, ErrorsNameTheOpAndShapes) {
  ExpectErrorsNameTheOpAndShapes(&linear_gelu, "linear_gelu", 75);
}

// feed_forward against linear_gelu then linear: the backward's product
// g w2^T is multiplied by gelu' in the tiles where one packed w2 serves its
// row blocks (300 rows), else on the written block (40 rows; float64);
// both must give the two ops' values and gradients bitwise, also when the
// sweep asks for only some of the gradients.
TEST(FeedForwardTest, ValuesAndGradientsAreThoseOfTheTwoOpsBitwise) {
  struct Case {
    int64_t m, k, hidden, n;
  };
  uint64_t seed = 80;
  for (const Case c : {Case{300, 24, 48, 20}, Case{40, 16, 37, 5}}) {
    for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
      for (bool with_bias : {true, false}) {
        const Var x(Random(Shape{c.m, c.k}, ++seed, dtype).value(), true);
        const Var w1(Random(Shape{c.k, c.hidden}, ++seed, dtype).value(), true);
        const Var b1 =
            with_bias ? Var(Random(Shape{c.hidden}, ++seed, dtype).value(), true) : Var();
        const Var w2(Random(Shape{c.hidden, c.n}, ++seed, dtype).value(), true);
        const Var b2 = with_bias ? Var(Random(Shape{c.n}, ++seed, dtype).value(), true) : Var();
        const Var g = Random(Shape{c.m, c.n}, ++seed, dtype);
        std::string label = "[";
        label += std::to_string(c.m) + ", " + std::to_string(c.k) + "] hidden " +
                 std::to_string(c.hidden) + " " + ToString(dtype) +
                 (with_bias ? " with biases" : " without biases");
        const std::vector<VarList> wrt_sets =
            with_bias ? std::vector<VarList>{{x, w1, b1, w2, b2}, {x}, {w2, b2}, {w1}}
                      : std::vector<VarList>{{x, w1, w2}, {x}, {w2}};
        for (int threads : {1, 2}) {
          ScopedNumThreads scoped(threads);
          const Var fused = feed_forward(x, w1, b1, w2, b2);
          const Var unfused = linear(linear_gelu(x, w1, b1), w2, b2);
          EXPECT_EQ(MaxAbsDiff(fused.value(), unfused.value()), 0.0) << label;
          for (const VarList& wrt : wrt_sets) {
            const VarList fused_grads = grad({fused}, wrt, {g}, {.retain_graph = true});
            const VarList unfused_grads = grad({unfused}, wrt, {g}, {.retain_graph = true});
            for (std::size_t i = 0; i < wrt.size(); ++i) {
              ASSERT_TRUE(fused_grads[i].defined()) << label;
              EXPECT_EQ(MaxAbsDiff(fused_grads[i].value(), unfused_grads[i].value()), 0.0)
                  << label << ", " << threads << " threads, " << wrt.size()
                  << " gradients asked, gradient " << i;
            }
          }
          const GradModeGuard no_grad(false);
          EXPECT_EQ(MaxAbsDiff(feed_forward(x, w1, b1, w2, b2).value(), unfused.value()), 0.0)
              << label << ", not recording";
        }
      }
    }
  }
}

TEST(FeedForwardTest, FirstAndSecondOrderGradients) {
  const auto fn = [](const VarList& in) {
    return square(feed_forward(in[0], in[1], in[2], in[3], in[4]));
  };
  const VarList inputs{Random(Shape{5, 4}, 90), Random(Shape{4, 6}, 91), Random(Shape{6}, 92),
                       Random(Shape{6, 3}, 93), Random(Shape{3}, 94)};
  auto first = CheckGradients(fn, inputs);
  EXPECT_TRUE(first) << first;
  auto second = CheckSecondOrderGradients(fn, inputs);
  EXPECT_TRUE(second) << second;
  auto no_bias = CheckGradients(
      [](const VarList& in) { return feed_forward(in[0], in[1], Var(), in[2], Var()); },
      {Random(Shape{5, 4}, 95), Random(Shape{4, 6}, 96), Random(Shape{6, 3}, 97)});
  EXPECT_TRUE(no_bias) << no_bias;
}

TEST(FeedForwardTest, ErrorsNameTheOpAndShapes) {
  const Var x = Random(Shape{5, 4}, 100), w1 = Random(Shape{4, 6}, 101);
  const Var w2 = Random(Shape{6, 3}, 102);
  const std::string inner = ErrorOf([&] {
    feed_forward(x, Random(Shape{5, 6}, 103), Var(), w2, Var());
  });
  EXPECT_NE(inner.find("feed_forward: x [5, 4]"), std::string::npos) << inner;
  const std::string second = ErrorOf([&] {
    feed_forward(x, w1, Var(), Random(Shape{7, 3}, 104), Var());
  });
  EXPECT_NE(second.find("feed_forward: w2 [7, 3] must be [6, n]"), std::string::npos) << second;
  const std::string bias = ErrorOf([&] { feed_forward(x, w1, Var(), w2, Random(Shape{6}, 105)); });
  EXPECT_NE(bias.find("feed_forward: b2 [6] must be [3]"), std::string::npos) << bias;
  const std::string dtype = ErrorOf([&] {
    feed_forward(x, w1, Var(), Random(Shape{6, 3}, 106, DType::kFloat32), Var());
  });
  EXPECT_NE(dtype.find("feed_forward: w2 is float32 but w1 is float64"), std::string::npos)
      << dtype;
}

}  // namespace
}  // namespace stillpoint::ops_linalg_test
