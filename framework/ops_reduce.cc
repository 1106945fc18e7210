// Reductions (sum, mean, max) and the broadcast_to / sum_to pair.
//
// Every reduction reads its input as [outer, n, inner] and reduces over n.
// Sums accumulate in double. Each output element is reduced in a fixed order
// that depends only on the shapes, so results do not change with the thread
// count; long rows are split into fixed blocks of internal::kMinChunk whose
// partial sums are added in order.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "framework/kernels/elementwise_kernels.h"
#include "framework/ops.h"

namespace stillpoint {
namespace internal {
namespace {

// Sum of p[0..n) with four independent accumulators (for instruction-level
// parallelism), combined in a fixed order.
template <typename T>
double SumContiguous(const T* p, int64_t n) {
  double acc[4] = {0.0, 0.0, 0.0, 0.0};
  int64_t k = 0;
  for (; k + 4 <= n; k += 4) {
    acc[0] += p[k];
    acc[1] += p[k + 1];
    acc[2] += p[k + 2];
    acc[3] += p[k + 3];
  }
  for (; k < n; ++k) acc[0] += p[k];
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

// The widest block of columns SumColumns sums at once: 32 float64
// accumulators (eight AVX registers) are enough independent add chains to
// hide the latency of the adds.
constexpr int64_t kColumnBlock = 32;

// out[i] = sum over k = 0, 1, ..., n - 1 (in that order) of x[k * stride + i],
// for i in [0, kWidth), accumulated in double. The width is a compile-time
// constant so the accumulators live in registers and the loop over i
// vectorises; each column is still one sequential chain of adds.
template <int64_t kWidth, typename T>
void SumColumnBlock(const T* x, int64_t n, int64_t stride, T* out) {
  double acc[kWidth] = {};
  for (int64_t k = 0; k < n; ++k) {
    const T* row = x + k * stride;
    for (int64_t i = 0; i < kWidth; ++i) acc[i] += static_cast<double>(row[i]);
  }
  for (int64_t i = 0; i < kWidth; ++i) out[i] = static_cast<T>(acc[i]);
}

// Column sums of the [n, width] block at x (row stride `stride`) into
// out[0, width): full blocks of kColumnBlock, then the rest in blocks of
// 16, 8, 4, 2 and 1. How the columns are grouped does not change any sum.
template <typename T>
void SumColumns(const T* x, int64_t n, int64_t stride, int64_t width, T* out) {
  int64_t i = 0;
  for (; i + kColumnBlock <= width; i += kColumnBlock) {
    SumColumnBlock<kColumnBlock>(x + i, n, stride, out + i);
  }
  if (width - i >= 16) {
    SumColumnBlock<16>(x + i, n, stride, out + i);
    i += 16;
  }
  if (width - i >= 8) {
    SumColumnBlock<8>(x + i, n, stride, out + i);
    i += 8;
  }
  if (width - i >= 4) {
    SumColumnBlock<4>(x + i, n, stride, out + i);
    i += 4;
  }
  if (width - i >= 2) {
    SumColumnBlock<2>(x + i, n, stride, out + i);
    i += 2;
  }
  if (width - i >= 1) SumColumnBlock<1>(x + i, n, stride, out + i);
}

// out[o, i] = sum_k x[o, k, i], each in float64 and in ascending k.
template <typename T>
void SumMiddle(const T* x, T* out, int64_t outer, int64_t n, int64_t inner) {
  if (inner == 1 && n > kMinChunk) {
    // Few long rows: fixed blocks summed in parallel, then combined in order.
    const int64_t blocks = (n + kMinChunk - 1) / kMinChunk;
    std::vector<double> partial(outer * blocks);
    ParallelRange(0, outer * blocks, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t p = lo; p < hi; ++p) {
        const int64_t row = p / blocks;
        const int64_t begin = (p % blocks) * kMinChunk;
        const int64_t end = std::min(n, begin + kMinChunk);
        partial[p] = SumContiguous(x + row * n + begin, end - begin);
      }
    });
    for (int64_t row = 0; row < outer; ++row) {
      double acc = 0.0;
      for (int64_t b = 0; b < blocks; ++b) acc += partial[row * blocks + b];
      out[row] = static_cast<T>(acc);
    }
    return;
  }
  const int64_t min_chunk = std::max<int64_t>(1, kMinChunk / std::max<int64_t>(n, 1));
  if (inner == 1) {
    ParallelRange(0, outer, min_chunk, [&](int64_t lo, int64_t hi) {
      for (int64_t row = lo; row < hi; ++row) {
        out[row] = static_cast<T>(SumContiguous(x + row * n, n));
      }
    });
    return;
  }
  // Each chunk covers output entries [lo, hi) of [outer, inner]; within one
  // outer index the columns [i0, i0 + width) are summed over n in column blocks.
  // A chunk gets at least a whole column block where there is one: each
  // column is a single chain of dependent adds, so a narrow chunk waits on
  // add latency where a wide one keeps kColumnBlock chains going, and
  // narrow chunks split the cache lines of a row between threads (on W2's
  // bias gradients narrow chunks made two threads slower than one:
  // bench/RESULTS.md).
  const int64_t column_chunk = std::max(min_chunk, std::min(inner, kColumnBlock));
  ParallelRange(0, outer * inner, column_chunk, [&](int64_t lo, int64_t hi) {
    for (int64_t f = lo; f < hi;) {
      const int64_t o = f / inner;
      const int64_t i0 = f % inner;
      const int64_t width = std::min(inner, i0 + (hi - f)) - i0;
      SumColumns(x + o * n * inner + i0, n, inner, width, out + o * inner + i0);
      f += width;
    }
  });
}

// NaN wins (it propagates); otherwise only a strictly larger value replaces
// the current best, so the first maximal entry is kept.
template <typename T>
bool Beats(T candidate, T best) {
  return candidate > best || (candidate != candidate && best == best);
}

// out[o, i] = max_k x[o, k, i] (n >= 1).
template <typename T>
void MaxMiddle(const T* x, T* out, int64_t outer, int64_t n, int64_t inner) {
  const int64_t min_chunk = std::max<int64_t>(1, kMinChunk / n);
  if (inner == 1) {  // contiguous rows
    ParallelRange(0, outer, min_chunk, [&](int64_t lo, int64_t hi) {
      for (int64_t row = lo; row < hi; ++row) {
        const T* p = x + row * n;
        T best = p[0];
        for (int64_t k = 1; k < n; ++k) {
          if (Beats(p[k], best)) best = p[k];
        }
        out[row] = best;
      }
    });
    return;
  }
  ParallelRange(0, outer * inner, min_chunk, [&](int64_t lo, int64_t hi) {
    for (int64_t f = lo; f < hi;) {
      const int64_t o = f / inner;
      const int64_t i0 = f % inner;
      const int64_t width = std::min(inner, i0 + (hi - f)) - i0;
      T* dst = out + o * inner + i0;
      std::copy_n(x + o * n * inner + i0, width, dst);
      for (int64_t k = 1; k < n; ++k) {
        const T* row = x + (o * n + k) * inner + i0;
        for (int64_t i = 0; i < width; ++i) {
          if (Beats(row[i], dst[i])) dst[i] = row[i];
        }
      }
      f += width;
    }
  });
}

// A tensor of x's shape with 1 at the first maximal entry of every
// [o, :, i] line and 0 elsewhere.
template <typename T>
void ArgmaxMaskMiddle(const T* x, T* mask, int64_t outer, int64_t n, int64_t inner) {
  std::fill_n(mask, outer * n * inner, T(0));
  const int64_t min_chunk = std::max<int64_t>(1, kMinChunk / n);
  ParallelRange(0, outer * inner, min_chunk, [&](int64_t lo, int64_t hi) {
    for (int64_t f = lo; f < hi; ++f) {
      const int64_t o = f / inner;
      const int64_t i = f % inner;
      const T* line = x + o * n * inner + i;
      int64_t best_k = 0;
      for (int64_t k = 1; k < n; ++k) {
        if (Beats(line[k * inner], line[best_k * inner])) best_k = k;
      }
      mask[o * n * inner + best_k * inner + i] = T(1);
    }
  });
}

// Whether a tensor of shape `from` broadcasts to exactly `to`.
bool BroadcastsTo(const Shape& from, const Shape& to) {
  if (from.rank() > to.rank()) return false;
  for (int j = 1; j <= from.rank(); ++j) {
    if (from.dim(-j) != 1 && from.dim(-j) != to.dim(-j)) return false;
  }
  return true;
}

}  // namespace

Tensor SumMiddleAxis(
    const Tensor& x, int64_t outer, int64_t n, int64_t inner, const Shape& out_shape) {
  Tensor out(out_shape, x.dtype());
  DispatchDType(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    SumMiddle(x.data<T>(), out.data<T>(), outer, n, inner);
  });
  return out;
}

