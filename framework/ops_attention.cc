// Fused multi-head scaled dot-product attention (see ops.h).
//
// q, k and v stay in the projections' layout ([B, T, heads * dh] each, or
// side by side in one packed [B, T, 3 heads * dh] projection): head h of
// batch entry b is a strided [T, dh] block of columns, read and written in
// place as a GEMM operand with a row stride, so no permuted copies are
// made. One task handles one (b, h) pair from scores to output (and, in
// backward, from the output gradient to the three input gradients), so the
// work spreads over batch x heads and every output entry is written by
// exactly one task: results are bitwise identical for any thread count.
// A forward task goes through blocks of queries (see QueryBlockRows), so a
// pass with no tape (an implicit layer's solver iterations) holds no
// [Tq, Tk] block at any length; the float64 backward works on whole
// [Tq, Tk] blocks, float32's by blocks of queries.
//
// The softmax runs in base 2: the product that makes the scores multiplies
// by scale log2(e), so p = 2^(s - row max) is the same softmax as
// e^(scale q.k - max), and 2^x takes fewer instructions than e^x
// (Exp2FlushPacket in vector_math.h).
//
// A recorded forward pass keeps the probabilities P [B, heads, Tq, Tk] for
// the backward pass when they are no larger than q, k and v together;
// otherwise it keeps each query row's max and 1 / sum, and backward
// recomputes P from them, block by block in the first call and kept from
// the second call on. The fused VJP is used
// without create_graph; with create_graph the VJP differentiates the same
// attention written with differentiable ops (multi_head_attention_reference),
// so second derivatives work.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "framework/kernels/gemm.h"
#include "framework/ops.h"
#include "framework/parallel.h"
#include "framework/kernels/vector_math.h"

namespace stillpoint {
namespace {

struct AttentionGeometry {
  int64_t batch = 0;
  int64_t tq = 0;
  int64_t tk = 0;
  int64_t heads = 0;
  int64_t dh = 0;
  int64_t dim = 0;  // heads * dh
  // Row strides: of q (and dq), of k and v (and dk, dv); out and its
  // gradient are [B, Tq, dim]. Separate tensors have dim; one packed
  // [B, T, 3 dim] projection has 3 dim.
  int64_t q_stride = 0;
  int64_t kv_stride = 0;
  double scale = 1.0;
  bool causal = false;

  // The factor of the score products: scores are in base-2 units.
  double ScoreScale() const { return scale * internal::kLog2e; }

  // Keys [0, VisibleKeys(i)) are visible to query i.
  int64_t VisibleKeys(int64_t i) const {
    if (!causal) return tk;
    return std::clamp<int64_t>(i + (tk - tq) + 1, 0, tk);
  }
};

// Extents checked by the caller; stride is the row stride of q, k and v.
AttentionGeometry MakeGeometry(int64_t batch,
                               int64_t tq,
                               int64_t tk,
                               int64_t heads,
                               int64_t dim,
                               int64_t stride,
                               double scale,
                               bool causal) {
  AttentionGeometry geo;
  geo.batch = batch;
  geo.tq = tq;
  geo.tk = tk;
  geo.heads = heads;
  geo.dim = dim;
  geo.dh = dim / heads;
  geo.q_stride = stride;
  geo.kv_stride = stride;
  geo.scale = scale;
  geo.causal = causal;
  return geo;
}

AttentionGeometry ResolveAttention(
    const Var& q, const Var& k, const Var& v, int64_t heads, double scale, bool causal) {
  SP_CHECK(q.defined() && k.defined() && v.defined(),
           "multi_head_attention: an input is undefined");
  SP_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(),
           "multi_head_attention: dtypes differ: q ", q.shape(), " ", ToString(q.dtype()), ", k ",
           k.shape(), " ", ToString(k.dtype()), ", v ", v.shape(), " ", ToString(v.dtype()));
  SP_CHECK(q.rank() == 3 && k.rank() == 3 && k.shape() == v.shape() && q.dim(0) == k.dim(0) &&
               q.dim(2) == k.dim(2),
           "multi_head_attention: q ", q.shape(), " must be [B, Tq, D] and k ", k.shape(), ", v ",
           v.shape(), " both [B, Tk, D]");
  SP_CHECK(heads > 0 && q.dim(2) % heads == 0, "multi_head_attention: width ", q.dim(2), " of q ",
           q.shape(), " is not a positive multiple of heads ", heads);
  SP_CHECK(scale > 0.0 && std::isfinite(scale), "multi_head_attention: scale must be > 0, got ",
           scale);
  return MakeGeometry(q.dim(0), q.dim(1), k.dim(1), heads, q.dim(2), q.dim(2), scale, causal);
}

// The softmax statistics of every query row, [B, heads, Tq] each (unit-major):
// its max score (base-2 units) and 1 / (sum of 2^(score - max)). A recorded forward
// pass that does not keep P keeps these instead (a Tk-th of P's size), so
// the backward pass recomputes P in one pass per row.
template <typename T>
struct RowStats {
  T* max = nullptr;
  T* scale = nullptr;

