// Tensor-level kernels behind the elementwise and reduction ops (not part of
// the public API; ops.h is; the plain threaded loops are in
// framework/parallel_loops.h). They work on values only and record nothing, so
// fused VJPs and other kernels can reuse them.
//
// Broadcasting follows NumPy (see ops.h). Every kernel computes each output
// element independently (a reduction inside one output element runs in a
// fixed order), so results are bitwise identical for any thread count.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "framework/check.h"
#include "framework/parallel.h"
#include "framework/parallel_loops.h"
#include "framework/tensor.h"

namespace stillpoint {

// Defined in ops_elementwise.cc (declared in ops.h too).
Shape BroadcastShapes(const Shape& a, const Shape& b, const char* op);

namespace internal {

using Dims4 = std::array<int64_t, Shape::kMaxRank>;

// The extents of `shape` right-aligned into four slots, padded with 1s in
// front: [3, 4] -> {1, 1, 3, 4}.
inline Dims4 PaddedDims(const Shape& shape) {
  Dims4 dims{1, 1, 1, 1};
  const int offset = Shape::kMaxRank - shape.rank();
  for (int i = 0; i < shape.rank(); ++i) dims[offset + i] = shape.dim(i);
  return dims;
}

// Element strides of a row-major tensor of shape `in` when it is read as a
// tensor of the (broadcast) shape `out`, right-aligned into four slots: 0
// where `in` has extent 1 or lacks the axis, so the same element repeats.
inline Dims4 BroadcastStrides(const Shape& in, const Shape& out) {
  const Dims4 in_dims = PaddedDims(in);
  const Dims4 out_dims = PaddedDims(out);
  Dims4 strides{};
  int64_t stride = 1;
  for (int i = Shape::kMaxRank - 1; i >= 0; --i) {
    strides[i] = (in_dims[i] == 1 && out_dims[i] != 1) ? 0 : stride;
    stride *= in_dims[i];
  }
  return strides;
}

// True when `small`, with its leading 1s dropped, equals the trailing axes of
// `big` (a bias row [D] against [B, T, D], a mask [T, T] against
// [B, H, T, T]). Then small's flat index is big's flat index mod its numel.
inline bool IsTrailingSuffix(const Shape& small, const Shape& big) {
  int rank = small.rank();
  while (rank > 0 && small.dim(small.rank() - rank) == 1) --rank;
  if (rank > big.rank()) return false;
  for (int j = 1; j <= rank; ++j) {
    if (small.dim(-j) != big.dim(-j)) return false;
  }
  return true;
}

// out = fn(a, b) with a of shape sa, b of shape sb, out of the broadcast
// shape so (already validated). Picks the cheapest of: identical shapes (one
// flat loop), one operand a single element, one operand a trailing suffix of
// the other (rows against a repeated row), and a general strided walk.
template <typename T, typename Fn>
void BroadcastBinaryLoop(
    const T* a, const Shape& sa, const T* b, const Shape& sb, T* out, const Shape& so, Fn fn) {
  const int64_t n = so.numel();
  if (n == 0) return;
  const int64_t na = sa.numel();
  const int64_t nb = sb.numel();
  if (na == n && nb == n) {  // same numel under broadcasting means same extents
    BinaryLoop(a, b, out, n, fn);
    return;
  }
  if (nb == 1 && na == n) {
    const T bv = b[0];
    UnaryLoop(a, out, n, [&](T av) { return fn(av, bv); });
    return;
  }
  if (na == 1 && nb == n) {
    const T av = a[0];
    UnaryLoop(b, out, n, [&](T bv) { return fn(av, bv); });
    return;
  }
  if (na == n && IsTrailingSuffix(sb, so)) {
    const int64_t rows = n / nb;
    ParallelRange(0, rows, std::max<int64_t>(1, kMinChunk / nb), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const T* ar = a + r * nb;
        T* outr = out + r * nb;
        for (int64_t j = 0; j < nb; ++j) outr[j] = fn(ar[j], b[j]);
      }
    });
    return;
  }
  if (nb == n && IsTrailingSuffix(sa, so)) {
    const int64_t rows = n / na;
    ParallelRange(0, rows, std::max<int64_t>(1, kMinChunk / na), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const T* br = b + r * na;
        T* outr = out + r * na;
        for (int64_t j = 0; j < na; ++j) outr[j] = fn(a[j], br[j]);
      }
    });
    return;
  }
  // General case: walk the output row by row (rows of the last axis); each
  // row starts at offsets computed from its coordinates.
  const Dims4 d = PaddedDims(so);
  const Dims4 stride_a = BroadcastStrides(sa, so);
  const Dims4 stride_b = BroadcastStrides(sb, so);
  const int64_t inner = d[3];
  const int64_t rows = n / inner;
  ParallelRange(0, rows, std::max<int64_t>(1, kMinChunk / inner), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const int64_t i2 = r % d[2];
      const int64_t i1 = (r / d[2]) % d[1];
      const int64_t i0 = r / (d[2] * d[1]);
      const T* pa = a + i0 * stride_a[0] + i1 * stride_a[1] + i2 * stride_a[2];
      const T* pb = b + i0 * stride_b[0] + i1 * stride_b[1] + i2 * stride_b[2];
      T* po = out + r * inner;
      if (stride_a[3] != 0 && stride_b[3] != 0) {
        for (int64_t j = 0; j < inner; ++j) po[j] = fn(pa[j], pb[j]);
      } else if (stride_a[3] == 0 && stride_b[3] != 0) {
        const T av = *pa;
        for (int64_t j = 0; j < inner; ++j) po[j] = fn(av, pb[j]);
      } else if (stride_a[3] != 0) {
        const T bv = *pb;
        for (int64_t j = 0; j < inner; ++j) po[j] = fn(pa[j], bv);
      } else {
        std::fill_n(po, inner, fn(*pa, *pb));
      }
    }
  });
}