Tensor SumToTensor(const Tensor& x, const Shape& shape) {
  SP_CHECK(BroadcastsTo(shape, x.shape()), "sum_to: cannot sum shape ", x.shape(), " down to ",
           shape, " (", shape, " must broadcast to ", x.shape(), ")");
  if (x.shape() == shape) return x;
  const Dims4 target = PaddedDims(shape);
  Dims4 current = PaddedDims(x.shape());
  Tensor result = x;
  // Reduce each maximal run of axes whose target extent is 1 as one middle
  // block (the run [0, 2) of [B, T, D] -> [D] is a single [1, B*T, D] sum).
  int axis = 0;
  while (axis < Shape::kMaxRank) {
    if (target[axis] != 1) {
      ++axis;
      continue;
    }
    const int begin = axis;
    while (axis < Shape::kMaxRank && target[axis] == 1) ++axis;
    int64_t outer = 1, n = 1, inner = 1;
    for (int i = 0; i < begin; ++i) outer *= current[i];
    for (int i = begin; i < axis; ++i) n *= current[i];
    for (int i = axis; i < Shape::kMaxRank; ++i) inner *= current[i];
    if (n == 1) continue;
    for (int i = begin; i < axis; ++i) current[i] = 1;
    result = SumMiddleAxis(result, outer, n, inner,
                           Shape({current[0], current[1], current[2], current[3]}));
  }
  // A view when only extent-1 axes differed and nothing was summed.
  return result.Reshape(shape);
}

