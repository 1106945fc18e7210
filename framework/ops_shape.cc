// Shape and index ops: reshape (a view), transpose/permute, slice, concat,
// gather, embedding and masked_fill. Everything except reshape copies into a
// fresh tensor. The copies are parallelised over outer rows; every output
// entry is written by exactly one task, so results never depend on the
// thread count (the scatter-adds of gather's gradient also keep a fixed
// order of additions per entry).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "framework/ops.h"
#include "framework/parallel_loops.h"

namespace stillpoint {
namespace {

std::string VectorString(const std::vector<int64_t>& values) {
  std::string text = "[";
  for (std::size_t i = 0; i < values.size(); ++i) {
    text += (i ? ", " : "") + std::to_string(values[i]);
  }
  return text + "]";
}

std::string VectorString(const std::vector<int>& values) {
  return VectorString(std::vector<int64_t>(values.begin(), values.end()));
}

// The extents before and after `axis`: x is viewed as [outer, dim(axis), inner].
void SplitAtAxis(const Shape& shape, int axis, int64_t* outer, int64_t* inner) {
  *outer = 1;
  *inner = 1;
  for (int i = 0; i < axis; ++i) *outer *= shape[i];
  for (int i = axis + 1; i < shape.rank(); ++i) *inner *= shape[i];
}

Shape WithExtent(const Shape& shape, int axis, int64_t extent) {
  std::vector<int64_t> dims = shape.dims();
  dims[axis] = extent;
  return Shape(dims);
}

// Copies blocks of rows between tensors seen as [outer, extent, inner]:
// dst[o, dst_offset + j, :] = src[o, src_offset + j, :] for j < count.
void CopyAlongAxis(const Tensor& src,
                   int64_t src_extent,
                   int64_t src_offset,
                   Tensor* dst,
                   int64_t dst_extent,
                   int64_t dst_offset,
                   int64_t outer,
                   int64_t count,
                   int64_t inner) {
  if (outer == 0 || count == 0 || inner == 0) return;
  const std::size_t block_bytes = count * inner * SizeOf(src.dtype());
  DispatchDType(src.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* in = src.data<T>();
    T* out = dst->data<T>();
    ParallelFor(0, outer, MinChunk(count * inner), [&](int64_t begin, int64_t end) {
      for (int64_t o = begin; o < end; ++o) {
        std::memcpy(out + (o * dst_extent + dst_offset) * inner,
                    in + (o * src_extent + src_offset) * inner, block_bytes);
      }
    });
  });
}

// The adjoint of slice: g placed at [begin, begin + g.dim(axis)) along axis
// of a zero tensor of `shape`.
Var SliceGrad(const Var& g, const Shape& shape, int axis, int64_t begin) {
  Tensor out = Tensor::Zeros(shape, g.dtype());
  int64_t outer, inner;
  SplitAtAxis(shape, axis, &outer, &inner);
  const int64_t count = g.shape()[axis];
  Tensor g_value = g.value();
  CopyAlongAxis(g_value, count, 0, &out, shape[axis], begin, outer, count, inner);
  return RecordOp("slice_grad", out, {g},
                  [axis, begin, count](const VarList&, const Var&, const Var& gg) {
                    return VarList{slice(gg, axis, begin, begin + count)};
                  });
}

// The adjoint of gather: out[..., indices[j], ...] += g[..., j, ...], with
// out of `shape` and zero elsewhere.
Var GatherGrad(const Var& g, const Shape& shape, int axis, const std::vector<int64_t>& indices) {
  Tensor out = Tensor::Zeros(shape, g.dtype());
  int64_t outer, inner;
  SplitAtAxis(shape, axis, &outer, &inner);
  const int64_t extent = shape[axis];
  const int64_t picked = static_cast<int64_t>(indices.size());
  DispatchDType(g.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* in = g.value().data<T>();
    T* acc = out.data<T>();
    // Each task owns whole outer rows; within a row the additions happen in
    // the order of j, whatever the thread count.
    ParallelFor(0, outer, MinChunk(picked * inner), [&](int64_t begin, int64_t end) {
      for (int64_t o = begin; o < end; ++o) {
        for (int64_t j = 0; j < picked; ++j) {
          const T* src = in + (o * picked + j) * inner;
          T* dst = acc + (o * extent + indices[j]) * inner;
          for (int64_t i = 0; i < inner; ++i) dst[i] += src[i];
        }
      }
    });
  });
  return RecordOp("gather_grad", out, {g},
                  [axis, indices](const VarList&, const Var&, const Var& gg) {
                    return VarList{gather(gg, axis, indices)};
                  });
}