  bool defined() const { return max != nullptr; }
  // The statistics from query i0 of a unit on.
  RowStats At(const AttentionGeometry& geo, int64_t unit, int64_t i0) const {
    if (!defined()) return {};
    const int64_t offset = unit * geo.tq + i0;
    return {max + offset, scale + offset};
  }
};

// Per-thread scratch of at least n entries (a [Tq, Tk] block).
template <typename T>
T* Scratch(int64_t n) {
  thread_local std::vector<T> buffer;
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(n);
  return buffer.data();
}

// Offsets of head h of batch entry b in q (and dq), in k and v (and dk,
// dv) and in out (and its gradient) for unit = b heads + h.
struct UnitOffsets {
  int64_t q = 0;
  int64_t k = 0;
  int64_t out = 0;
};
UnitOffsets OffsetsOf(const AttentionGeometry& geo, int64_t unit) {
  const int64_t b = unit / geo.heads;
  const int64_t col = (unit % geo.heads) * geo.dh;
  return {b * geo.tq * geo.q_stride + col, b * geo.tk * geo.kv_stride + col,
          b * geo.tq * geo.dim + col};
}

// Rows [i0, i0 + rows) of a unit's scores, s (rows x Tk, row stride Tk),
// become p = 2^(s - row max), masked; row_scale[r] = 1 / (row r's sum) and,
// unless row_max is null, row_max[r] = row r's max. With normalize the rows
// are divided by their sums (the probabilities).
template <typename T>
void ExponentiateRows(const AttentionGeometry& geo,
                      int64_t i0,
                      int64_t rows,
                      bool normalize,
                      T* s,
                      T* row_scale,
                      T* row_max = nullptr) {
  constexpr T kNaN = std::numeric_limits<T>::quiet_NaN();
  for (int64_t r = 0; r < rows; ++r) {
    T* row = s + r * geo.tk;
    const int64_t visible = geo.VisibleKeys(i0 + r);
    if (visible == 0) {
      // Every key hidden: softmax of all -inf, as the unfused ops give.
      std::fill_n(row, geo.tk, kNaN);
      row_scale[r] = kNaN;
      if (row_max) row_max[r] = kNaN;
      continue;
    }
    const T m = internal::VecMax(row, visible);
    const T sum = internal::VecExp2Shifted(row, m, row, visible);
    row_scale[r] = T(1) / sum;
    if (row_max) row_max[r] = m;
    std::fill(row + visible, row + geo.tk, T(0));
    if (normalize) {
      for (int64_t j = 0; j < visible; ++j) row[j] *= row_scale[r];
    }
  }
}

// Rows [i0, i0 + rows) of a unit's scores s become its probabilities
// 2^(s - row_max[r]) row_scale[r] (masked) from the statistics its forward
// pass recorded (see ExponentiateRows): one pass instead of a max, an exp
// and a normalisation pass, and bitwise what ExponentiateRows gives.
template <typename T>
void ProbabilitiesFromRowStats(const AttentionGeometry& geo,
                               int64_t i0,
                               int64_t rows,
                               const T* row_max,
                               const T* row_scale,
                               T* s) {
  for (int64_t r = 0; r < rows; ++r) {
    T* row = s + r * geo.tk;
    const int64_t visible = geo.VisibleKeys(i0 + r);
    if (visible == 0) {
      std::fill_n(row, geo.tk, std::numeric_limits<T>::quiet_NaN());
      continue;
    }
    internal::VecExp2ShiftedScaled(row, row_max[r], row_scale[r], row, visible);
    std::fill(row + visible, row + geo.tk, T(0));
  }
}

// Divides `rows` output rows of a head (dh entries each, row stride dim)
// by their softmax sums: o_r *= row_scale[r].
template <typename T>
void NormaliseOutputRows(const AttentionGeometry& geo, int64_t rows, const T* row_scale, T* o) {
  for (int64_t r = 0; r < rows; ++r) {
    T* o_row = o + r * geo.dim;
    for (int64_t j = 0; j < geo.dh; ++j) o_row[j] *= row_scale[r];
  }
}

// Row r's D_r = sum_j dP_rj P_rj of the score gradient dS = P o (dP - D),
// as dO_r . O_r (O_r = sum_j P_rj V_j): a dot of length dh instead of a
// pass over the row. g_rows and o_rows are the head's rows of dO and O (row
// stride dim).
template <typename T>
T SoftmaxRowDot(const AttentionGeometry& geo, const T* g_rows, const T* o_rows, int64_t r) {
  return internal::VecDot(g_rows + r * geo.dim, o_rows + r * geo.dim, geo.dh);
}

// ds (rows x Tk, holding dP = dO V^T) becomes dS = P o (dP - D) in place,
// D_r from SoftmaxRowDot.
template <typename T>
void ScoreGradientsInPlace(const AttentionGeometry& geo,
                           int64_t rows,
                           const T* p,
                           const T* g_rows,
                           const T* o_rows,
                           T* ds) {
  for (int64_t r = 0; r < rows; ++r) {
    T* row = ds + r * geo.tk;
    const T* p_row = p + r * geo.tk;
    const T d = SoftmaxRowDot(geo, g_rows, o_rows, r);
    for (int64_t j = 0; j < geo.tk; ++j) row[j] = p_row[j] * (row[j] - d);
  }
}

// Queries per block: whole row tiles (6) of about score_floats scores, so
// short sequences are one block. A task holds one block's scores at a
// time, never a unit's [Tq, Tk] (unless it keeps the probabilities).
int64_t QueryBlockRows(const AttentionGeometry& geo, int64_t score_floats) {
  constexpr int64_t kTileRows = 6;
  return std::max(kTileRows, score_floats / std::max<int64_t>(geo.tk, 1) / kTileRows * kTileRows);
}
// Forward: a block's scores (24 KiB in float32, 24 queries for Tk = 256)
// stay in L1 from Q K^T to P V.
constexpr int64_t kForwardScoreFloats = 6144;

// Scores scale log2(e) q_h k_h^T of queries [i0, i0 + rows) of a unit, into
// s (row stride Tk).
template <typename T>
void BlockScoresOf(const AttentionGeometry& geo, const T* q, const T* k, int64_t unit, int64_t i0,
                   int64_t rows, T* s) {
  const UnitOffsets at = OffsetsOf(geo, unit);
  internal::Gemm<T>(false, true, rows, geo.tk, geo.dh, static_cast<T>(geo.ScoreScale()),
                    q + at.q + i0 * geo.q_stride, geo.q_stride, k + at.k, geo.kv_stride, s,
                    geo.tk);
}

// One unit's [Tq, Tk] block of scores, into s, by the forward pass's blocks
// of queries, so each row is bitwise the score its forward pass saw (its
// row statistics then give bitwise its probabilities).
template <typename T>
void UnitScores(const AttentionGeometry& geo, const T* q, const T* k, int64_t unit, T* s) {
  const int64_t block_rows = QueryBlockRows(geo, kForwardScoreFloats);
  for (int64_t i0 = 0; i0 < geo.tq; i0 += block_rows) {
    BlockScoresOf(geo, q, k, unit, i0, std::min(block_rows, geo.tq - i0), s + i0 * geo.tk);
  }
}

// ------------------------------------------------- one unit, any dtype

// One unit's forward by blocks of queries (float32 has a packed form of it,
// UnitForwardByQueryBlocks): out_h (unless out is null) and, when p_unit is
// not null, the unit's probabilities there. Without p_unit a block's
// exponentials stay in scratch ([rows, Tk], rows from QueryBlockRows) and
// its output rows are normalised instead (dh << Tk), so a forward pass with
// no tape holds no [Tq, Tk] block at any length.
template <typename T>
void UnitForwardByQueryRows(const AttentionGeometry& geo,
                            const T* q,
                            const T* k,
                            const T* v,
                            int64_t unit,
                            T* out,
                            T* p_unit,
                            const RowStats<T>& stats) {
  const UnitOffsets at = OffsetsOf(geo, unit);
  const int64_t block_rows = QueryBlockRows(geo, kForwardScoreFloats);
  T* scratch = Scratch<T>(block_rows * (geo.tk + 1));
  T* row_scale = scratch + block_rows * geo.tk;
  for (int64_t i0 = 0; i0 < geo.tq; i0 += block_rows) {
    const int64_t rows = std::min(block_rows, geo.tq - i0);
    T* p = p_unit ? p_unit + i0 * geo.tk : scratch;
    const RowStats<T> block_stats = stats.At(geo, unit, i0);
    T* block_scale = block_stats.defined() ? block_stats.scale : row_scale;
    BlockScoresOf(geo, q, k, unit, i0, rows, p);
    ExponentiateRows(geo, i0, rows, p_unit != nullptr, p, block_scale, block_stats.max);
    if (out == nullptr) continue;
    // O_h = P V_h, written into the head's columns of out.
    T* o = out + at.out + i0 * geo.dim;
    internal::Gemm<T>(false, false, rows, geo.dh, geo.tk, T(1), p, geo.tk, v + at.k,
                      geo.kv_stride, o, geo.dim);
    if (p_unit) continue;
    NormaliseOutputRows(geo, rows, block_scale, o);
  }
}

// One unit's VJP on whole [Tq, Tk] blocks, given its probabilities p_unit
// (or null: recomputed into scratch from the row statistics).
template <typename T>
void UnitBackwardWhole(const AttentionGeometry& geo,
                       const T* q,
                       const T* k,
                       const T* v,
                       const T* p_unit,
                       const RowStats<T>& stats,
                       const T* out,
                       const T* g,
                       int64_t unit,
                       T* dq,
                       T* dk,
                       T* dv) {
  const UnitOffsets at = OffsetsOf(geo, unit);
  const int64_t block = geo.tq * geo.tk;
  const T scale = static_cast<T>(geo.scale);
  T* scratch = Scratch<T>(2 * block);
  T* ds = scratch;
  const T* p = p_unit;
  if (p == nullptr) {
    T* recomputed = scratch + block;
    const RowStats<T> unit_stats = stats.At(geo, unit, 0);
    UnitScores(geo, q, k, unit, recomputed);
    ProbabilitiesFromRowStats(geo, 0, geo.tq, unit_stats.max, unit_stats.scale, recomputed);
    p = recomputed;
  }
  const T* gh = g + at.out;
  if (dv) {
    // dV_h = P^T dO_h.
    internal::Gemm<T>(true, false, geo.tk, geo.dh, geo.tq, T(1), p, geo.tk, gh, geo.dim, dv + at.k,
                      geo.kv_stride);
  }
  if (!dq && !dk) return;
  // dS = P o (dP - D) with dP = dO_h V_h^T.
  internal::Gemm<T>(false, true, geo.tq, geo.tk, geo.dh, T(1), gh, geo.dim, v + at.k, geo.kv_stride,
                    ds, geo.tk);
  ScoreGradientsInPlace(geo, geo.tq, p, gh, out + at.out, ds);
  if (dq) {
    // dQ_h = scale dS K_h.
    internal::Gemm<T>(false, false, geo.tq, geo.dh, geo.tk, scale, ds, geo.tk, k + at.k,
                      geo.kv_stride, dq + at.q, geo.q_stride);
  }
  if (dk) {
    // dK_h = scale dS^T Q_h.
    internal::Gemm<T>(true, false, geo.tk, geo.dh, geo.tq, scale, ds, geo.tk, q + at.q,
                      geo.q_stride, dk + at.k, geo.kv_stride);
  }
}

// ------------------------------------------ one unit, float32, by blocks

// The float32 blocks (QueryBlockRows) share the forward's query blocks;
// every product is the packed kernel's, with K_h^T, V_h, V_h^T and K_h
// packed once per unit; forward rows are bitwise what the whole-block
// product gives for them.
//
// Backward: dK += dS^T Q and dV += P^T dO have the block's queries as their
// depth, and a product of depth 24 spends a large share of its time loading
// and storing its C tiles; 96 queries (Tk = 256) make them about as
// efficient as the other products while the block's P and dS (96 KiB each)
// still share L2 (whole [Tq, Tk] blocks gain nothing more:
// bench/RESULTS.md).
constexpr int64_t kBackwardScoreFloats = 24576;

// The float32 paths pack K_h^T times the score factor scale log2(e), so
// the score tiles need no multiplication of their results (for a depth-16
// tile that multiplication is a visible share of the work:
// bench/RESULTS.md).
float ScoreFactor(const AttentionGeometry& geo) { return static_cast<float>(geo.ScoreScale()); }

// Scores (base-2 units) of queries [i0, i0 + rows) of a unit, into s;
// keys_t holds ScoreFactor(geo) K_h^T.
void BlockScores(const AttentionGeometry& geo,
                 const internal::PackedFloatB& keys_t,
                 const float* q_unit,
                 int64_t i0,
                 int64_t rows,
                 float* s) {
  keys_t.Multiply(false, rows, 1.0f, q_unit + i0 * geo.q_stride, geo.q_stride, s, geo.tk);
}

// The float32 UnitForwardByQueryRows, packed. With p_unit each
// block's probabilities are written there (normalised) and multiply V as
// they are; without, the block's exponentials stay in scratch and the
// output rows are normalised instead.
void UnitForwardByQueryBlocks(const AttentionGeometry& geo,
                              const float* q,
                              const float* k,
                              const float* v,
                              int64_t unit,
                              float* out,
                              float* p_unit,
                              const RowStats<float>& stats) {
  thread_local internal::PackedFloatB keys_t;
  thread_local internal::PackedFloatB values;
  const UnitOffsets at = OffsetsOf(geo, unit);
  keys_t.Pack(true, geo.dh, geo.tk, k + at.k, geo.kv_stride, ScoreFactor(geo));
  if (out) values.Pack(false, geo.tk, geo.dh, v + at.k, geo.kv_stride);
  const int64_t block_rows = QueryBlockRows(geo, kForwardScoreFloats);
  float* scratch = Scratch<float>(block_rows * (geo.tk + 1));
  float* row_scale = scratch + block_rows * geo.tk;
  for (int64_t i0 = 0; i0 < geo.tq; i0 += block_rows) {
    const int64_t rows = std::min(block_rows, geo.tq - i0);
    float* p = p_unit ? p_unit + i0 * geo.tk : scratch;
    const RowStats<float> block_stats = stats.At(geo, unit, i0);
    float* block_scale = block_stats.defined() ? block_stats.scale : row_scale;
    BlockScores(geo, keys_t, q + at.q, i0, rows, p);
    ExponentiateRows(geo, i0, rows, p_unit != nullptr, p, block_scale, block_stats.max);
    if (out == nullptr) continue;
    float* o = out + at.out + i0 * geo.dim;
    values.Multiply(false, rows, 1.0f, p, geo.tk, o, geo.dim);
    if (p_unit) continue;
    NormaliseOutputRows(geo, rows, block_scale, o);
  }
}

// The float32 UnitBackwardWhole, by blocks of queries: each block's
// probabilities (read from p_unit once, or recomputed) give its share of
// dV and dK (accumulated over blocks, in block order) and its rows of dQ.
void UnitBackwardByQueryBlocks(const AttentionGeometry& geo,
                               const float* q,
                               const float* k,
                               const float* v,
                               const float* p_unit,
                               const RowStats<float>& stats,
                               const float* out,
                               const float* g,
                               int64_t unit,
                               float* dq,
                               float* dk,
                               float* dv) {
  thread_local internal::PackedFloatB keys_t;         // K_h^T, for recomputed scores
  thread_local internal::PackedFloatB values_t;       // V_h^T, for dP = dO V^T
  thread_local internal::PackedFloatB keys;           // K_h, for dQ = dS K
  thread_local internal::PackedFloatB block_operand;  // dO or Q rows of a block
  const UnitOffsets at = OffsetsOf(geo, unit);
  const float scale = static_cast<float>(geo.scale);
  const bool score_grads = dq != nullptr || dk != nullptr;
  if (p_unit == nullptr)
    keys_t.Pack(true, geo.dh, geo.tk, k + at.k, geo.kv_stride, ScoreFactor(geo));
  if (score_grads) values_t.Pack(true, geo.dh, geo.tk, v + at.k, geo.kv_stride);
  if (dq) keys.Pack(false, geo.tk, geo.dh, k + at.k, geo.kv_stride);
  const int64_t block_rows = QueryBlockRows(geo, kBackwardScoreFloats);
  float* scratch = Scratch<float>(2 * block_rows * geo.tk + block_rows);
  float* recomputed = scratch;
  float* ds = scratch + block_rows * geo.tk;
  float* row_dots = ds + block_rows * geo.tk;
  for (int64_t i0 = 0; i0 < geo.tq; i0 += block_rows) {
    const int64_t rows = std::min(block_rows, geo.tq - i0);
    const bool later_block = i0 > 0;
    const float* p = p_unit ? p_unit + i0 * geo.tk : recomputed;
    if (p_unit == nullptr) {
      const RowStats<float> block_stats = stats.At(geo, unit, i0);
      BlockScores(geo, keys_t, q + at.q, i0, rows, recomputed);
      ProbabilitiesFromRowStats(geo, i0, rows, block_stats.max, block_stats.scale, recomputed);
    }
    const float* g_rows = g + at.out + i0 * geo.dim;
    if (dv) {
      // dV_h += P_block^T dO_block.
      block_operand.Pack(false, rows, geo.dh, g_rows, geo.dim);
      block_operand.Multiply(true, geo.tk, 1.0f, p, geo.tk, dv + at.k, geo.kv_stride, later_block);
    }
    if (!score_grads) continue;
    // dS = P o (dP - D) with dP = dO V^T, made in dP's tiles (dP is never
    // stored), with D_r from SoftmaxRowDot: one pass over dP instead of a
    // product and a second pass, with the same losses bitwise
    // (bench/RESULTS.md).
    const float* o_rows = out + at.out + i0 * geo.dim;
    for (int64_t r = 0; r < rows; ++r) {
      row_dots[r] = SoftmaxRowDot(geo, g_rows, o_rows, r);
    }
    values_t.MultiplySoftmaxGradient(false, rows, g_rows, geo.dim, p, geo.tk, row_dots, ds, geo.tk);
    if (dq) {
      // dQ_block = scale dS_block K_h.
      keys.Multiply(false, rows, scale, ds, geo.tk, dq + at.q + i0 * geo.q_stride, geo.q_stride);
    }
    if (dk) {
      // dK_h += scale dS_block^T Q_block.
      block_operand.Pack(false, rows, geo.dh, q + at.q + i0 * geo.q_stride, geo.q_stride);
      block_operand.Multiply(true, geo.tk, scale, ds, geo.tk, dk + at.k, geo.kv_stride,
                             later_block);
    }
  }
}

// ------------------------------------------------------------- kernels

// Writes out = softmax(scale q k^T, masked) v for every (b, h); when probs
// is not null it also keeps the probabilities there ([B, heads, Tq, Tk]),
// and when stats are given, the row statistics there. out may be null when
// only the probabilities are wanted.
template <typename T>
void AttentionForwardKernel(const AttentionGeometry& geo,
                            const T* q,
                            const T* k,
                            const T* v,
                            T* out,
                            T* probs,
                            const RowStats<T>& stats = {}) {
  const int64_t block = geo.tq * geo.tk;
  ParallelFor(0, geo.batch * geo.heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t unit = begin; unit < end; ++unit) {
      T* p_unit = probs ? probs + unit * block : nullptr;
      if constexpr (std::is_same_v<T, float>) {
        UnitForwardByQueryBlocks(geo, q, k, v, unit, out, p_unit, stats);
      } else {
        UnitForwardByQueryRows(geo, q, k, v, unit, out, p_unit, stats);
      }
    }
  });
}

