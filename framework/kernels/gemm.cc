#include "framework/kernels/gemm.h"

#include <Eigen/Core>
#include <algorithm>
#include <type_traits>

#ifdef STILLPOINT_HAVE_OPENBLAS
// The Fortran BLAS entry points (column-major) and OpenBLAS's thread
// control; declared here so no BLAS header is needed.
extern "C" {
void sgemm_(const char* transa,
            const char* transb,
            const int* m,
            const int* n,
            const int* k,
            const float* alpha,
            const float* a,
            const int* lda,
            const float* b,
            const int* ldb,
            const float* beta,
            float* c,
            const int* ldc);
void dgemm_(const char* transa,
            const char* transb,
            const int* m,
            const int* n,
            const int* k,
            const double* alpha,
            const double* a,
            const int* lda,
            const double* b,
            const int* ldb,
            const double* beta,
            double* c,
            const int* ldc);
void openblas_set_num_threads(int num_threads);
}
#endif

namespace stillpoint::internal {
namespace {

template <typename T>
using RowMajorMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using StridedMap = Eigen::Map<RowMajorMatrix<T>, 0, Eigen::OuterStride<>>;
template <typename T>
using ConstStridedMap = Eigen::Map<const RowMajorMatrix<T>, 0, Eigen::OuterStride<>>;

template <typename T>
void EigenGemm(bool trans_a,
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
               int64_t ldc) {
  StridedMap<T> out(c, m, n, Eigen::OuterStride<>(ldc));
  if (k == 0) {
    out.setZero();
    return;
  }
  const ConstStridedMap<T> a_map(a, trans_a ? k : m, trans_a ? m : k, Eigen::OuterStride<>(lda));
  const ConstStridedMap<T> b_map(b, trans_b ? n : k, trans_b ? k : n, Eigen::OuterStride<>(ldb));
  if (!trans_a && !trans_b) {
    out.noalias() = (alpha * a_map) * b_map;
  } else if (!trans_a && trans_b) {
    out.noalias() = (alpha * a_map) * b_map.transpose();
  } else if (trans_a && !trans_b) {
    out.noalias() = (alpha * a_map.transpose()) * b_map;
  } else {
    out.noalias() = (alpha * a_map.transpose()) * b_map.transpose();
  }
}

#ifdef STILLPOINT_HAVE_OPENBLAS
// OpenBLAS would otherwise run a product on several threads of its own and
// compete with ParallelFor's workers for the same cores. Debian's OpenBLAS
// is the OpenMP build, which re-reads the OpenMP thread count of the
// *calling* thread on every call (a TBB worker starts with one thread per
// core): so every thread that calls BLAS sets its own count to 1, once. A
// single process-wide call is not enough: OpenMP teams then nest inside TBB
// tasks (bench/RESULTS.md).
void LimitBlasToOneThread() {
  thread_local bool limited = false;
  if (!limited) {
    openblas_set_num_threads(1);
    limited = true;
  }
}

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the same
// buffers with the operands swapped.
template <typename T>
void BlasGemm(char ta,
              char tb,
              int m,
              int n,
              int k,
              T alpha,
              const T* a,
              int lda,
              const T* b,
              int ldb,
              T* c,
              int ldc) {
  const T beta = 0;
  if constexpr (std::is_same_v<T, float>) {
    sgemm_(&tb, &ta, &n, &m, &k, &alpha, b, &ldb, a, &lda, &beta, c, &ldc);
  } else {
    dgemm_(&tb, &ta, &n, &m, &k, &alpha, b, &ldb, a, &lda, &beta, c, &ldc);
  }
}
#endif

}  // namespace

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
          int64_t ldc) {
  if (m == 0 || n == 0) return;
  if constexpr (std::is_same_v<T, float>) {
    // Products with a small side (the projections, the per-head attention
    // products, weight gradients x^T g with few features) go to the
    // packed-B kernel: 1.0-1.7x OpenBLAS on those shapes, and without its
    // per-call packing of A and zeroing of C. Products large in both m and
    // n stay with OpenBLAS, which also blocks A for the cache.
    if (UsesSmallGemmFloat(m, n)) {
      SmallGemmFloat(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, c, ldc);
      return;
    }
  }
#ifdef STILLPOINT_HAVE_OPENBLAS
  // BLAS takes 32-bit extents.
  constexpr int64_t kMaxInt = 2147483647;
  // Below depth 32 (the per-head Q K^T of small heads) and for small
  // products, OpenBLAS's packing and its zeroing pass over C cost more than
  // Eigen's whole product (on the W1/W2 shapes).
  const bool worth_it = k >= 32 || m * n * k >= (int64_t{1} << 20);
  if (worth_it && std::max({m, n, k, lda, ldb, ldc}) <= kMaxInt) {
    LimitBlasToOneThread();
    BlasGemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', static_cast<int>(m), static_cast<int>(n),
             static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), c,
             static_cast<int>(ldc));
    return;
  }
#endif
  EigenGemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, c, ldc);
}

template void Gemm<float>(bool,
                          bool,
                          int64_t,
                          int64_t,
                          int64_t,
                          float,
                          const float*,
                          int64_t,
                          const float*,
                          int64_t,
                          float*,
                          int64_t);
template void Gemm<double>(bool,
                           bool,
                           int64_t,
                           int64_t,
                           int64_t,
                           double,
                           const double*,
                           int64_t,
                           const double*,
                           int64_t,
                           double*,
                           int64_t);

const char* GemmBackendName() {
#ifdef STILLPOINT_HAVE_OPENBLAS
  return "openblas";
#else
  return "eigen";
#endif
}

}  // namespace stillpoint::internal