Tensor BroadcastToTensor(const Tensor& x, const Shape& shape) {
  SP_CHECK(BroadcastsTo(x.shape(), shape), "broadcast_to: shape ", x.shape(),
           " does not broadcast to ", shape);
  Tensor out(shape, x.dtype());
  const int64_t total = shape.numel();
  const int64_t nx = x.numel();
  if (total == 0) return out;
  DispatchDType(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* src = x.data<T>();
    T* dst = out.data<T>();
    if (nx == total) {
      std::memcpy(dst, src, total * sizeof(T));
    } else if (nx == 1) {
      const T v = src[0];
      ParallelRange(0, total, kMinChunk,
                    [&](int64_t lo, int64_t hi) { std::fill(dst + lo, dst + hi, v); });
    } else if (IsTrailingSuffix(x.shape(), shape)) {
      ParallelRange(0, total / nx, std::max<int64_t>(1, kMinChunk / nx),
                    [&](int64_t lo, int64_t hi) {
                      for (int64_t r = lo; r < hi; ++r)
                        std::memcpy(dst + r * nx, src, nx * sizeof(T));
                    });
    } else {
      const Dims4 d = PaddedDims(shape);
      const Dims4 stride = BroadcastStrides(x.shape(), shape);
      const int64_t inner = d[3];
      ParallelRange(0, total / inner, std::max<int64_t>(1, kMinChunk / inner),
                    [&](int64_t lo, int64_t hi) {
                      for (int64_t r = lo; r < hi; ++r) {
                        const int64_t i2 = r % d[2];
                        const int64_t i1 = (r / d[2]) % d[1];
                        const int64_t i0 = r / (d[2] * d[1]);
                        const T* from = src + i0 * stride[0] + i1 * stride[1] + i2 * stride[2];
                        T* to = dst + r * inner;
                        if (stride[3] == 0) {
                          std::fill_n(to, inner, *from);
                        } else {
                          std::copy_n(from, inner, to);
                        }
                      }
                    });
    }
  });
  return out;
}

}  // namespace internal

namespace {

// x's shape split around one axis: [outer, n, inner], and the reduced shape
// with the axis kept (extent 1) or dropped.
struct AxisSplit {
  int axis = 0;
  int64_t outer = 1;
  int64_t n = 1;
  int64_t inner = 1;
  Shape kept;
  Shape dropped;
};

AxisSplit SplitAtAxis(const Shape& shape, int axis, const char* op) {
  SP_CHECK(axis >= -shape.rank() && axis < shape.rank(), op, ": axis ", axis,
           " is out of range for shape ", shape);
  AxisSplit split;
  split.axis = axis < 0 ? axis + shape.rank() : axis;
  std::vector<int64_t> dims = shape.dims();
  for (int i = 0; i < split.axis; ++i) split.outer *= dims[i];
  split.n = dims[split.axis];
  for (int i = split.axis + 1; i < shape.rank(); ++i) split.inner *= dims[i];
  dims[split.axis] = 1;
  split.kept = Shape(dims);
  dims.erase(dims.begin() + split.axis);
  split.dropped = Shape(dims);
  return split;
}

// Repeats g (x's shape with `axis` dropped) along that axis to `shape`: the
// adjoint of sum(., axis, keepdim = false).
Var ExpandAxis(const Var& g, const Shape& shape, int axis) {
  const AxisSplit split = SplitAtAxis(shape, axis, "expand_axis");
  SP_CHECK(g.shape() == split.dropped, "expand_axis: gradient of shape ", g.shape(),
           " does not match ", shape, " without axis ", axis);
  Tensor out = internal::BroadcastToTensor(g.value().Reshape(split.kept), shape);
  return RecordOp("expand_axis", out, {g},
                  [axis](const VarList& in, const Var& self, const Var& gg) {
                    return VarList{sum(gg, axis, /*keepdim=*/false)};
                  });
}

// The gradient of a reduction over `axis` spread back to x's shape.
Var SpreadOverAxis(const Var& g, const Shape& shape, int axis, bool keepdim) {
  return keepdim ? broadcast_to(g, shape) : ExpandAxis(g, shape, axis);
}

}  // namespace