// The fused VJP: given P (or null: each unit recomputes it from the row
// statistics, so no [B, heads, Tq, Tk] tensor is made), the output O and dO,
// writes dq, dk, dv (each null when not wanted) for every (b, h).
template <typename T>
void AttentionBackwardKernel(const AttentionGeometry& geo,
                             const T* q,
                             const T* k,
                             const T* v,
                             const T* probs,
                             const RowStats<T>& stats,
                             const T* out,
                             const T* g,
                             T* dq,
                             T* dk,
                             T* dv) {
  SP_CHECK(probs != nullptr || stats.defined(),
           "attention backward: neither the probabilities nor the row statistics were kept");
  const int64_t block = geo.tq * geo.tk;
  ParallelFor(0, geo.batch * geo.heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t unit = begin; unit < end; ++unit) {
      const T* p_unit = probs ? probs + unit * block : nullptr;
      if constexpr (std::is_same_v<T, float>) {
        UnitBackwardByQueryBlocks(geo, q, k, v, p_unit, stats, out, g, unit, dq, dk, dv);
      } else {
        UnitBackwardWhole(geo, q, k, v, p_unit, stats, out, g, unit, dq, dk, dv);
      }
    }
  });
}

// [B, T, heads * dh] -> [B, heads, T, dh] (a copy).
Var SplitHeads(const Var& x, int64_t heads) {
  return permute(reshape(x, Shape{x.dim(0), x.dim(1), heads, x.dim(2) / heads}), {0, 2, 1, 3});
}

}  // namespace

