// Matrix products. The kernels are GEMMs (framework/kernels/gemm.h: OpenBLAS or
// Eigen) on the tensors' row-major storage; each GEMM runs single-threaded
// and ParallelFor spreads independent products over the threads.
//
// Determinism: the work is cut into units whose boundaries depend only on
// the shapes (one batch entry, a fixed block of output rows, or of columns),
// never on the thread count, and each unit is one GEMM writing its own
// block. So a result is bitwise identical for any number of threads.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <type_traits>
#include <vector>

#include "framework/kernels/elementwise_kernels.h"
#include "framework/kernels/gemm.h"
#include "framework/ops.h"
#include "framework/parallel.h"
#include "framework/kernels/vector_math.h"

namespace stillpoint {
namespace {

// Output rows per work unit: 22 row tiles of the packed kernel (6 rows
// each), so only a product's last unit ends in a partial tile. Units of
// one product share one packing of B (see MatmulValue), so small units cost
// no extra packing; small units let the threads finish a region together,
// so less time is spent waiting at the end of a large product
// (bench/RESULTS.md).
constexpr int64_t kRowsPerUnit = 132;
// Columns per work unit when a product is cut into column blocks.
constexpr int64_t kMinColsPerUnit = 32;
// A weight gradient cut into column blocks is also cut along its depth into
// parts of at least this many rows, until it has kMinSplitUnits units.
constexpr int64_t kMinDepthPerPart = 512;
constexpr int64_t kMinSplitUnits = 8;
// Roughly how many multiply-adds a task should get before splitting pays.
constexpr int64_t kFlopsPerTask = 1 << 15;

// The problem after resolving ranks and transposes: `batch` products
// C_i = op(A_i) op(B_i) with op(A_i) [m, k], op(B_i) [k, n]. When b_shared,
// every i uses the same B.
struct MatmulGeometry {
  int64_t batch = 1;
  int64_t m = 0;
  int64_t k = 0;
  int64_t n = 0;
  bool b_shared = false;
  Shape out_shape;
};

MatmulGeometry ResolveMatmul(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b) {
  SP_CHECK(a.defined() && b.defined(), "matmul: an input is undefined");
  const Shape& sa = a.shape();
  const Shape& sb = b.shape();
  SP_CHECK(a.dtype() == b.dtype(), "matmul: dtypes differ: a ", sa, " is ", ToString(a.dtype()),
           ", b ", sb, " is ", ToString(b.dtype()));
  SP_CHECK(sa.rank() >= 2 && sb.rank() >= 2, "matmul: both inputs need rank >= 2, got a ", sa,
           " and b ", sb);
  SP_CHECK(sb.rank() == 2 || sb.rank() == sa.rank(), "matmul: b ", sb,
           " must be rank 2 or have the rank of a ", sa);

  MatmulGeometry geo;
  geo.m = transpose_a ? sa[-1] : sa[-2];
  const int64_t ka = transpose_a ? sa[-2] : sa[-1];
  const int64_t kb = transpose_b ? sb[-1] : sb[-2];
  geo.n = transpose_b ? sb[-2] : sb[-1];
  SP_CHECK(ka == kb, "matmul: inner extents differ: a ", sa, " and b ", sb,
           " (transpose_a = ", transpose_a, ", transpose_b = ", transpose_b, ") give ", ka, " vs ",
           kb);
  geo.k = ka;

  std::vector<int64_t> out_dims;
  for (int i = 0; i < sa.rank() - 2; ++i) {
    geo.batch *= sa[i];
    out_dims.push_back(sa[i]);
  }
  geo.b_shared = sb.rank() == 2 && sa.rank() > 2;
  if (sb.rank() > 2) {
    for (int i = 0; i < sb.rank() - 2; ++i) {
      SP_CHECK(sa[i] == sb[i], "matmul: batch extents differ: a ", sa, " and b ", sb);
    }
  }
  out_dims.push_back(geo.m);
  out_dims.push_back(geo.n);
  geo.out_shape = Shape(out_dims);
  return geo;
}

MatmulGeometry ResolveMatmul(const Var& a, const Var& b, bool transpose_a, bool transpose_b) {
  SP_CHECK(a.defined() && b.defined(), "matmul: an input is undefined");
  return ResolveMatmul(a.value(), b.value(), transpose_a, transpose_b);
}

// Writes the block [row_begin, row_end) x [col_begin, col_end) of
// C = op(A) op(B), where A, B and C point at one batch entry: A is [m, k]
// ([k, m] if transpose_a), B is [k, n] ([n, k] if transpose_b), C is [m, n].
// With packed_b (float only, whole rows: col_begin = 0, col_end = n), op(B)
// was packed once for all the product's row blocks and b is not read; a
// bias ([n]) is then added to every row by the packed kernel as it stores
// C (only with packed_b: GemmBlock's caller adds it otherwise). With
// b_column_sums (float, B not transposed, not packed_b, a block the packed
// kernel takes; indexed by B's columns), the block's columns of B are
// summed into it too, in float64 and in row order.
// With multiplier (float, with packed_b only; [m, n] like C), each entry of
// the block is multiplied by its entry of multiplier as the packed kernel
// stores it (the gradient through an elementwise map after the product).
template <typename T>
void GemmBlock(const T* a,
               const T* b,
               T* c,
               int64_t m,
               int64_t k,
               int64_t n,
               bool transpose_a,
               bool transpose_b,
               int64_t row_begin,
               int64_t row_end,
               int64_t col_begin,
               int64_t col_end,
               const internal::PackedFloatB* packed_b = nullptr,
               double* b_column_sums = nullptr,
               const T* bias = nullptr,
               const T* multiplier = nullptr) {
  // Rows of op(A) are rows of A, or columns of A when transposed; columns of
  // op(B) are columns of B, or rows of B when transposed.
  const T* a_rows = transpose_a ? a + row_begin : a + row_begin * k;
  const int64_t lda = transpose_a ? m : k;
  if constexpr (std::is_same_v<T, float>) {
    if (packed_b != nullptr && multiplier != nullptr) {
      packed_b->MultiplyElementwise(transpose_a, row_end - row_begin, a_rows, lda,
                                    multiplier + row_begin * n, n, c + row_begin * n, n);
      return;
    }
    if (packed_b != nullptr) {
      packed_b->Multiply(transpose_a, row_end - row_begin, 1.0f, a_rows, lda, c + row_begin * n, n,
                         /*accumulate=*/false, bias);
      return;
    }
  }
  const T* b_cols = transpose_b ? b + col_begin * k : b + col_begin;
  if constexpr (std::is_same_v<T, float>) {
    if (b_column_sums != nullptr) {
      // Summed while the packed kernel packs B (MatmulValue asks for sums
      // only where Gemm would run the packed kernel).
      internal::SmallGemmFloat(transpose_a, row_end - row_begin, col_end - col_begin, k, 1.0f,
                               a_rows, lda, b_cols, n, c + row_begin * n + col_begin, n,
                               b_column_sums + col_begin);
      return;
    }
  }
  internal::Gemm<T>(transpose_a, transpose_b, row_end - row_begin, col_end - col_begin, k, T(1),
                    a_rows, lda, b_cols, transpose_b ? k : n, c + row_begin * n + col_begin, n);
}

// Applied by a product's work unit to the block of C it has just written
// (rows [row_begin, row_end) x columns [col_begin, col_end) of out, bias
// added), while the block is still in cache: an elementwise map fused into
// the product (linear_gelu). Rank-2 products only.
using BlockEpilogue = std::function<void(
    Tensor& out, int64_t row_begin, int64_t row_end, int64_t col_begin, int64_t col_end)>;

// The forward kernel: a tensor-only product (no graph). When bias is given
// (a [n] vector; rank-2 products only) it is added to each output row, then
// the epilogue, if any, maps each block. When b_column_sums is given (a
// weight gradient x^T g: rank 2, A transposed, B not), it is set to B's
// column sums ([n]; float64 sums in row order, as sum(b, 0) gives them),
// taken as the packed float kernel packs B, where the product runs it and
// its cut allows (one row block, one depth part); otherwise it is left
// undefined. When multiplier is given (the shape and dtype of the result;
// rank-2 products, without bias or epilogue) the result is the product
// times multiplier, entry by entry: in the packed kernel's tiles where
// one packed B serves the row blocks, else on each block after it is
// written. Bitwise the product followed by that multiplication.
Tensor MatmulValue(const Tensor& a,
                   const Tensor& b,
                   const MatmulGeometry& geo,
                   bool transpose_a,
                   bool transpose_b,
                   const Tensor* bias = nullptr,
                   const BlockEpilogue& epilogue = {},
                   Tensor* b_column_sums = nullptr,
                   const Tensor* multiplier = nullptr) {
  SP_CHECK(multiplier == nullptr ||
               (multiplier->shape() == geo.out_shape && multiplier->dtype() == a.dtype() &&
                geo.out_shape.rank() == 2 && bias == nullptr && !epilogue),
           "matmul: a multiplier must have the shape and dtype of a rank-2 result, without bias "
           "or epilogue");
  Tensor out(geo.out_shape, a.dtype());
  if (out.numel() == 0) return out;
  // A shared B with an untransposed A is one tall product: fold the batch
  // into the rows so small per-entry products become one efficient GEMM.
  const bool fold = geo.b_shared && !transpose_a;
  const int64_t batch = fold ? 1 : geo.batch;
  const int64_t m = fold ? geo.batch * geo.m : geo.m;
  const int64_t row_units = (m + kRowsPerUnit - 1) / kRowsPerUnit;
  // A single short, deep product (a weight gradient x^T g: m = features,
  // k = rows) is cut into column blocks too, so it still spreads over
  // threads.
  const bool split_cols = batch * row_units == 1 && geo.n >= 2 * kMinColsPerUnit &&
                          m * geo.k * geo.n >= 4 * kFlopsPerTask;
  const int64_t split_col_units = split_cols ? (geo.n + kMinColsPerUnit - 1) / kMinColsPerUnit : 1;
  // A weight gradient x^T g has only a few column blocks (2-6 in W2), so a
  // thread that falls behind leaves the other idle for up to a block at the
  // end of the region. Its depth (the rows of x and g) is cut too, into
  // parts that write separate partial results, added in part order after
  // the region: the cut depends only on the shapes, so results stay
  // independent of the thread count.
  const int64_t depth_parts =
      split_cols && transpose_a && !transpose_b && bias == nullptr && !epilogue &&
              multiplier == nullptr
          ? std::clamp<int64_t>((kMinSplitUnits + split_col_units - 1) / split_col_units, 1,
                                std::max<int64_t>(1, geo.k / kMinDepthPerPart))
          : 1;
  // Not into column blocks, though, when it runs on one thread anyway and
  // is not cut along its depth: a whole g (64 or 128 columns in W1) is
  // then read in place instead of packed (gemm_float_kernel.cc,
  // ReadsPanelsInPlace). Column blocks give the same values, so the result
  // still does not depend on the thread count; a cut along the depth would
  // not (its parts are summed apart), so that cut depends on the shapes
  // only.
  const bool cut_cols = split_cols && !(depth_parts == 1 && ParallelForRunsInline());
  const int64_t cols_per_unit = cut_cols ? kMinColsPerUnit : geo.n;
  const int64_t col_units = cut_cols ? split_col_units : 1;
  const int64_t units_per_entry = row_units * col_units * depth_parts;
  const int64_t units = batch * units_per_entry;
  const int64_t flops_per_unit =
      std::max<int64_t>(1, std::min(m, kRowsPerUnit) * (geo.k / depth_parts) * cols_per_unit);
  const int64_t min_chunk = std::max<int64_t>(1, kFlopsPerTask / flops_per_unit);
  DispatchDType(a.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* a_data = a.data<T>();
    const T* b_data = b.data<T>();
    T* c_data = out.data<T>();
    const int64_t a_stride = geo.m * geo.k;
    const int64_t b_stride = geo.b_shared ? 0 : geo.k * geo.n;
    const int64_t c_stride = geo.m * geo.n;
    const T* bias_data = bias ? bias->data<T>() : nullptr;
    const T* multiplier_data = multiplier ? multiplier->data<T>() : nullptr;
    // A float product cut into row blocks only packs op(B) once, here, for
    // all of them, instead of once per block: the blocks of a W2
    // projection would otherwise pack the same weight sixteen times. The
    // blocks go to the packed kernel either way, and a PackedFloatB gives
    // its results bitwise, so the values are the same.
    const internal::PackedFloatB* shared_b = nullptr;
    if constexpr (std::is_same_v<T, float>) {
      if (batch == 1 && col_units == 1 && row_units > 1) {
        thread_local internal::PackedFloatB packed_b;
        packed_b.Pack(transpose_b, geo.k, geo.n, b_data, transpose_b ? geo.k : geo.n);
        shared_b = &packed_b;
      }
    }
    // B's column sums are taken by the packed kernel as it packs B: float
    // blocks it runs (the widest block decides; narrower ones run it too),
    // each column summed whole by one block.
    std::vector<double> column_sums;
    if (std::is_same_v<T, float> && b_column_sums != nullptr && batch == 1 && row_units == 1 &&
        depth_parts == 1 && transpose_a && !transpose_b &&
        internal::UsesSmallGemmFloat(m, cols_per_unit)) {
      column_sums.assign(geo.n, 0.0);
    }
    if (depth_parts > 1) {
      // Part p > 0 goes to partials[p - 1] ([m, n] each).
      std::vector<Tensor> partials;
      for (int64_t part = 1; part < depth_parts; ++part) {
        partials.emplace_back(geo.out_shape, a.dtype());
      }
      ParallelFor(0, units, min_chunk, [&](int64_t begin, int64_t end) {
        for (int64_t unit = begin; unit < end; ++unit) {
          const int64_t part = unit % depth_parts;
          const int64_t col_begin = (unit / depth_parts) * cols_per_unit;
          const int64_t col_end = std::min(geo.n, col_begin + cols_per_unit);
          const int64_t k_begin = part * geo.k / depth_parts;
          const int64_t k_end = (part + 1) * geo.k / depth_parts;
          T* c = part == 0 ? c_data : partials[part - 1].data<T>();
          // op(A) = A^T and B are [depth, m] and [depth, n]: a depth part is a
          // block of their rows.
          GemmBlock<T>(a_data + k_begin * m, b_data + k_begin * geo.n, c, m, k_end - k_begin, geo.n,
                       true, false, 0, m, col_begin, col_end);
        }
      });
      for (const Tensor& partial : partials) {
        const T* p = partial.data<T>();
        internal::BinaryLoop(c_data, p, c_data, out.numel(), [](T x, T y) { return x + y; });
      }
      return;
    }
    ParallelFor(0, units, min_chunk, [&](int64_t begin, int64_t end) {
      for (int64_t unit = begin; unit < end; ++unit) {
        const int64_t entry = unit / units_per_entry;
        const int64_t block = unit % units_per_entry;
        const int64_t row_begin = (block / col_units) * kRowsPerUnit;
        const int64_t row_end = std::min(m, row_begin + kRowsPerUnit);
        const int64_t col_begin = (block % col_units) * cols_per_unit;
        const int64_t col_end = std::min(geo.n, col_begin + cols_per_unit);
        T* c_entry = c_data + entry * c_stride;
        GemmBlock<T>(a_data + entry * a_stride, b_data + entry * b_stride, c_entry, m, geo.k, geo.n,
                     transpose_a, transpose_b, row_begin, row_end, col_begin, col_end, shared_b,
                     column_sums.empty() ? nullptr : column_sums.data(),
                     shared_b ? bias_data : nullptr, shared_b ? multiplier_data : nullptr);
        // (With a shared packed B the kernel has added the bias, or applied
        // the multiplier, already.)
        if (bias_data && !shared_b) {
          for (int64_t r = row_begin; r < row_end; ++r) {
            T* row = c_entry + r * geo.n;
            for (int64_t j = col_begin; j < col_end; ++j) row[j] += bias_data[j];
          }
        }
        if (multiplier_data && !shared_b) {
          for (int64_t r = row_begin; r < row_end; ++r) {
            T* row = c_entry + r * geo.n;
            const T* factor = multiplier_data + r * geo.n;
            for (int64_t j = col_begin; j < col_end; ++j) row[j] *= factor[j];
          }
        }
        if (epilogue) epilogue(out, row_begin, row_end, col_begin, col_end);
      }
    });
    if (!column_sums.empty()) {
      *b_column_sums = Tensor(Shape{geo.n}, a.dtype());
      T* sums = b_column_sums->data<T>();
      for (int64_t j = 0; j < geo.n; ++j) sums[j] = static_cast<T>(column_sums[j]);
    }
  });
  return out;
}

// Gradient of a shared rank-2 B: the per-entry gradients summed over the batch.
Var SharedOperandGrad(
    const Var& a, const Var& g, const MatmulGeometry& geo, bool transpose_a, bool transpose_b) {
  const int64_t rows = geo.batch * geo.m;
  if (!transpose_a) {
    // The sum over entries of op(A_i)^T G_i is one product of the folded rows.
    const Var a2 = reshape(a, Shape{rows, geo.k});
    const Var g2 = reshape(g, Shape{rows, geo.n});
    return transpose_b ? matmul(g2, a2, true, false) : matmul(a2, g2, true, false);
  }
  // A_i is [k, m]: form the per-entry products, then add them up.
  const Var per_entry = transpose_b ? matmul(g, a, true, true) : matmul(a, g, false, false);
  const Shape& s = per_entry.shape();
  return sum(reshape(per_entry, Shape{geo.batch, s[-2], s[-1]}), 0);
}

}  // namespace

