// internal::Gemm (packed float kernel, OpenBLAS or Eigen) and the packed
// float kernel itself against a naive triple loop: every transpose
// combination, strided operands (a head's columns of a wider tensor),
// alpha, k = 0, partial row tiles and column panels, depths across the
// kernel's depth blocks, shapes on both sides of the dispatch thresholds.
#include "framework/kernels/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace stillpoint::internal::gemm_test {
namespace {

template <typename T>
std::vector<T> Filled(int64_t n, int seed) {
  std::vector<T> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<T>(std::sin(0.37 * (i + 1) * seed) * 2.0);
  return v;
}

// The (r, c) entry of a row-major matrix with row stride ld, read
// transposed when trans is set.
template <typename T>
T At(const std::vector<T>& x, int64_t ld, bool trans, int64_t r, int64_t c) {
  return trans ? x[c * ld + r] : x[r * ld + c];
}

template <typename T>
using GemmFn = void (*)(
    bool, bool, int64_t, int64_t, int64_t, T, const T*, int64_t, const T*, int64_t, T*, int64_t);

template <typename T>
void CheckCase(bool ta,
               bool tb,
               int64_t m,
               int64_t n,
               int64_t k,
               int64_t pad,
               double tol,
               GemmFn<T> gemm = &Gemm<T>) {
  const int64_t a_rows = ta ? k : m, a_cols = ta ? m : k;
  const int64_t b_rows = tb ? n : k, b_cols = tb ? k : n;
  const int64_t lda = a_cols + pad, ldb = b_cols + pad, ldc = n + pad;
  const std::vector<T> a = Filled<T>(std::max<int64_t>(1, a_rows * lda), 1);
  const std::vector<T> b = Filled<T>(std::max<int64_t>(1, b_rows * ldb), 2);
  std::vector<T> c(m * ldc, T(7));  // C's old contents must be ignored
  const T alpha = T(0.75);
  gemm(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, c.data(), ldc);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double expected = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        expected += static_cast<double>(At(a, lda, ta, i, p)) * At(b, ldb, tb, p, j);
      }
      expected *= static_cast<double>(alpha);
      ASSERT_NEAR(c[i * ldc + j], expected, tol * (1.0 + std::abs(expected)))
          << "ta " << ta << " tb " << tb << " m " << m << " n " << n << " k " << k << " at (" << i
          << ", " << j << ")";
    }
    for (int64_t j = n; j < ldc; ++j) ASSERT_EQ(c[i * ldc + j], T(7)) << "padding overwritten";
  }
}

TEST(GemmTest, MatchesNaiveProductForAllLayouts) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (int64_t k : {0, 1, 16, 64}) {
        CheckCase<double>(ta, tb, 5, 7, k, 0, 1e-12);
        CheckCase<double>(ta, tb, 9, 3, k, 4, 1e-12);  // strided
        CheckCase<float>(ta, tb, 33, 17, k, 3, 1e-5);
      }
    }
  }
}

TEST(GemmTest, ProductsOnBothSidesOfTheKernelThreshold) {
  CheckCase<float>(false, false, 130, 96, 100, 0, 1e-5);
  CheckCase<float>(true, false, 64, 64, 300, 0, 1e-5);
  // min(m, n) >= 512: the BLAS (or Eigen) path.
  CheckCase<float>(false, true, 520, 512, 24, 0, 1e-5);
  CheckCase<float>(true, false, 512, 515, 17, 1, 1e-5);
}

TEST(GemmTest, PackedFloatKernelHandlesPartialTilesAndDepthBlocks) {
  // Rows 1..13 and 25 cover every row tile of every panel width (wide and
  // quad tiles are 6 rows, narrow ones 12); widths around one and two
  // packets (4 and 8 columns with SSE, 8 and 16 with AVX2, 16 and 32 with
  // AVX-512) and, with AVX-512, the quad panels of 64, 128 and 192 columns
  // and widths around them that use wide panels (63, 65, 96); depths on
  // both sides of the 256 block.
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (int64_t m = 1; m <= 25; m += m < 13 ? 1 : 12) {  // 1..13, 25
        for (int64_t n : {1, 3, 4, 5, 8, 9, 15, 16, 17, 31, 32, 33, 40, 63, 64, 65, 96, 128, 192}) {
          CheckCase<float>(ta, tb, m, n, 9, 3, 1e-5, &SmallGemmFloat);
        }
      }
      for (int64_t k : {0, 255, 256, 257, 600}) {
        CheckCase<float>(ta, tb, 14, 33, k, 2, 1e-5, &SmallGemmFloat);
        CheckCase<float>(ta, tb, 14, 3, k, 2, 1e-5, &SmallGemmFloat);    // narrow panels
        CheckCase<float>(ta, tb, 14, 128, k, 2, 1e-5, &SmallGemmFloat);  // quad with AVX-512
      }
      // One whole panel of columns (narrow, wide or quad) is read in place
      // up to depth 64 and packed beyond.
      for (int64_t n : {4, 8, 16, 32, 64}) {
        for (int64_t k : {63, 64, 65}) CheckCase<float>(ta, tb, 13, n, k, 5, 1e-5, &SmallGemmFloat);
      }
    }
  }
}

