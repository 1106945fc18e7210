#include "framework/ops_hopfield.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>

#include "framework/check.h"
#include "framework/kernels/gemm.h"
#include "framework/kernels/vector_math.h"
#include "framework/ops.h"
#include "framework/parallel.h"

namespace stillpoint {
namespace {

template <typename T>
using RowMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Rows of z per parallel task: large enough that the patterns are packed for
// the GEMM a few times per evaluation, not once per 32 queries.
constexpr int64_t kRowsPerTask = 256;
// Queries per block of the float32 map: a block's [rows, N] scores stay in
// the core's cache between the two products.
constexpr int64_t kQueryBlock = 24;

// out = softmax(beta Z X^T) X for the rows of z; parallel over row blocks,
// each block one pair of GEMMs (the map is GEMM-bound).
template <typename T>
void HopfieldMap(const Tensor& patterns, double beta, const Tensor& z, Tensor* out) {
  const int64_t n = patterns.dim(0), d = patterns.dim(1), k = z.dim(0);
  const T* x = patterns.data<T>();
  ParallelFor(0, k, kRowsPerTask, [&](int64_t lo, int64_t hi) {
    const int64_t rows = hi - lo;
    RowMatrix<T> scores(rows, n);
    internal::Gemm<T>(false, true, rows, n, d, static_cast<T>(beta), z.data<T>() + lo * d, d, x, d,
                      scores.data(), n);
    for (int64_t r = 0; r < rows; ++r) {
      const T top = scores.row(r).maxCoeff();
      scores.row(r) = (scores.row(r).array() - top).exp();
      scores.row(r) /= scores.row(r).sum();
    }
    internal::Gemm<T>(false, false, rows, d, n, T(1), scores.data(), n, x, d,
                      out->data<T>() + lo * d, d);
  });
}

// The float32 map by blocks of queries: X^T and X packed once per task, then
// each block of queries goes from scores to output while its scores are in
// cache, and the [rows, d] output rows are normalised instead of the
// [rows, N] weights. The softmax runs in base 2, as the fused attention's:
// X^T is packed times beta log2(e), so the scores come out in base-2 units
// and 2^x (Exp2FlushPacket) replaces e^x.
template <>
void HopfieldMap<float>(const Tensor& patterns, double beta, const Tensor& z, Tensor* out) {
  const int64_t n = patterns.dim(0), d = patterns.dim(1), k = z.dim(0);
  const float* x = patterns.data<float>();
  ParallelFor(0, k, kRowsPerTask, [&](int64_t lo, int64_t hi) {
    thread_local internal::PackedFloatB patterns_t;  // X^T [d, N]
    thread_local internal::PackedFloatB patterns_n;  // X [N, d]
    thread_local std::vector<float> scores;
    patterns_t.Pack(true, d, n, x, d, static_cast<float>(beta * internal::kLog2e));
    patterns_n.Pack(false, n, d, x, d);
    scores.resize(kQueryBlock * n);
    float inverse_sum[kQueryBlock];
    for (int64_t i0 = lo; i0 < hi; i0 += kQueryBlock) {
      const int64_t rows = std::min(kQueryBlock, hi - i0);
      patterns_t.Multiply(false, rows, 1.0f, z.data<float>() + i0 * d, d, scores.data(), n);
      for (int64_t r = 0; r < rows; ++r) {
        float* row = scores.data() + r * n;
        const float top = internal::VecMax(row, n);
        inverse_sum[r] = 1.0f / internal::VecExp2Shifted(row, top, row, n);
      }
      float* o = out->data<float>() + i0 * d;
      patterns_n.Multiply(false, rows, 1.0f, scores.data(), n, o, d);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < d; ++j) o[r * d + j] *= inverse_sum[r];
      }
    }
  });
}