Var matmul(const Var& a, const Var& b, bool transpose_a, bool transpose_b) {
  const MatmulGeometry geo = ResolveMatmul(a, b, transpose_a, transpose_b);
  Tensor out = MatmulValue(a.value(), b.value(), geo, transpose_a, transpose_b);
  return RecordOp("matmul", out, {a, b},
                  [geo, transpose_a, transpose_b](const VarList& in, const Var&, const Var& g) {
                    const Var& a = in[0];
                    const Var& b = in[1];
                    Var da, db;
                    if (WantsInputGrad(in, 0)) {
                      // d op(A) = G op(B)^T; undo op on A.
                      if (!transpose_a) {
                        da = matmul(g, b, false, !transpose_b);
                      } else if (!geo.b_shared) {
                        da = matmul(b, g, transpose_b, true);
                      } else {
                        da = transpose(matmul(g, b, false, !transpose_b), -2, -1);
                      }
                    }
                    if (WantsInputGrad(in, 1)) {
                      // d op(B) = op(A)^T G; undo op on B.
                      if (geo.b_shared) {
                        db = SharedOperandGrad(a, g, geo, transpose_a, transpose_b);
                      } else if (!transpose_b) {
                        db = matmul(a, g, !transpose_a, false);
                      } else {
                        db = matmul(g, a, true, transpose_a);
                      }
                    }
                    return VarList{da, db};
                  });
}