// A gather along `axis` on tensors (no graph); indices already checked.
Tensor GatherValue(const Tensor& x,
                   int axis,
                   const std::vector<int64_t>& indices,
                   const Shape& out_shape) {
  Tensor out(out_shape, x.dtype());
  int64_t outer, inner;
  SplitAtAxis(x.shape(), axis, &outer, &inner);
  const int64_t extent = x.shape()[axis];
  const int64_t picked = static_cast<int64_t>(indices.size());
  if (out.numel() == 0) return out;
  const std::size_t row_bytes = inner * SizeOf(x.dtype());
  DispatchDType(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* in = x.data<T>();
    T* dst = out.data<T>();
    ParallelFor(0, outer * picked, MinChunk(inner), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const int64_t o = r / picked;
        const int64_t j = r % picked;
        std::memcpy(dst + r * inner, in + (o * extent + indices[j]) * inner, row_bytes);
      }
    });
  });
  return out;
}

void CheckIndices(const char* op,
                  const Shape& shape,
                  int axis,
                  const std::vector<int64_t>& indices) {
  const int64_t extent = shape[axis];
  for (std::size_t j = 0; j < indices.size(); ++j) {
    SP_CHECK(indices[j] >= 0 && indices[j] < extent, op, ": index ", indices[j], " (position ", j,
             ") is out of range [0, ", extent, ") for axis ", axis, " of shape ", shape);
  }
}

}  // namespace

// ------------------------------------------------------------------ reshape

Var reshape(const Var& x, const Shape& shape) {
  SP_CHECK(x.defined(), "reshape: input is undefined");
  SP_CHECK(shape.numel() == x.numel(), "reshape: cannot view ", x.shape(), " (", x.numel(),
           " entries) as ", shape, " (", shape.numel(), " entries)");
  const Shape in_shape = x.shape();
  return RecordOp("reshape", x.value().Reshape(shape), {x},
                  [in_shape](const VarList&, const Var&, const Var& g) {
                    return VarList{reshape(g, in_shape)};
                  });
}

// ------------------------------------------------------- transpose, permute

Var transpose(const Var& x, int axis0, int axis1) {
  SP_CHECK(x.defined(), "transpose: input is undefined");
  SP_CHECK(axis0 >= -x.rank() && axis0 < x.rank() && axis1 >= -x.rank() && axis1 < x.rank(),
           "transpose: axes (", axis0, ", ", axis1, ") out of range for shape ", x.shape());
  std::vector<int> perm(x.rank());
  for (int i = 0; i < x.rank(); ++i) perm[i] = i;
  std::swap(perm[x.shape().Axis(axis0)], perm[x.shape().Axis(axis1)]);
  return permute(x, perm);
}

Var permute(const Var& x, const std::vector<int>& perm) {
  SP_CHECK(x.defined(), "permute: input is undefined");
  const Shape& in_shape = x.shape();
  const int rank = in_shape.rank();
  std::vector<int> axes(perm.size());
  std::vector<bool> seen(rank, false);
  bool valid = static_cast<int>(perm.size()) == rank;
  for (std::size_t i = 0; valid && i < perm.size(); ++i) {
    const int a = perm[i] < 0 ? perm[i] + rank : perm[i];
    valid = a >= 0 && a < rank && !seen[a];
    if (valid) {
      seen[a] = true;
      axes[i] = a;
    }
  }
  SP_CHECK(valid, "permute: ", VectorString(perm), " is not a permutation of the axes of shape ",
           in_shape);

  // Pad to rank 4 with leading unit axes; stride[i] is the input stride of
  // output axis i.
  constexpr int kRank = Shape::kMaxRank;
  int64_t in_strides[kRank];
  int64_t stride = 1;
  for (int i = rank - 1; i >= 0; --i) {
    in_strides[i] = stride;
    stride *= in_shape[i];
  }
  int64_t out_dims[kRank] = {1, 1, 1, 1};
  int64_t strides[kRank] = {0, 0, 0, 0};
  std::vector<int64_t> out_dim_list(rank);
  for (int i = 0; i < rank; ++i) {
    out_dims[kRank - rank + i] = in_shape[axes[i]];
    strides[kRank - rank + i] = in_strides[axes[i]];
    out_dim_list[i] = in_shape[axes[i]];
  }
  Tensor out(Shape(out_dim_list), x.dtype());
  DispatchDType(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* in = x.value().data<T>();
    T* dst = out.data<T>();
    const int64_t plane = out_dims[2] * out_dims[3];
    ParallelFor(0, out_dims[0] * out_dims[1], MinChunk(plane), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const int64_t i0 = r / out_dims[1];
        const int64_t i1 = r % out_dims[1];
        const T* base = in + i0 * strides[0] + i1 * strides[1];
        T* row = dst + r * plane;
        for (int64_t i2 = 0; i2 < out_dims[2]; ++i2) {
          const T* src = base + i2 * strides[2];
          for (int64_t i3 = 0; i3 < out_dims[3]; ++i3) *row++ = src[i3 * strides[3]];
        }
      }
    });
  });

  std::vector<int> inverse(rank);
  for (int i = 0; i < rank; ++i) inverse[axes[i]] = i;
  return RecordOp("permute", out, {x}, [inverse](const VarList&, const Var&, const Var& g) {
    return VarList{permute(g, inverse)};
  });
}