// ------------------------------------------------------------ reductions

Var sum(const Var& x) {
  Tensor out = internal::SumMiddleAxis(x.value(), 1, x.numel(), 1, Shape{});
  return RecordOp("sum", out, {x}, [](const VarList& in, const Var& self, const Var& g) {
    return VarList{broadcast_to(g, in[0].shape())};
  });
}

Var mean(const Var& x) {
  const int64_t n = x.numel();
  Tensor out = internal::SumMiddleAxis(x.value(), 1, n, 1, Shape{});
  out.set(0, out.at(0) / static_cast<double>(n));
  return RecordOp("mean", out, {x}, [n](const VarList& in, const Var& self, const Var& g) {
    return VarList{broadcast_to(mul_scalar(g, 1.0 / static_cast<double>(n)), in[0].shape())};
  });
}

Var sum(const Var& x, int axis, bool keepdim) {
  const AxisSplit split = SplitAtAxis(x.shape(), axis, "sum");
  Tensor out = internal::SumMiddleAxis(x.value(), split.outer, split.n, split.inner,
                                       keepdim ? split.kept : split.dropped);
  const int resolved = split.axis;
  return RecordOp("sum_axis", out, {x},
                  [resolved, keepdim](const VarList& in, const Var& self, const Var& g) {
                    return VarList{SpreadOverAxis(g, in[0].shape(), resolved, keepdim)};
                  });
}

Var mean(const Var& x, int axis, bool keepdim) {
  const AxisSplit split = SplitAtAxis(x.shape(), axis, "mean");
  Tensor out = internal::SumMiddleAxis(x.value(), split.outer, split.n, split.inner,
                                       keepdim ? split.kept : split.dropped);
  const double scale = 1.0 / static_cast<double>(split.n);
  DispatchDType(out.dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* p = out.data<T>();
    // Divide (rather than multiply by 1/n) so mean of n equal values is exact.
    const T count = static_cast<T>(split.n);
    for (int64_t i = 0; i < out.numel(); ++i) p[i] /= count;
  });
  const int resolved = split.axis;
  return RecordOp(
      "mean_axis", out, {x},
      [resolved, keepdim, scale](const VarList& in, const Var& self, const Var& g) {
        return VarList{SpreadOverAxis(mul_scalar(g, scale), in[0].shape(), resolved, keepdim)};
      });
}

Var max(const Var& x, int axis, bool keepdim) {
  const AxisSplit split = SplitAtAxis(x.shape(), axis, "max");
  SP_CHECK(split.n > 0, "max: axis ", axis, " of shape ", x.shape(), " is empty");
  Tensor out(keepdim ? split.kept : split.dropped, x.dtype());
  DispatchDType(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    internal::MaxMiddle(x.value().data<T>(), out.data<T>(), split.outer, split.n, split.inner);
  });
  return RecordOp(
      "max", out, {x}, [split, keepdim](const VarList& in, const Var& self, const Var& g) {
        const Tensor& xv = in[0].value();
        Tensor mask(xv.shape(), xv.dtype());
        DispatchDType(xv.dtype(), [&](auto zero) {
          using T = decltype(zero);
          internal::ArgmaxMaskMiddle(xv.data<T>(), mask.data<T>(), split.outer, split.n,
                                     split.inner);
        });
        // The mask is piecewise constant in x, so it enters as a constant.
        return VarList{mul(SpreadOverAxis(g, xv.shape(), split.axis, keepdim), constant(mask))};
      });
}

Var sum_to(const Var& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  Tensor out = internal::SumToTensor(x.value(), shape);
  return RecordOp("sum_to", out, {x}, [](const VarList& in, const Var& self, const Var& g) {
    return VarList{broadcast_to(g, in[0].shape())};
  });
}

Var broadcast_to(const Var& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  Tensor out = internal::BroadcastToTensor(x.value(), shape);
  return RecordOp("broadcast_to", out, {x}, [](const VarList& in, const Var& self, const Var& g) {
    return VarList{sum_to(g, in[0].shape())};
  });
}

}  // namespace stillpoint