Var multi_head_attention_reference(
    const Var& q, const Var& k, const Var& v, int64_t heads, double scale, bool causal) {
  const AttentionGeometry geo = ResolveAttention(q, k, v, heads, scale, causal);
  Var scores = matmul(SplitHeads(mul_scalar(q, scale), heads), SplitHeads(k, heads), false, true);
  if (causal) {
    Tensor mask = Tensor::Zeros(Shape{geo.tq, geo.tk}, q.dtype());
    for (int64_t i = 0; i < geo.tq; ++i) {
      for (int64_t j = geo.VisibleKeys(i); j < geo.tk; ++j) mask.set(i * geo.tk + j, 1.0);
    }
    scores = masked_fill(scores, mask, -std::numeric_limits<double>::infinity());
  }
  const Var heads_out = matmul(softmax(scores), SplitHeads(v, heads));  // [B, H, Tq, dh]
  return reshape(permute(heads_out, {0, 2, 1, 3}), Shape{geo.batch, geo.tq, geo.dim});
}

namespace {

// q, k and v of a value list: {q, k, v}, or {qkv} with the three side by
// side in each row.
template <typename T>
struct Operands {
  const T* q;
  const T* k;
  const T* v;
};
template <typename T>
Operands<T> OperandsOf(const AttentionGeometry& geo, const std::vector<const Tensor*>& values) {
  if (values.size() == 1) {
    const T* qkv = values[0]->data<T>();
    return {qkv, qkv + geo.dim, qkv + 2 * geo.dim};
  }
  return {values[0]->data<T>(), values[1]->data<T>(), values[2]->data<T>()};
}

std::vector<const Tensor*> ValuesOf(const VarList& inputs) {
  std::vector<const Tensor*> values;
  for (const Var& input : inputs) values.push_back(&input.value());
  return values;
}

// The unfused form of either op, for create_graph.
Var ReferenceAttention(const AttentionGeometry& geo, const VarList& in) {
  if (in.size() == 1) {
    const Var& qkv = in[0];
    return multi_head_attention_reference(
        slice(qkv, 2, 0, geo.dim), slice(qkv, 2, geo.dim, 2 * geo.dim),
        slice(qkv, 2, 2 * geo.dim, 3 * geo.dim), geo.heads, geo.scale, geo.causal);
  }
  return multi_head_attention_reference(in[0], in[1], in[2], geo.heads, geo.scale, geo.causal);
}

// The probabilities a node keeps for its second and later VJPs are at most
// this many times the size of its inputs (q, k and v): with d = heads * dh,
// self-attention keeps them up to T = 24 d / heads (384 for W1's d = 64 and
// 4 heads, so W2's T = 256 keeps them).
constexpr int64_t kReusedProbabilitiesFactor = 8;

// The row statistics held in a [2, B, heads, Tq] tensor (none if undefined).
template <typename T>
RowStats<T> StatsOf(Tensor& row_stats) {
  if (!row_stats.defined()) return {};
  T* data = row_stats.data<T>();
  return {data, data + row_stats.numel() / 2};
}

// Runs the fused forward on inputs {q, k, v} or {qkv} and records it with
// its fused VJP.
Var RecordAttention(const AttentionGeometry& geo, const VarList& inputs) {
  // The probabilities [B, heads, Tq, Tk] are the largest activation of a
  // transformer once Tk exceeds a few head widths. When they are no larger
  // than q, k and v together (short sequences) a recorded forward pass
  // keeps them. Otherwise it does not, and the backward pass recomputes
  // them (one extra Q K^T and exponential per call): the first call block
  // by block in scratch memory, within the fused VJP, so a graph used once
  // (an explicit stack) never holds them; a second call through the same
  // node (the adjoint iterations of an implicit layer) computes them once
  // more and keeps them for every later call. The forward pass then keeps
  // each query row's max and 1 / sum instead ([2, B, heads, Tq]), which
  // make the recomputation one pass per row and bitwise the forward's P.
  // Kept from the second call, P saves each later call its recomputation,
  // but for long sequences it is the largest tensor an implicit layer holds
  // (at T = 1024 most of the step's peak: bench/RESULTS.md, `bench scale`),
  // so beyond kReusedProbabilitiesFactor times the size of q, k and v every
  // call recomputes it block by block and the peak stays that of the
  // recorded evaluation's activations.
  struct Saved {
    Tensor probs;
    Tensor row_stats;
    int backward_calls = 0;
  };
  int64_t inputs_numel = 0;
  for (const Var& input : inputs) inputs_numel += input.numel();
  const DType dtype = inputs[0].dtype();
  const bool recording = WouldRecord(inputs);
  const int64_t probs_numel = geo.batch * geo.heads * geo.tq * geo.tk;
  const bool keep_probs = recording && probs_numel <= inputs_numel;
  const bool keep_on_reuse = probs_numel <= kReusedProbabilitiesFactor * inputs_numel;
  const Shape probs_shape{geo.batch, geo.heads, geo.tq, geo.tk};
  auto saved = std::make_shared<Saved>();
  if (keep_probs) saved->probs = Tensor(probs_shape, dtype);
  if (recording && !keep_probs) {
    saved->row_stats = Tensor(Shape{2, geo.batch, geo.heads, geo.tq}, dtype);
  }
  Tensor out(Shape{geo.batch, geo.tq, geo.dim}, dtype);
  DispatchDType(dtype, [&](auto zero) {
    using T = decltype(zero);
    const Operands<T> x = OperandsOf<T>(geo, ValuesOf(inputs));
    AttentionForwardKernel<T>(geo, x.q, x.k, x.v, out.data<T>(),
                              keep_probs ? saved->probs.data<T>() : nullptr,
                              StatsOf<T>(saved->row_stats));
  });
  return RecordOp(
      inputs.size() == 1 ? "multi_head_self_attention" : "multi_head_attention", out, inputs,
      [geo, saved, probs_shape, keep_on_reuse](const VarList& in, const Var& self, const Var& g) {
        std::vector<bool> wanted;
        for (size_t i = 0; i < in.size(); ++i) wanted.push_back(WantsInputGrad(in, i));
        if (GradModeEnabled()) {
          // create_graph: differentiate the differentiable form (recorded),
          // with respect to one node per slot (a product by 1, exact): an
          // input passed in two slots (self-attention as mha(x, x, x)) then
          // gets each slot's share, not the total in every slot.
          VarList slots;
          for (const Var& input : in) slots.push_back(mul_scalar(input, 1.0));
          VarList grads =
              grad({ReferenceAttention(geo, slots)}, slots, {g}, {.create_graph = true});
          for (size_t i = 0; i < in.size(); ++i) {
            if (!wanted[i]) grads[i] = Var();
          }
          return grads;
        }
        const DType dtype = in[0].dtype();
        const std::vector<const Tensor*> values = ValuesOf(in);
        Tensor& probs = saved->probs;
        if (++saved->backward_calls >= 2 && !probs.defined() && keep_on_reuse) {
          probs = Tensor(probs_shape, dtype);
          DispatchDType(dtype, [&](auto zero) {
            using T = decltype(zero);
            const Operands<T> x = OperandsOf<T>(geo, values);
            AttentionForwardKernel<T>(geo, x.q, x.k, x.v, nullptr, probs.data<T>());
          });
        }
        VarList grads(in.size());
        std::vector<Tensor> grad_values(in.size());
        for (size_t i = 0; i < in.size(); ++i) {
          // The kernels write every entry, except that with no query
          // (Tq = 0) there is nothing to write into dk and dv: zeros.
          if (wanted[i]) {
            grad_values[i] =
                geo.tq == 0 ? Tensor::Zeros(in[i].shape(), dtype) : Tensor(in[i].shape(), dtype);
          }
        }
        DispatchDType(dtype, [&](auto zero) {
          using T = decltype(zero);
          const Operands<T> x = OperandsOf<T>(geo, values);
          // Where each gradient goes: one packed [B, T, 3 dim] tensor gets
          // dq, dk and dv in its three column ranges (every entry written
          // once), separate inputs get one each.
          T* dq = nullptr;
          T* dk = nullptr;
          T* dv = nullptr;
          if (in.size() == 1) {
            if (wanted[0]) {
              T* dqkv = grad_values[0].data<T>();
              dq = dqkv;
              dk = dqkv + geo.dim;
              dv = dqkv + 2 * geo.dim;
            }
          } else {
            dq = wanted[0] ? grad_values[0].data<T>() : nullptr;
            dk = wanted[1] ? grad_values[1].data<T>() : nullptr;
            dv = wanted[2] ? grad_values[2].data<T>() : nullptr;
          }
          AttentionBackwardKernel<T>(geo, x.q, x.k, x.v,
                                     probs.defined() ? probs.data<T>() : nullptr,
                                     StatsOf<T>(saved->row_stats), self.value().data<T>(),
                                     g.value().data<T>(), dq, dk, dv);
        });
        for (size_t i = 0; i < in.size(); ++i) {
          if (wanted[i]) grads[i] = Var(grad_values[i]);
        }
        return grads;
      });
}

}  // namespace

Var multi_head_attention(
    const Var& q, const Var& k, const Var& v, int64_t heads, double scale, bool causal) {
  return RecordAttention(ResolveAttention(q, k, v, heads, scale, causal), {q, k, v});
}

Var multi_head_self_attention(const Var& qkv, int64_t heads, double scale, bool causal) {
  SP_CHECK(qkv.defined(), "multi_head_self_attention: qkv is undefined");
  SP_CHECK(qkv.rank() == 3 && qkv.dim(2) % 3 == 0, "multi_head_self_attention: qkv ", qkv.shape(),
           " must be [B, T, 3 D] (q, k and v side by side)");
  const int64_t dim = qkv.dim(2) / 3;
  SP_CHECK(heads > 0 && dim % heads == 0, "multi_head_self_attention: width ", dim, " of q in qkv ",
           qkv.shape(), " is not a positive multiple of heads ", heads);
  SP_CHECK(scale > 0.0 && std::isfinite(scale),
           "multi_head_self_attention: scale must be > 0, got ", scale);
  return RecordAttention(
      MakeGeometry(qkv.dim(0), qkv.dim(1), qkv.dim(1), heads, dim, 3 * dim, scale, causal), {qkv});
}

}  // namespace stillpoint