// -------------------------------------------------------------- slice, concat

Var slice(const Var& x, int axis, int64_t begin, int64_t end) {
  SP_CHECK(x.defined(), "slice: input is undefined");
  const Shape in_shape = x.shape();
  SP_CHECK(axis >= -in_shape.rank() && axis < in_shape.rank(), "slice: axis ", axis,
           " out of range for shape ", in_shape);
  const int ax = in_shape.Axis(axis);
  SP_CHECK(0 <= begin && begin <= end && end <= in_shape[ax], "slice: range [", begin, ", ", end,
           ") is out of bounds for axis ", ax, " of shape ", in_shape);
  int64_t outer, inner;
  SplitAtAxis(in_shape, ax, &outer, &inner);
  Tensor out(WithExtent(in_shape, ax, end - begin), x.dtype());
  CopyAlongAxis(x.value(), in_shape[ax], begin, &out, end - begin, 0, outer, end - begin, inner);
  return RecordOp("slice", out, {x},
                  [in_shape, ax, begin](const VarList&, const Var&, const Var& g) {
                    return VarList{SliceGrad(g, in_shape, ax, begin)};
                  });
}

Var concat(const VarList& parts, int axis) {
  SP_CHECK(!parts.empty(), "concat: no inputs");
  for (std::size_t p = 0; p < parts.size(); ++p) {
    SP_CHECK(parts[p].defined(), "concat: input ", p, " is undefined");
  }
  const Shape& first = parts[0].shape();
  SP_CHECK(axis >= -first.rank() && axis < first.rank(), "concat: axis ", axis,
           " out of range for shape ", first);
  const int ax = first.Axis(axis);
  int64_t total = 0;
  std::vector<int64_t> extents;
  for (std::size_t p = 0; p < parts.size(); ++p) {
    const Shape& s = parts[p].shape();
    SP_CHECK(parts[p].dtype() == parts[0].dtype(), "concat: input ", p, " ", s, " is ",
             ToString(parts[p].dtype()), " but input 0 ", first, " is ",
             ToString(parts[0].dtype()));
    bool fits = s.rank() == first.rank();
    for (int i = 0; fits && i < s.rank(); ++i) fits = i == ax || s[i] == first[i];
    SP_CHECK(fits, "concat: input ", p, " has shape ", s, ", which does not match input 0 ", first,
             " outside axis ", ax);
    extents.push_back(s[ax]);
    total += s[ax];
  }
  int64_t outer, inner;
  SplitAtAxis(first, ax, &outer, &inner);
  Tensor out(WithExtent(first, ax, total), parts[0].dtype());
  int64_t offset = 0;
  for (std::size_t p = 0; p < parts.size(); ++p) {
    CopyAlongAxis(parts[p].value(), extents[p], 0, &out, total, offset, outer, extents[p], inner);
    offset += extents[p];
  }
  return RecordOp("concat", out, parts, [ax, extents](const VarList& in, const Var&, const Var& g) {
    VarList grads(in.size());
    int64_t start = 0;
    for (std::size_t p = 0; p < in.size(); ++p) {
      if (WantsInputGrad(in, p)) {
        grads[p] = slice(g, ax, start, start + extents[p]);
      }
      start += extents[p];
    }
    return grads;
  });
}

// ------------------------------------------------------------------ gather