namespace {

// A bias, if defined, is one entry per column of its (rank-2) weight, of
// the weight's dtype; the errors call them by the op's names for them.
void CheckBias(const Var& bias,
               const Var& weight,
               const char* op,
               const char* bias_name,
               const char* weight_name) {
  if (!bias.defined()) return;
  SP_CHECK(bias.shape() == Shape{weight.dim(1)}, op, ": ", bias_name, " ", bias.shape(),
           " must be [", weight.dim(1), "] for ", weight_name, " ", weight.shape());
  SP_CHECK(bias.dtype() == weight.dtype(), op, ": ", bias_name, " is ", ToString(bias.dtype()),
           " but ", weight_name, " is ", ToString(weight.dtype()));
}

void CheckLinearOperands(const Var& x, const Var& weight, const Var& bias, const char* op) {
  SP_CHECK(x.defined() && weight.defined(), op, ": an input is undefined");
  SP_CHECK(x.rank() == 2 && weight.rank() == 2 && x.dim(1) == weight.dim(0), op, ": x ", x.shape(),
           " must be [m, k] and weight ", weight.shape(), " [k, n]");
  CheckBias(bias, weight, op, "bias", "weight");
}

// The VJP of y = x weight + bias for the output gradient g (in = {x, weight,
// bias}), in differentiable ops.
VarList LinearVjp(const VarList& in, const Var& g) {
  Var dx, dw, db;
  if (WantsInputGrad(in, 0)) dx = matmul(g, in[1], false, true);
  if (WantsInputGrad(in, 1) && WantsInputGrad(in, 2) && !GradModeEnabled()) {
    // The weight gradient x^T g sums g's columns, the bias gradient, as it
    // packs g, instead of a second pass over g (the same values).
    Tensor column_sums;
    const MatmulGeometry geo = ResolveMatmul(in[0], g, true, false);
    dw = Var(MatmulValue(in[0].value(), g.value(), geo, true, false, nullptr, {}, &column_sums));
    if (column_sums.defined()) db = Var(column_sums);
  }
  if (WantsInputGrad(in, 1) && !dw.defined()) dw = matmul(in[0], g, true, false);
  if (WantsInputGrad(in, 2) && !db.defined()) db = sum(g, 0);
  return VarList{dx, dw, db};
}

}  // namespace

