// Fused multi-head scaled dot-product attention (see ops.h).
//
// q, k and v stay in the projections' [B, T, heads * dh] layout: head h of
// batch entry b is the strided [T, dh] block of columns [h dh, (h + 1) dh),
// read and written in place as a GEMM operand with a row stride, so no
// permuted copies are made. One task handles one (b, h) pair from scores to
// output (and, in backward, from the output gradient to the three input
// gradients), so the [Tq, Tk] score block stays in cache, the work spreads
// over batch x heads, and every output entry is written by exactly one task:
// results are bitwise identical for any thread count.
//
// A recorded forward pass keeps the probabilities P [B, heads, Tq, Tk] for
// the backward pass when they are no larger than q, k and v together;
// otherwise backward recomputes them, block by block in the first call and
// kept from the second call on. The fused VJP is used
// without create_graph; with create_graph the VJP differentiates the same
// attention written with differentiable ops (multi_head_attention_reference),
// so second derivatives work.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "framework/gemm.h"
#include "framework/ops.h"
#include "framework/parallel.h"
#include "framework/vector_math.h"

namespace stillpoint {
namespace {

struct AttentionGeometry {
  int64_t batch = 0;
  int64_t tq = 0;
  int64_t tk = 0;
  int64_t heads = 0;
  int64_t dh = 0;
  int64_t dim = 0;  // heads * dh
  double scale = 1.0;
  bool causal = false;