TEST(GemmTest, PackedFloatKernelRowsDoNotDependOnTheirTile) {
  // A row's result is the same whether it is computed alone, in a partial
  // tile or in a full one, so splitting rows over threads cannot change it.
  // Widths 3 (narrow panels on every SIMD width), 20 (wide with SSE and
  // AVX2, narrow with AVX-512) and 64 (quad with AVX-512); 25 rows fill two
  // narrow tiles and more.
  for (int64_t n : {3, 20, 64}) {
    const int64_t m = 25, k = 300;
    const std::vector<float> a = Filled<float>(m * k, 3);
    const std::vector<float> b = Filled<float>(k * n, 4);
    std::vector<float> whole(m * n), one(n);
    SmallGemmFloat(false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, whole.data(), n);
    for (int64_t i = 0; i < m; ++i) {
      SmallGemmFloat(false, false, 1, n, k, 1.0f, a.data() + i * k, k, b.data(), n, one.data(), n);
      for (int64_t j = 0; j < n; ++j) ASSERT_EQ(one[j], whole[i * n + j]) << i << ", " << j;
    }
  }
}

// Depth 16 (a head's Q K^T) runs tiles whose depth loop is unrolled at
// compile time, depth 32 the run-time loop; both must match the naive
// product for every partial row tile and panel, and the unrolled tiles
// bitwise the run-time loop: the same product with one more depth whose
// column of op(A) is zero (adding 0 * b to an accumulator leaves it
// unchanged).
TEST(GemmTest, UnrolledDepthsMatchTheRunTimeDepthLoop) {
  const int64_t pad = 2;
  for (int64_t k : {16, 32}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (int64_t m = 1; m <= 13; ++m) {  // every row count of both tile shapes
          for (int64_t n : {1, 4, 16, 17, 33}) {
            CheckCase<float>(ta, tb, m, n, k, pad, 1e-5, &SmallGemmFloat);
            // op(A) [m, k + 1] and op(B) [k + 1, n], op(A)'s last column zero.
            const int64_t lda = (ta ? m : k + 1) + pad, ldb = (tb ? k + 1 : n) + pad;
            std::vector<float> a = Filled<float>((ta ? k + 1 : m) * lda, 3);
            const std::vector<float> b = Filled<float>((tb ? n : k + 1) * ldb, 4);
            for (int64_t i = 0; i < m; ++i) (ta ? a[k * lda + i] : a[i * lda + k]) = 0.0f;
            std::vector<float> unrolled(m * n), run_time(m * n);
            SmallGemmFloat(ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, unrolled.data(), n);
            SmallGemmFloat(ta, tb, m, n, k + 1, 0.5f, a.data(), lda, b.data(), ldb, run_time.data(),
                           n);
            ASSERT_EQ(unrolled, run_time)
                << "k " << k << " ta " << ta << " tb " << tb << " m " << m << " n " << n;
          }
        }
      }
    }
  }
}

// op(B) packed once and multiplied by row blocks of op(A): bitwise what
// SmallGemmFloat gives for those rows, for every layout, partial panels and
// depths across blocks, with the storage reused by a smaller product.
TEST(GemmTest, PackedOperandMatchesThePackedKernelBitwise) {
  PackedFloatB packed;
  for (int64_t k : {300, 16, 0}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (int64_t n : {3, 37}) {  // narrow and wide panels
          const int64_t m = 29, pad = 3;
          const int64_t lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
          const std::vector<float> a = Filled<float>(std::max<int64_t>(1, (ta ? k : m) * lda), 5);
          const std::vector<float> b = Filled<float>(std::max<int64_t>(1, (tb ? n : k) * ldb), 6);
          std::vector<float> whole(m * ldc, 7.0f), blocks(m * ldc, 7.0f);
          SmallGemmFloat(ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, whole.data(), ldc);
          packed.Pack(tb, k, n, b.data(), ldb);
          for (int64_t i0 = 0; i0 < m; i0 += 12) {  // blocks of 12, 12 and 5 rows
            const float* a_rows = a.data() + (ta ? i0 : i0 * lda);
            packed.Multiply(ta, std::min<int64_t>(12, m - i0), 0.5f, a_rows, lda,
                            blocks.data() + i0 * ldc, ldc);
          }
          ASSERT_EQ(blocks, whole) << "ta " << ta << " tb " << tb << " k " << k << " n " << n;
        }
      }
    }
  }
}