// Nearest pattern and energy of every fixed point, in float64: the dot
// products <x_j, xi_r> as one GEMM per block of fixed points.
template <typename T>
void NearestAndEnergy(const Tensor& patterns,
                      double beta,
                      const Tensor& fixed_points,
                      std::vector<int64_t>* nearest,
                      std::vector<double>* energy) {
  const int64_t n = patterns.dim(0), d = patterns.dim(1), q = fixed_points.dim(0);
  const RowMatrix<double> x =
      Eigen::Map<const RowMatrix<T>>(patterns.data<T>(), n, d).template cast<double>();
  nearest->assign(q, 0);
  energy->assign(q, 0.0);
  RowMatrix<double> dots;
  for (int64_t lo = 0; lo < q; lo += kRowsPerTask) {
    const int64_t rows = std::min(kRowsPerTask, q - lo);
    const RowMatrix<double> xi =
        Eigen::Map<const RowMatrix<T>>(fixed_points.data<T>() + lo * d, rows, d)
            .template cast<double>();
    dots.resize(rows, n);
    internal::Gemm<double>(false, true, rows, n, d, 1.0, xi.data(), d, x.data(), d, dots.data(), n);
    for (int64_t r = 0; r < rows; ++r) {
      Eigen::Index best = 0;
      const double top = dots.row(r).maxCoeff(&best);
      (*nearest)[lo + r] = best;
      // (1/beta) lse(beta s), shifted by the maximum for stability.
      const double lse = top + std::log((beta * (dots.row(r).array() - top)).exp().sum()) / beta;
      (*energy)[lo + r] = 0.5 * xi.row(r).squaredNorm() - lse;
    }
  }
}

}  // namespace

Var hopfield_update(const Var& xi, const Var& patterns, const Var& beta, const Var& mask) {
  SP_CHECK(xi.defined() && patterns.defined() && beta.defined(),
           "hopfield_update: xi, patterns and beta must be defined");
  const bool records = GradModeEnabled() && (xi.requires_grad() || patterns.requires_grad() ||
                                             beta.requires_grad() ||
                                             (mask.defined() && mask.requires_grad()));
  if (!records && !mask.defined() && xi.rank() == 2 && patterns.rank() == 2 &&
      beta.value().numel() == 1 && xi.dim(1) == patterns.dim(1) &&
      xi.dtype() == patterns.dtype()) {
    const double b = DispatchDType(beta.dtype(), [&](auto zero) {
      return static_cast<double>(beta.value().data<decltype(zero)>()[0]);
    });
    Tensor out(xi.shape(), xi.dtype());
    HopfieldUpdateInto(patterns.value(), b, xi.value(), &out);
    return constant(out);
  }
  Var scores = mul(matmul(xi, patterns, false, true), beta);
  if (mask.defined()) scores = add(scores, mask);
  return matmul(softmax(scores), patterns);
}

void HopfieldUpdateInto(const Tensor& patterns, double beta, const Tensor& z, Tensor* out) {
  SP_CHECK(patterns.rank() == 2 && z.rank() == 2 && patterns.dim(1) == z.dim(1) &&
               patterns.dtype() == z.dtype() && out->shape() == z.shape() &&
               out->dtype() == z.dtype(),
           "HopfieldUpdateInto: patterns ", patterns.shape(), ", queries ", z.shape(),
           " and output ", out->shape(), " must be [N, d], [Q, d] and [Q, d] of one dtype");
  DispatchDType(z.dtype(),
                [&](auto zero) { HopfieldMap<decltype(zero)>(patterns, beta, z, out); });
}

void HopfieldNearestAndEnergy(const Tensor& patterns,
                              double beta,
                              const Tensor& xi,
                              std::vector<int64_t>* nearest,
                              std::vector<double>* energy) {
  SP_CHECK(patterns.rank() == 2 && xi.rank() == 2 && patterns.dim(1) == xi.dim(1) &&
               patterns.dtype() == xi.dtype(),
           "HopfieldNearestAndEnergy: patterns ", patterns.shape(), " and states ", xi.shape(),
           " must be [N, d] and [Q, d] of one dtype");
  DispatchDType(patterns.dtype(), [&](auto zero) {
    NearestAndEnergy<decltype(zero)>(patterns, beta, xi, nearest, energy);
  });
}

}  // namespace stillpoint