  // Keys [0, VisibleKeys(i)) are visible to query i.
  int64_t VisibleKeys(int64_t i) const {
    if (!causal) return tk;
    return std::clamp<int64_t>(i + (tk - tq) + 1, 0, tk);
  }
};

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
  AttentionGeometry geo;
  geo.batch = q.dim(0);
  geo.tq = q.dim(1);
  geo.tk = k.dim(1);
  geo.heads = heads;
  geo.dim = q.dim(2);
  geo.dh = geo.dim / heads;
  geo.scale = scale;
  geo.causal = causal;
  return geo;
}

// Per-thread scratch of at least n entries (a [Tq, Tk] block).
template <typename T>
T* Scratch(int64_t n) {
  thread_local std::vector<T> buffer;
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(n);
  return buffer.data();
}

// Offsets of head h of batch entry b in q/out ([B, Tq, D]) and k/v
// ([B, Tk, D]) for unit = b heads + h.
struct UnitOffsets {
  int64_t q = 0;
  int64_t k = 0;
};
UnitOffsets OffsetsOf(const AttentionGeometry& geo, int64_t unit) {
  const int64_t b = unit / geo.heads;
  const int64_t h = unit % geo.heads;
  return {b * geo.tq * geo.dim + h * geo.dh, b * geo.tk * geo.dim + h * geo.dh};
}

// One unit's [Tq, Tk] block p = exp(scale q_h k_h^T - row max), masked;
// row_scale[i] = 1 / (row i's sum). With normalize the rows of p are
// divided by their sums (the probabilities).
template <typename T>
void UnitExponentials(const AttentionGeometry& geo,
                      const T* q,
                      const T* k,
                      int64_t unit,
                      bool normalize,
                      T* p,
                      T* row_scale) {
  const UnitOffsets at = OffsetsOf(geo, unit);
  internal::Gemm<T>(false, true, geo.tq, geo.tk, geo.dh, static_cast<T>(geo.scale), q + at.q,
                    geo.dim, k + at.k, geo.dim, p, geo.tk);
  for (int64_t i = 0; i < geo.tq; ++i) {
    T* row = p + i * geo.tk;
    const int64_t visible = geo.VisibleKeys(i);
    if (visible == 0) {
      // Every key hidden: softmax of all -inf, as the unfused ops give.
      std::fill_n(row, geo.tk, std::numeric_limits<T>::quiet_NaN());
      row_scale[i] = std::numeric_limits<T>::quiet_NaN();
      continue;
    }
    const T m = internal::VecMax(row, visible);
    const T sum = internal::VecExpShifted(row, m, row, visible);
    row_scale[i] = T(1) / sum;
    std::fill(row + visible, row + geo.tk, T(0));
    if (normalize) {
      for (int64_t j = 0; j < visible; ++j) row[j] *= row_scale[i];
    }
  }
}

// Writes out = softmax(scale q k^T, masked) v for every (b, h); when probs
// is not null it also keeps the probabilities there ([B, heads, Tq, Tk]).
// out may be null when only the probabilities are wanted.
template <typename T>
void AttentionForwardKernel(
    const AttentionGeometry& geo, const T* q, const T* k, const T* v, T* out, T* probs) {
  const int64_t units = geo.batch * geo.heads;
  const int64_t block = geo.tq * geo.tk;
  ParallelFor(0, units, 1, [&](int64_t begin, int64_t end) {
    for (int64_t unit = begin; unit < end; ++unit) {
      const UnitOffsets at = OffsetsOf(geo, unit);
      T* scratch = Scratch<T>(block + geo.tq);
      T* p = probs ? probs + unit * block : scratch;
      T* row_scale = scratch + block;
      // Kept probabilities are normalised; for the output alone the
      // normalisation is applied to the [Tq, dh] rows of O instead of the
      // [Tq, Tk] rows of P (dh << Tk).
      UnitExponentials(geo, q, k, unit, probs != nullptr, p, row_scale);
      if (out == nullptr) continue;
      // O_h = P V_h, written into the head's columns of out.
      T* o = out + at.q;
      internal::Gemm<T>(false, false, geo.tq, geo.dh, geo.tk, T(1), p, geo.tk, v + at.k, geo.dim, o,
                        geo.dim);
      if (probs) continue;
      for (int64_t i = 0; i < geo.tq; ++i) {
        T* o_row = o + i * geo.dim;
        for (int64_t j = 0; j < geo.dh; ++j) o_row[j] *= row_scale[i];
      }
    }
  });
}

// The fused VJP: given P (or null: each unit recomputes its block into
// scratch, so no [B, heads, Tq, Tk] tensor is made), the output O and dO,
// writes dq, dk, dv (each null when not wanted) for every (b, h).
template <typename T>
void AttentionBackwardKernel(const AttentionGeometry& geo,
                             const T* q,
                             const T* k,
                             const T* v,
                             const T* probs,
                             const T* out,
                             const T* g,
                             T* dq,
                             T* dk,
                             T* dv) {
  const int64_t units = geo.batch * geo.heads;
  const int64_t block = geo.tq * geo.tk;
  const T scale = static_cast<T>(geo.scale);
  ParallelFor(0, units, 1, [&](int64_t begin, int64_t end) {
    for (int64_t unit = begin; unit < end; ++unit) {
      const UnitOffsets at = OffsetsOf(geo, unit);
      T* scratch = Scratch<T>(2 * block + geo.tq);
      T* ds = scratch;
      const T* p = probs + unit * block;
      if (probs == nullptr) {
        UnitExponentials(geo, q, k, unit, true, scratch + block, scratch + 2 * block);
        p = scratch + block;
      }
      const T* gh = g + at.q;
      if (dv) {
        // dV_h = P^T dO_h.
        internal::Gemm<T>(true, false, geo.tk, geo.dh, geo.tq, T(1), p, geo.tk, gh, geo.dim,
                          dv + at.k, geo.dim);
      }
      if (!dq && !dk) continue;
      // dS = P o (dP - D) with dP = dO_h V_h^T, in place. The row sums
      // D_i = sum_j dP_ij P_ij equal dO_i . O_i (as O_i = sum_j P_ij V_j): a
      // dot of length dh instead of a pass over the [Tq, Tk] block.
      internal::Gemm<T>(false, true, geo.tq, geo.tk, geo.dh, T(1), gh, geo.dim, v + at.k, geo.dim,
                        ds, geo.tk);
      const T* oh = out + at.q;
      for (int64_t i = 0; i < geo.tq; ++i) {
        T* row = ds + i * geo.tk;
        const T* prow = p + i * geo.tk;
        const T d = internal::VecDot(gh + i * geo.dim, oh + i * geo.dim, geo.dh);
        for (int64_t j = 0; j < geo.tk; ++j) row[j] = prow[j] * (row[j] - d);
      }
      if (dq) {
        // dQ_h = scale dS K_h.
        internal::Gemm<T>(false, false, geo.tq, geo.dh, geo.tk, scale, ds, geo.tk, k + at.k,
                          geo.dim, dq + at.q, geo.dim);
      }
      if (dk) {
        // dK_h = scale dS^T Q_h.
        internal::Gemm<T>(true, false, geo.tk, geo.dh, geo.tq, scale, ds, geo.tk, q + at.q, geo.dim,
                          dk + at.k, geo.dim);
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

Var multi_head_attention(
    const Var& q, const Var& k, const Var& v, int64_t heads, double scale, bool causal) {
  const AttentionGeometry geo = ResolveAttention(q, k, v, heads, scale, causal);
  // The probabilities [B, heads, Tq, Tk] are the largest activation of a
  // transformer once Tk exceeds a few head widths. When they are no larger
  // than q, k and v together (short sequences) a recorded forward pass
  // keeps them. Otherwise it does not, and the backward pass recomputes
  // them (one extra Q K^T and softmax per call): the first call block by
  // block in scratch memory, within the fused VJP, so a graph used once
  // (an explicit stack) never holds them; a second call through the same
  // node (the adjoint iterations of an implicit layer) computes them once
  // more and keeps them for every later call.
  struct Saved {
    Tensor probs;
    int backward_calls = 0;
  };
  const bool recording =
      GradModeEnabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  const int64_t probs_numel = geo.batch * geo.heads * geo.tq * geo.tk;
  const bool keep_probs = recording && probs_numel <= q.numel() + k.numel() + v.numel();
  auto saved = std::make_shared<Saved>();
  Tensor& probs_now = saved->probs;
  if (keep_probs) probs_now = Tensor(Shape{geo.batch, geo.heads, geo.tq, geo.tk}, q.dtype());
  Tensor out(q.shape(), q.dtype());
  DispatchDType(q.dtype(), [&](auto zero) {
    using T = decltype(zero);
    AttentionForwardKernel<T>(geo, q.value().data<T>(), k.value().data<T>(), v.value().data<T>(),
                              out.data<T>(), keep_probs ? probs_now.data<T>() : nullptr);
  });
  return RecordOp(
      "multi_head_attention", out, {q, k, v},
      [geo, saved](const VarList& in, const Var& self, const Var& g) {
        const bool want_q = WantsInputGrad(in, 0);
        const bool want_k = WantsInputGrad(in, 1);
        const bool want_v = WantsInputGrad(in, 2);
        if (GradModeEnabled()) {
          // create_graph: differentiate the differentiable form (recorded).
          const VarList inputs{in[0], in[1], in[2]};
          const Var out =
              multi_head_attention_reference(in[0], in[1], in[2], geo.heads, geo.scale, geo.causal);
          VarList grads = grad({out}, inputs, {g}, {.create_graph = true});
          if (!want_q) grads[0] = Var();
          if (!want_k) grads[1] = Var();
          if (!want_v) grads[2] = Var();
          return grads;
        }
        Tensor& probs = saved->probs;
        if (++saved->backward_calls >= 2 && !probs.defined()) {
          probs = Tensor(Shape{geo.batch, geo.heads, geo.tq, geo.tk}, in[0].dtype());
          DispatchDType(in[0].dtype(), [&](auto zero) {
            using T = decltype(zero);
            AttentionForwardKernel<T>(geo, in[0].value().data<T>(), in[1].value().data<T>(),
                                      in[2].value().data<T>(), nullptr, probs.data<T>());
          });
        }
        Tensor dq, dk, dv;
        if (want_q) dq = Tensor(in[0].shape(), in[0].dtype());
        if (want_k) dk = Tensor(in[1].shape(), in[1].dtype());
        if (want_v) dv = Tensor(in[2].shape(), in[2].dtype());
        DispatchDType(in[0].dtype(), [&](auto zero) {
          using T = decltype(zero);
          AttentionBackwardKernel<T>(
              geo, in[0].value().data<T>(), in[1].value().data<T>(), in[2].value().data<T>(),
              probs.defined() ? probs.data<T>() : nullptr, self.value().data<T>(),
              g.value().data<T>(), want_q ? dq.data<T>() : nullptr, want_k ? dk.data<T>() : nullptr,
              want_v ? dv.data<T>() : nullptr);
        });
        return VarList{want_q ? Var(dq) : Var(), want_k ? Var(dk) : Var(),
                       want_v ? Var(dv) : Var()};
      });
}

}  // namespace stillpoint