// A shallow B of one panel of columns is read in place, not packed: the
// same values given transposed (always packed) give bitwise the same
// product, from SmallGemmFloat and from a PackedFloatB by row blocks.
TEST(GemmTest, SinglePanelReadInPlaceMatchesItsPackedTransposeBitwise) {
  for (int64_t n : {4, 8, 16, 32, 64}) {
    for (int64_t k : {1, 17, 64}) {
      for (bool ta : {false, true}) {
        const int64_t m = 20, pad = 3;
        const int64_t lda = (ta ? m : k) + pad, ldb = n + pad, ldbt = k + pad, ldc = n;
        const std::vector<float> a = Filled<float>((ta ? k : m) * lda, 8);
        const std::vector<float> b = Filled<float>(k * ldb, 9);
        std::vector<float> bt(n * ldbt, 0.0f);  // the same B, stored transposed
        for (int64_t p = 0; p < k; ++p) {
          for (int64_t j = 0; j < n; ++j) bt[j * ldbt + p] = b[p * ldb + j];
        }
        std::vector<float> in_place(m * ldc), packed(m * ldc), blocks(m * ldc);
        SmallGemmFloat(ta, false, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, in_place.data(),
                       ldc);
        SmallGemmFloat(ta, true, m, n, k, 0.5f, a.data(), lda, bt.data(), ldbt, packed.data(), ldc);
        const std::string what =
            "n " + std::to_string(n) + " k " + std::to_string(k) + " ta " + std::to_string(ta);
        ASSERT_EQ(in_place, packed) << what;
        PackedFloatB operand;
        operand.Pack(false, k, n, b.data(), ldb);
        for (int64_t i0 = 0; i0 < m; i0 += 7) {
          const float* a_rows = a.data() + (ta ? i0 : i0 * lda);
          operand.Multiply(ta, std::min<int64_t>(7, m - i0), 0.5f, a_rows, lda,
                           blocks.data() + i0 * ldc, ldc);
        }
        ASSERT_EQ(blocks, packed) << what;
      }
    }
  }
}

// A B of whole panels of columns with contiguous rows (ldb = n) is read in
// place at any depth, depth block by depth block: bitwise the product of
// the same B stored with padded rows (which is packed), with and without
// its column sums, at depths of one, two and three depth blocks. One panel
// (n up to 64), several (96: three of 32 columns with AVX-512; 128, 192:
// two and three of 64), and widths that are not whole panels (80, 200),
// which are packed either way; the column sums run in blocks of 64 columns
// and a tail.
TEST(GemmTest, ContiguousWholePanelsReadInPlaceAtAnyDepthMatchTheirPackedCopyBitwise) {
  for (int64_t n : {8, 16, 32, 64, 80, 96, 128, 192, 200}) {
    for (int64_t k : {65, 256, 600}) {
      for (bool ta : {false, true}) {
        const int64_t m = 20, pad = 3;
        const int64_t lda = (ta ? m : k) + pad, ldc = n;
        const std::vector<float> a = Filled<float>((ta ? k : m) * lda, 4);
        const std::vector<float> b = Filled<float>(k * n, 5);  // contiguous rows
        std::vector<float> padded(k * (n + pad), 0.0f);        // the same B, rows padded
        for (int64_t p = 0; p < k; ++p) {
          for (int64_t j = 0; j < n; ++j) padded[p * (n + pad) + j] = b[p * n + j];
        }
        std::vector<float> in_place(m * ldc), packed(m * ldc), in_place_sums(m * ldc),
            packed_sums(m * ldc);
        SmallGemmFloat(ta, false, m, n, k, 0.5f, a.data(), lda, b.data(), n, in_place.data(), ldc);
        SmallGemmFloat(ta, false, m, n, k, 0.5f, a.data(), lda, padded.data(), n + pad,
                       packed.data(), ldc);
        std::vector<double> sums_in_place(n, 0.25), sums_packed(n, 0.25);
        SmallGemmFloat(ta, m, n, k, 0.5f, a.data(), lda, b.data(), n, in_place_sums.data(), ldc,
                       sums_in_place.data());
        SmallGemmFloat(ta, m, n, k, 0.5f, a.data(), lda, padded.data(), n + pad, packed_sums.data(),
                       ldc, sums_packed.data());
        const std::string what =
            "n " + std::to_string(n) + " k " + std::to_string(k) + " ta " + std::to_string(ta);
        ASSERT_EQ(in_place, packed) << what;
        ASSERT_EQ(in_place_sums, packed) << what;
        ASSERT_EQ(packed_sums, packed) << what;
        ASSERT_EQ(sums_in_place, sums_packed) << what;
      }
    }
  }
}