// A fresh tensor of x's shape and dtype holding fn(x) elementwise. fn is a
// generic callable, instantiated for float and double.
template <typename Fn>
Tensor MapUnary(const Tensor& x, Fn fn) {
  Tensor out(x.shape(), x.dtype());
  DispatchDType(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    UnaryLoop(x.data<T>(), out.data<T>(), x.numel(), [&](T v) { return static_cast<T>(fn(v)); });
  });
  return out;
}

// Checks that a and b share a dtype and broadcast, naming `op` otherwise.
inline Shape CheckBinary(const Tensor& a, const Tensor& b, const char* op) {
  SP_CHECK(a.defined() && b.defined(), op, ": undefined operand");
  SP_CHECK(a.dtype() == b.dtype(), op, ": dtype mismatch between ", ToString(a.dtype()), " ",
           a.shape(), " and ", ToString(b.dtype()), " ", b.shape());
  return BroadcastShapes(a.shape(), b.shape(), op);
}

// A fresh tensor of the broadcast shape of a and b holding fn(a, b).
template <typename Fn>
Tensor MapBinary(const Tensor& a, const Tensor& b, const char* op, Fn fn) {
  const Shape shape = CheckBinary(a, b, op);
  Tensor out(shape, a.dtype());
  DispatchDType(a.dtype(), [&](auto zero) {
    using T = decltype(zero);
    BroadcastBinaryLoop(a.data<T>(), a.shape(), b.data<T>(), b.shape(), out.data<T>(), shape,
                        [&](T u, T v) { return static_cast<T>(fn(u, v)); });
  });
  return out;
}

// fn(a, b, c) elementwise over three tensors of one shape and dtype (fused
// VJPs: g * f'(x, y)).
template <typename Fn>
Tensor MapTernary(const Tensor& a, const Tensor& b, const Tensor& c, const char* op, Fn fn) {
  SP_CHECK(a.shape() == b.shape() && a.shape() == c.shape() && a.dtype() == b.dtype() &&
               a.dtype() == c.dtype(),
           op, ": operands ", a.shape(), ", ", b.shape(), " and ", c.shape(),
           " must share shape and dtype");
  Tensor out(a.shape(), a.dtype());
  DispatchDType(a.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    const T* pc = c.data<T>();
    T* po = out.data<T>();
    ParallelRange(0, a.numel(), kMinChunk, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) po[i] = static_cast<T>(fn(pa[i], pb[i], pc[i]));
    });
  });
  return out;
}

// ---- reductions (implemented in ops_reduce.cc) ----

// x read as [outer, n, inner]; returns the sums over n as a tensor of
// `out_shape` (numel outer * inner). Accumulates in double.
Tensor SumMiddleAxis(
    const Tensor& x, int64_t outer, int64_t n, int64_t inner, const Shape& out_shape);
// Sums x down to `shape`, which must broadcast to x's shape.
Tensor SumToTensor(const Tensor& x, const Shape& shape);
// Repeats x to `shape`, to which x's shape must broadcast.
Tensor BroadcastToTensor(const Tensor& x, const Shape& shape);

// g o gelu'(x) from the derivative gelu'(x) kept at the forward pass: the
// VJP of gelu and linear_gelu without create_graph (ops_elementwise.cc).
// `op` names the caller in the error for mismatched shapes.
Tensor GeluGradient(const Tensor& g, const Tensor& derivative, const char* op);

}  // namespace internal
}  // namespace stillpoint