Var gather(const Var& x, int axis, const std::vector<int64_t>& indices) {
  SP_CHECK(x.defined(), "gather: input is undefined");
  const Shape in_shape = x.shape();
  SP_CHECK(axis >= -in_shape.rank() && axis < in_shape.rank(), "gather: axis ", axis,
           " out of range for shape ", in_shape);
  const int ax = in_shape.Axis(axis);
  CheckIndices("gather", in_shape, ax, indices);
  const Shape out_shape = WithExtent(in_shape, ax, static_cast<int64_t>(indices.size()));
  Tensor out = GatherValue(x.value(), ax, indices, out_shape);
  return RecordOp("gather", out, {x},
                  [in_shape, ax, indices](const VarList&, const Var&, const Var& g) {
                    return VarList{GatherGrad(g, in_shape, ax, indices)};
                  });
}

Var embedding(const Var& table, const std::vector<int64_t>& ids, const Shape& ids_shape) {
  SP_CHECK(table.defined(), "embedding: table is undefined");
  const Shape table_shape = table.shape();
  SP_CHECK(table_shape.rank() == 2, "embedding: table must be [V, D], got ", table_shape);
  SP_CHECK(static_cast<int64_t>(ids.size()) == ids_shape.numel(), "embedding: ", ids.size(),
           " ids for ids_shape ", ids_shape, " (", ids_shape.numel(), " entries)");
  SP_CHECK(ids_shape.rank() < Shape::kMaxRank, "embedding: ids_shape ", ids_shape,
           " leaves no room for the embedding axis (max rank ", Shape::kMaxRank, ")");
  for (std::size_t j = 0; j < ids.size(); ++j) {
    SP_CHECK(ids[j] >= 0 && ids[j] < table_shape[0], "embedding: id ", ids[j], " (position ", j,
             ") is out of range [0, ", table_shape[0], ") for table ", table_shape);
  }
  const int64_t count = static_cast<int64_t>(ids.size());
  const int64_t width = table_shape[1];
  std::vector<int64_t> out_dims = ids_shape.dims();
  out_dims.push_back(width);
  Tensor rows = GatherValue(table.value(), 0, ids, Shape{count, width});
  return RecordOp(
      "embedding", rows.Reshape(Shape(out_dims)), {table},
      [table_shape, ids, count, width](const VarList&, const Var&, const Var& g) {
        return VarList{GatherGrad(reshape(g, Shape{count, width}), table_shape, 0, ids)};
      });
}

// ------------------------------------------------------------- masked_fill

Var masked_fill(const Var& x, const Tensor& mask, double value) {
  SP_CHECK(x.defined() && mask.defined(), "masked_fill: an input is undefined");
  const Shape& shape = x.shape();
  const Shape& mask_shape = mask.shape();
  bool fits = mask_shape.rank() <= shape.rank();
  for (int i = 1; fits && i <= mask_shape.rank(); ++i) {
    fits = mask_shape[-i] == 1 || mask_shape[-i] == shape[-i];
  }
  SP_CHECK(fits, "masked_fill: mask ", mask_shape, " does not broadcast to x ", shape);

  // Output index -> mask index: padded rank-4 strides, zero where the mask
  // is broadcast.
  constexpr int kRank = Shape::kMaxRank;
  int64_t dims[kRank] = {1, 1, 1, 1};
  int64_t mask_strides[kRank] = {0, 0, 0, 0};
  int64_t stride = 1;
  for (int i = 1; i <= shape.rank(); ++i) {
    dims[kRank - i] = shape[-i];
    if (i <= mask_shape.rank()) {
      mask_strides[kRank - i] = mask_shape[-i] == 1 ? 0 : stride;
      stride *= mask_shape[-i];
    }
  }
  Tensor out(shape, x.dtype());
  DispatchDType(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    DispatchDType(mask.dtype(), [&](auto mask_zero) {
      using M = decltype(mask_zero);
      const T* in = x.value().data<T>();
      const M* mask_data = mask.data<M>();
      T* dst = out.data<T>();
      const T fill = static_cast<T>(value);
      const int64_t plane = dims[2] * dims[3];
      ParallelFor(0, dims[0] * dims[1], MinChunk(plane), [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const M* mask_row =
              mask_data + (r / dims[1]) * mask_strides[0] + (r % dims[1]) * mask_strides[1];
          int64_t flat = r * plane;
          for (int64_t i2 = 0; i2 < dims[2]; ++i2) {
            for (int64_t i3 = 0; i3 < dims[3]; ++i3, ++flat) {
              const bool masked = mask_row[i2 * mask_strides[2] + i3 * mask_strides[3]] != M{0};
              dst[flat] = masked ? fill : in[flat];
            }
          }
        }
      });
    });
  });
  return RecordOp("masked_fill", out, {x}, [mask](const VarList&, const Var&, const Var& g) {
    return VarList{masked_fill(g, mask, 0.0)};
  });
}

}  // namespace stillpoint
