// The one matrix-product kernel behind matmul and the fused attention (not
// part of the public API; ops.h is).
//
// Row-major GEMM on raw pointers with leading dimensions (so a head's
// strided [T, dh] block of a [T, heads * dh] tensor is an operand as is):
//
//   C[m, n] = alpha op(A) op(B),   op(A) [m, k], op(B) [k, n]
//
// A is [m, k] with row stride lda ([k, m] if trans_a), B is [k, n] with row
// stride ldb ([n, k] if trans_b), C is [m, n] with row stride ldc; C is
// overwritten (its previous contents are ignored, also when k = 0).
//
// float32 products with min(m, n) < 512 run the packed-B kernel below
// (SmallGemmFloat). The others, and all float64 products, are one
// single-threaded sgemm/dgemm call when the build found OpenBLAS (CMake
// option STILLPOINT_USE_OPENBLAS), else Eigen's GEMM.
// Either way a call runs on the calling thread only (OpenBLAS is limited to
// one thread); parallelism comes from ParallelFor around independent calls,
// so results do not depend on the thread count.
#pragma once

#include <cstdint>
#include <vector>

namespace stillpoint::internal {

template <typename T>
void Gemm(bool trans_a,
          bool trans_b,
          int64_t m,
          int64_t n,
          int64_t k,
          T alpha,
          const T* a,
          int64_t lda,
          const T* b,
          int64_t ldb,
          T* c,
          int64_t ldc);

// Whether Gemm<float> runs an [m, n] product with SmallGemmFloat: when
// its smaller side is below 512.
inline bool UsesSmallGemmFloat(int64_t m, int64_t n) { return m < 512 || n < 512; }

// The float32 kernel Gemm uses for small and skinny products (see
// gemm_float_kernel.cc); same contract as Gemm. Exposed for its tests.
void SmallGemmFloat(bool trans_a,
                    bool trans_b,
                    int64_t m,
                    int64_t n,
                    int64_t k,
                    float alpha,
                    const float* a,
                    int64_t lda,
                    const float* b,
                    int64_t ldb,
                    float* c,
                    int64_t ldc);
// The same product that also sums B's columns (B not transposed; a weight
// gradient x^T g that wants g's column sums, a bias gradient): entry j of
// b_column_sums gets every B[kk, j] added, kk = 0, 1, ..., k - 1 in order,
// in float64, as B is packed. The same values as a separate pass over B
// summing its columns that way.
void SmallGemmFloat(bool trans_a,
                    int64_t m,
                    int64_t n,
                    int64_t k,
                    float alpha,
                    const float* a,
                    int64_t lda,
                    const float* b,
                    int64_t ldb,
                    float* c,
                    int64_t ldc,
                    double* b_column_sums);

// op(B) of a float32 product packed once for many products with it: the
// row blocks of a longer op(A) processed apart (a fused attention's query
// blocks). Multiply gives bitwise the result SmallGemmFloat gives for the
// same rows.
class PackedFloatB {
 public:
  PackedFloatB() = default;
  // panels_ points into storage_, which a move keeps and a copy would not.
  PackedFloatB(const PackedFloatB&) = delete;
  PackedFloatB& operator=(const PackedFloatB&) = delete;
  PackedFloatB(PackedFloatB&&) = default;
  PackedFloatB& operator=(PackedFloatB&&) = default;

  // Packs scale op(B) [k, n]: B is [k, n] with row stride ldb ([n, k] if
  // trans_b). The storage is kept and reused by later calls. A shallow B
  // of exactly one panel of columns (one or two SIMD packets: 8 or 16 with
  // AVX2, 4 or 8 with SSE; one, two or four with AVX-512: 16, 32 or 64;
  // not transposed, k <= 64)
  // and scale 1 is not copied but read in place: it
  // must then stay unchanged until the last Multiply. A scale packed into B
  // instead of passed to Multiply as alpha saves the tiles a multiplication
  // of every result (products with alpha = 1 skip it); the rounding differs
  // (alpha (A B) against A (scale B)), so pick one per use and keep it.
  void Pack(bool trans_b, int64_t k, int64_t n, const float* b, int64_t ldb, float scale = 1.0f);
  // C[m, n] = alpha op(A) op(B), or with accumulate C += alpha op(A) op(B);
  // A is [m, k] with row stride lda ([k, m] if trans_a), C [m, n] with row
  // stride ldc. With bias (n entries) every row of C then gets it added, in
  // the tiles as they are stored: bitwise the product (and the addition to
  // C) followed by a pass adding the bias.
  void Multiply(bool trans_a,
                int64_t m,
                float alpha,
                const float* a,
                int64_t lda,
                float* c,
                int64_t ldc,
                bool accumulate = false,
                const float* bias = nullptr) const;
  // C[m, n] = P o (op(A) op(B) - d 1^T): c_ij = p_ij (x_ij - d_i) with x =
  // op(A) op(B), applied in the kernel's tiles before they are stored, so x
  // is never written out: the gradient of a softmax's scores, dS = P o (dP
  // - D), straight from the tiles of dP = dO V^T. Bitwise what Multiply
  // (alpha 1) followed by that map gives. p is [m, n] with row stride ldp,
  // d has m entries (or is null, for MultiplyElementwise); C may not
  // overlap p.
  void MultiplySoftmaxGradient(bool trans_a,
                               int64_t m,
                               const float* a,
                               int64_t lda,
                               const float* p,
                               int64_t ldp,
                               const float* d,
                               float* c,
                               int64_t ldc) const;
  // C[m, n] = P o (op(A) op(B)): c_ij = p_ij x_ij, applied in the tiles as
  // MultiplySoftmaxGradient does: the gradient through an elementwise map
  // whose derivative is p (a GELU's) straight from the tiles of the
  // product before it. Bitwise Multiply (alpha 1) followed by that map.
  void MultiplyElementwise(bool trans_a,
                           int64_t m,
                           const float* a,
                           int64_t lda,
                           const float* p,
                           int64_t ldp,
                           float* c,
                           int64_t ldc) const;

 private:
  float* Panels(std::size_t floats);

  int64_t k_ = 0;
  int64_t n_ = 0;
  std::vector<float> storage_;
  float* panels_ = nullptr;  // storage_ aligned to 64 bytes
  // op(B) itself when it is read in place (see Pack), else null.
  const float* in_place_ = nullptr;
  int64_t in_place_ldb_ = 0;
};

// "openblas" or "eigen": which kernel Gemm uses (printed by benchmarks).
const char* GemmBackendName();

}  // namespace stillpoint::internal