// A scale packed into op(B) gives bitwise the product of the scaled B
// (each entry rounded once, scale * b), for every layout, with a shallow
// one-panel B too (which is then packed, not read in place); the tiles skip
// the multiplication by alpha = 1 without changing any result.
TEST(GemmTest, ScalePackedIntoTheOperandIsTheProductOfTheScaledOperand) {
  const float scale = 0.36067376f;    // not a power of 2: the rounding shows
  for (int64_t n : {4, 8, 16, 37}) {  // one narrow or wide panel (SSE, AVX), several
    for (int64_t k : {16, 300}) {
      for (bool ta : {false, true}) {
        for (bool tb : {false, true}) {
          const int64_t m = 29, pad = 3;
          const int64_t lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
          const std::vector<float> a = Filled<float>((ta ? k : m) * lda, 10);
          const std::vector<float> b = Filled<float>((tb ? n : k) * ldb, 11);
          std::vector<float> scaled_b(b.size());
          for (std::size_t i = 0; i < b.size(); ++i) scaled_b[i] = scale * b[i];
          std::vector<float> expected(m * ldc, 7.0f), got(m * ldc, 7.0f), unscaled(m * ldc, 7.0f);
          SmallGemmFloat(ta, tb, m, n, k, 1.0f, a.data(), lda, scaled_b.data(), ldb,
                         expected.data(), ldc);
          PackedFloatB packed;
          packed.Pack(tb, k, n, b.data(), ldb, scale);
          packed.Multiply(ta, m, 1.0f, a.data(), lda, got.data(), ldc);
          const std::string what = "n " + std::to_string(n) + " k " + std::to_string(k) + " ta " +
                                   std::to_string(ta) + " tb " + std::to_string(tb);
          ASSERT_EQ(got, expected) << what;
          // And the same operand packed without a scale is the plain product.
          packed.Pack(tb, k, n, b.data(), ldb);
          packed.Multiply(ta, m, 1.0f, a.data(), lda, unscaled.data(), ldc);
          std::vector<float> plain(m * ldc, 7.0f);
          SmallGemmFloat(ta, tb, m, n, k, 1.0f, a.data(), lda, b.data(), ldb, plain.data(), ldc);
          ASSERT_EQ(unscaled, plain) << what;
          ASSERT_NE(unscaled, got) << what;
        }
      }
    }
  }
}

// The softmax gradient made in the tiles, c = p (op(A) op(B) - d), and the
// elementwise product c = p op(A) op(B) are bitwise the product followed by
// that map: every layout, partial panels,
// the unrolled depth 16, a B read in place, and a depth past one block
// (which takes the two-pass path).
TEST(GemmTest, SoftmaxGradientAndElementwiseProductInTheTilesMatchTheProductThenTheMap) {
  for (int64_t n : {3, 4, 8, 16, 37}) {
    for (int64_t k : {16, 40, 300}) {
      for (bool ta : {false, true}) {
        for (bool tb : {false, true}) {
          const int64_t m = 29, pad = 3;
          const int64_t lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
          const int64_t ldp = n + 5;
          const std::vector<float> a = Filled<float>((ta ? k : m) * lda, 12);
          const std::vector<float> b = Filled<float>((tb ? n : k) * ldb, 13);
          const std::vector<float> p = Filled<float>(m * ldp, 14);
          const std::vector<float> d = Filled<float>(m, 15);
          PackedFloatB packed;
          packed.Pack(tb, k, n, b.data(), ldb);
          std::vector<float> expected(m * ldc, 7.0f), got(m * ldc, 7.0f);
          packed.Multiply(ta, m, 1.0f, a.data(), lda, expected.data(), ldc);
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < n; ++j) {
              expected[i * ldc + j] = p[i * ldp + j] * (expected[i * ldc + j] - d[i]);
            }
          }
          packed.MultiplySoftmaxGradient(ta, m, a.data(), lda, p.data(), ldp, d.data(), got.data(),
                                         ldc);
          ASSERT_EQ(got, expected) << "n " << n << " k " << k << " ta " << ta << " tb " << tb;
          // Without d: c = p x (as x p: GeluGradient's order).
          std::vector<float> product(m * ldc, 7.0f), got_product(m * ldc, 7.0f);
          packed.Multiply(ta, m, 1.0f, a.data(), lda, product.data(), ldc);
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < n; ++j) product[i * ldc + j] *= p[i * ldp + j];
          }
          packed.MultiplyElementwise(ta, m, a.data(), lda, p.data(), ldp, got_product.data(), ldc);
          ASSERT_EQ(got_product, product)
              << "elementwise, n " << n << " k " << k << " ta " << ta << " tb " << tb;
        }
      }
    }
  }
}