Var linear(const Var& x, const Var& weight, const Var& bias) {
  CheckLinearOperands(x, weight, bias, "linear");
  const MatmulGeometry geo = ResolveMatmul(x, weight, false, false);
  const Tensor bias_value = bias.defined() ? bias.value() : Tensor();
  Tensor out = MatmulValue(x.value(), weight.value(), geo, false, false,
                           bias.defined() ? &bias_value : nullptr);
  return RecordOp("linear", out, {x, weight, bias},
                  [](const VarList& in, const Var&, const Var& g) { return LinearVjp(in, g); });
}

namespace {

// gelu(x weight + bias), with each block of the product mapped while it is
// in cache; with derivative, gelu' of the same pre-activation is written
// there too (for a backward pass: the pre-activation itself is never
// stored). x and weight are checked operands of a linear layer.
Tensor LinearGeluValue(const Var& x, const Var& weight, const Var& bias, Tensor* derivative) {
  const MatmulGeometry geo = ResolveMatmul(x, weight, false, false);
  const Tensor bias_value = bias.defined() ? bias.value() : Tensor();
  if (derivative) *derivative = Tensor(geo.out_shape, x.dtype());
  const BlockEpilogue gelu_in_place = [&](Tensor& out, int64_t row_begin, int64_t row_end,
                                          int64_t col_begin, int64_t col_end) {
    DispatchDType(out.dtype(), [&](auto zero) {
      using T = decltype(zero);
      for (int64_t r = row_begin; r < row_end; ++r) {
        T* u = out.data<T>() + r * geo.n + col_begin;
        if (derivative) {
          internal::VecGeluWithDerivative(u, u, derivative->data<T>() + r * geo.n + col_begin,
                                          col_end - col_begin);
        } else {
          internal::VecGelu(u, u, col_end - col_begin);
        }
      }
    });
  };
  return MatmulValue(x.value(), weight.value(), geo, false, false,
                     bias.defined() ? &bias_value : nullptr, gelu_in_place);
}

// create_graph: the VJP of linear_gelu with the output gradient g, as
// recorded ops: gelu's VJP at u = x weight + bias recomputed, so the
// gradient carries its dependence on every input (in = {x, weight, bias}).
VarList LinearGeluVjpRecorded(const VarList& in, const Var& g) {
  const Var u = linear(in[0], in[1], in[2]);
  return LinearVjp(in, grad({gelu(u)}, {u}, {g}, {.create_graph = true})[0]);
}

}  // namespace