// SmallGemmFloat's column sums of B, taken as B is packed or read in place:
// bitwise the float64 sums in row order, and the product bitwise the one
// without sums.
TEST(GemmTest, ColumnSumsOfBAreTheRowOrderSumsAndLeaveTheProductAlone) {
  for (bool ta : {false, true}) {
    for (int64_t m : {0, 1, 7, 64}) {
      for (int64_t n : {3, 16, 32, 40, 192}) {
        for (int64_t k : {0, 9, 64, 256, 600}) {
          const int64_t pad = 3;
          const int64_t lda = (ta ? m : k) + pad, ldb = n + pad, ldc = n + pad;
          const std::vector<float> a = Filled<float>(std::max<int64_t>(1, (ta ? k : m) * lda), 1);
          const std::vector<float> b = Filled<float>(std::max<int64_t>(1, k * ldb), 2);
          std::vector<float> plain(std::max<int64_t>(1, m * ldc), 7.0f), with_sums = plain;
          // Sums are added to what is there.
          std::vector<double> sums(n, 0.5), expected(n, 0.5);
          for (int64_t kk = 0; kk < k; ++kk) {
            for (int64_t j = 0; j < n; ++j) expected[j] += static_cast<double>(b[kk * ldb + j]);
          }
          SmallGemmFloat(ta, false, m, n, k, 0.75f, a.data(), lda, b.data(), ldb, plain.data(),
                         ldc);
          SmallGemmFloat(ta, m, n, k, 0.75f, a.data(), lda, b.data(), ldb, with_sums.data(), ldc,
                         sums.data());
          const std::string where = "ta " + std::to_string(ta) + " m " + std::to_string(m) + " n " +
                                    std::to_string(n) + " k " + std::to_string(k);
          EXPECT_EQ(sums, expected) << where;
          EXPECT_EQ(plain, with_sums) << where;
        }
      }
    }
  }
}

// A bias added by the tiles as they store C is bitwise the product (added
// to C when accumulating) followed by a pass adding the bias: every panel
// width, partial panels, one depth block and several, depth 0.
TEST(GemmTest, BiasAddedInTheTilesMatchesThePassAfterTheProductBitwise) {
  for (int64_t n : {3, 16, 20, 40, 64, 100, 128}) {
    for (int64_t k : {0, 9, 64, 300}) {
      for (bool accumulate : {false, true}) {
        const int64_t m = 14, ldc = n + 2;
        const std::vector<float> a = Filled<float>(std::max<int64_t>(1, m * k), 11);
        const std::vector<float> b = Filled<float>(std::max<int64_t>(1, k * n), 12);
        const std::vector<float> bias = Filled<float>(n, 13);
        PackedFloatB operand;
        operand.Pack(false, k, n, b.data(), n);
        std::vector<float> fused = Filled<float>(m * ldc, 14), separate = fused;
        operand.Multiply(false, m, 1.0f, a.data(), k, fused.data(), ldc, accumulate, bias.data());
        operand.Multiply(false, m, 1.0f, a.data(), k, separate.data(), ldc, accumulate);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) separate[i * ldc + j] += bias[j];
        }
        EXPECT_EQ(fused, separate) << "n " << n << " k " << k << " accumulate " << accumulate;
      }
    }
  }
}

TEST(GemmTest, NamesItsBackend) {
  const std::string name = GemmBackendName();
  EXPECT_TRUE(name == "openblas" || name == "eigen") << name;
}

}  // namespace
}  // namespace stillpoint::internal::gemm_test