Var linear_gelu(const Var& x, const Var& weight, const Var& bias) {
  CheckLinearOperands(x, weight, bias, "linear_gelu");
  // As gelu does when recording: gelu'(u) computed with gelu(u), kept for
  // the backward.
  Tensor derivative;
  const bool recording = WouldRecord({x, weight, bias});
  Tensor out = LinearGeluValue(x, weight, bias, recording ? &derivative : nullptr);
  return RecordOp("linear_gelu", out, {x, weight, bias},
                  [derivative](const VarList& in, const Var&, const Var& g) {
                    if (!GradModeEnabled()) {
                      return LinearVjp(in, constant(internal::GeluGradient(g.value(), derivative,
                                                                           "linear_gelu")));
                    }
                    return LinearGeluVjpRecorded(in, g);
                  });
}

Var feed_forward(const Var& x, const Var& w1, const Var& b1, const Var& w2, const Var& b2) {
  CheckLinearOperands(x, w1, b1, "feed_forward");
  SP_CHECK(w2.defined() && w2.rank() == 2 && w2.dim(0) == w1.dim(1), "feed_forward: w2 ",
           w2.defined() ? w2.shape().ToString() : std::string("(undefined)"), " must be [",
           w1.dim(1), ", n] after w1 ", w1.shape());
  SP_CHECK(w2.dtype() == w1.dtype(), "feed_forward: w2 is ", ToString(w2.dtype()), " but w1 is ",
           ToString(w1.dtype()));
  CheckBias(b2, w2, "feed_forward", "b2", "w2");
  const bool recording = WouldRecord({x, w1, b1, w2, b2});
  Tensor derivative;
  const Tensor hidden = LinearGeluValue(x, w1, b1, recording ? &derivative : nullptr);
  const Tensor b2_value = b2.defined() ? b2.value() : Tensor();
  Tensor out = MatmulValue(hidden, w2.value(), ResolveMatmul(hidden, w2.value(), false, false),
                           false, false, b2.defined() ? &b2_value : nullptr);
  return RecordOp("feed_forward", out, {x, w1, b1, w2, b2},
                  [hidden, derivative](const VarList& in, const Var&, const Var& g) {
                    // The second layer's VJP sees inputs {hidden, w2, b2}: which of
                    // their gradients the sweep needs, in that order.
                    const bool first_layer_needed =
                        InputGradNeeded(0) || InputGradNeeded(1) || InputGradNeeded(2);
                    const std::vector<char> second_mask = {first_layer_needed, InputGradNeeded(3),
                                                           InputGradNeeded(4)};
                    if (!GradModeEnabled()) {
                      // The second layer's weight and bias gradients as linear's, from
                      // the kept hidden activations.
                      VarList second;
                      {
                        const ScopedInputGradMask mask(&second_mask);
                        second = LinearVjp({constant(hidden), in[3], in[4]}, g);
                      }
                      // The gradient at the first layer's output u: g w2^T times
                      // gelu'(u), multiplied in as the product's tiles store it instead
                      // of in a pass of its own over a [rows, hidden] tensor.
                      VarList first(3);
                      if (WantsInputGrad(in, 0) || WantsInputGrad(in, 1) || WantsInputGrad(in, 2)) {
                        const Tensor& w2 = in[3].value();
                        const Tensor du =
                            MatmulValue(g.value(), w2, ResolveMatmul(g.value(), w2, false, true),
                                        false, true, nullptr, {}, nullptr, &derivative);
                        first = LinearVjp({in[0], in[1], in[2]}, constant(du));
                      }
                      return VarList{first[0], first[1], first[2], second[1], second[2]};
                    }
                    // create_graph: through the two ops' recorded VJPs.
                    const Var hidden_recorded = linear_gelu(in[0], in[1], in[2]);
                    VarList second;
                    {
                      const ScopedInputGradMask mask(&second_mask);
                      second = LinearVjp({hidden_recorded, in[3], in[4]}, g);
                    }
                    VarList first(3);
                    if (second[0].defined()) {
                      first = LinearGeluVjpRecorded({in[0], in[1], in[2]}, second[0]);
                    }
                    return VarList{first[0], first[1], first[2], second[1], second[2]};
                  });
}

}  // namespace stillpoint
