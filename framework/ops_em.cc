// The fused EM ops of probabilistic attention (see ops_em.h): the update
// and the query part of the logits.
//
// The update. Forward, per (b, h): S = beta v mu^T (one GEMM), S += logits, row
// softmax in place (W), out = W mu (one GEMM). A recorded forward keeps W
// [B, H, N, S] for the backward pass; a graph through the update is the
// outer adjoint's VJP of an implicit layer, called once per adjoint
// iteration, so W is computed once and read by every call.
//
// Backward, for the output gradient G [N, dv]: dW = G mu^T, and the softmax
// gradient dS = W o (dW - rowdot), where rowdot_i = sum_j W_ij dW_ij =
// G_i . out_i (one dot product per row instead of a pass over dW). Then
// d logits = dS, dv = beta dS mu, dmu = W^T G + beta dS^T v and
// dbeta = sum(v o (dS mu)) (summed over the batch in a fixed order).
//
// The query part of the logits. Forward, per (b, h): out = alpha q xi^T (one
// GEMM, alpha its scale), then out_ij -= alpha |q_i|^2 / 2 in the same row
// pass. Backward, for the output gradient G [N, S], with r_i = sum_j G_ij:
// dq = alpha (G xi - r o q), dxi = alpha G^T q, and dalpha = sum(G o S) with
// S = q xi^T - |q|^2 / 2 recomputed by one GEMM (only when alpha's gradient
// is wanted), summed over the batch in a fixed order.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "framework/ops_em.h"
#include "framework/kernels/gemm.h"
#include "framework/kernels/vector_math.h"
#include "framework/ops.h"
#include "framework/parallel.h"

namespace stillpoint {
namespace {

struct EmGeometry {
  int64_t batch = 0, heads = 0, queries = 0, keys = 0, width = 0;
  int64_t Units() const { return batch * heads; }
};

// The composed form (for create_graph and for shapes the kernel does not
// take).
Var ReferenceEm(const Var& v, const Var& logits, const Var& mu, const Var& beta) {
  return matmul(softmax(add(logits, mul(beta, matmul(v, mu, false, true)))), mu);
}

// A per-head scalar parameter ([1, H, 1, 1] or one element) for a head.
template <typename T>
T PerHead(const Tensor& parameter, int64_t head) {
  return parameter.numel() == 1 ? parameter.data<T>()[0] : parameter.data<T>()[head];
}

// Whether p is one element or [1, heads, 1, 1].
bool IsPerHead(const Var& p, int64_t heads) {
  return p.numel() == 1 ||
         (p.rank() == 4 && p.dim(0) == 1 && p.dim(1) == heads && p.dim(2) == 1 && p.dim(3) == 1);
}

// The gradient of a per-head parameter shaped like `like` from per-(b, h)
// partial sums [B * H], summed over the batch, head by head, in batch order.
template <typename T>
Var SumPartsByHead(const Tensor& parts, const Var& like, int64_t heads) {
  Tensor total = Tensor::Zeros(like.shape(), like.dtype());
  T* out = total.data<T>();
  const T* p = parts.data<T>();
  for (int64_t unit = 0; unit < parts.numel(); ++unit) {
    out[like.numel() == 1 ? 0 : unit % heads] += p[unit];
  }
  return constant(total);
}

// The VJP of a fused op under create_graph: the composed form's, one node
// per input slot (as the fused attention does), undefined where not wanted.
VarList ComposedVjp(const std::function<Var(const VarList&)>& composed,
                    const VarList& in,
                    const Var& g) {
  std::vector<bool> wanted;
  for (size_t i = 0; i < in.size(); ++i) wanted.push_back(WantsInputGrad(in, i));
  VarList slots;
  for (const Var& input : in) slots.push_back(mul_scalar(input, 1.0));
  VarList grads = grad({composed(slots)}, slots, {g}, {.create_graph = true});
  for (size_t i = 0; i < in.size(); ++i) {
    if (!wanted[i]) grads[i] = Var();
  }
  return grads;
}

// out [B, H, N, dv] and, when weights is not null, W [B, H, N, S].
template <typename T>
void EmForwardKernel(const EmGeometry& g,
                     const Tensor& v,
                     const Tensor& logits,
                     const Tensor& mu,
                     const Tensor& beta,
                     T* out,
                     T* weights) {
  const int64_t n = g.queries, s = g.keys, d = g.width;
  ParallelFor(0, g.Units(), 1, [&](int64_t begin, int64_t end) {
    std::vector<T> scratch(weights == nullptr ? static_cast<size_t>(n * s) : 0);
    for (int64_t unit = begin; unit < end; ++unit) {
      const T b = PerHead<T>(beta, unit % g.heads);
      const T* vu = v.data<T>() + unit * n * d;
      const T* mu_u = mu.data<T>() + unit * s * d;
      const T* lu = logits.data<T>() + unit * n * s;
      T* w = weights != nullptr ? weights + unit * n * s : scratch.data();
      internal::Gemm<T>(false, true, n, s, d, b, vu, d, mu_u, d, w, s);
      for (int64_t i = 0; i < n; ++i) {
        T* row = w + i * s;
        const T* lrow = lu + i * s;
        for (int64_t j = 0; j < s; ++j) row[j] += lrow[j];
        const T top = internal::VecMax(row, s);
        const T inverse = T(1) / internal::VecExpShifted(row, top, row, s);
        for (int64_t j = 0; j < s; ++j) row[j] *= inverse;
      }
      internal::Gemm<T>(false, false, n, d, s, T(1), w, s, mu_u, d, out + unit * n * d, d);
    }
  });
}

// The gradients of the wanted inputs (null pointers: not wanted); beta's
// per-unit partial sums go to beta_parts [B * H].
template <typename T>
void EmBackwardKernel(const EmGeometry& g,
                      const Tensor& v,
                      const Tensor& mu,
                      const Tensor& beta,
                      const T* weights,
                      const T* out,
                      const T* grad_out,
                      T* dv,
                      T* dlogits,
                      T* dmu,
                      T* beta_parts) {
  const int64_t n = g.queries, s = g.keys, d = g.width;
  ParallelFor(0, g.Units(), 1, [&](int64_t begin, int64_t end) {
    std::vector<T> ds(static_cast<size_t>(n * s));
    std::vector<T> ds_mu(static_cast<size_t>(n * d));
    std::vector<T> extra(static_cast<size_t>(s * d));
    for (int64_t unit = begin; unit < end; ++unit) {
      const T b = PerHead<T>(beta, unit % g.heads);
      const T* vu = v.data<T>() + unit * n * d;
      const T* mu_u = mu.data<T>() + unit * s * d;
      const T* w = weights + unit * n * s;
      const T* gu = grad_out + unit * n * d;
      const T* ou = out + unit * n * d;
      // dW = G mu^T, then dS = W o (dW - G_i . out_i).
      internal::Gemm<T>(false, true, n, s, d, T(1), gu, d, mu_u, d, ds.data(), s);
      for (int64_t i = 0; i < n; ++i) {
        const T rowdot = internal::VecDot(gu + i * d, ou + i * d, d);
        T* row = ds.data() + i * s;
        const T* wrow = w + i * s;
        for (int64_t j = 0; j < s; ++j) row[j] = wrow[j] * (row[j] - rowdot);
      }
      if (dlogits != nullptr) std::copy(ds.begin(), ds.end(), dlogits + unit * n * s);
      if (dv != nullptr || beta_parts != nullptr) {
        // dS mu: dv = beta dS mu, dbeta = sum(v o dS mu).
        internal::Gemm<T>(false, false, n, d, s, T(1), ds.data(), s, mu_u, d, ds_mu.data(), d);
        if (dv != nullptr) {
          T* dvu = dv + unit * n * d;
          for (int64_t e = 0; e < n * d; ++e) dvu[e] = b * ds_mu[e];
        }
        if (beta_parts != nullptr) {
          beta_parts[unit] = internal::VecDot(vu, ds_mu.data(), n * d);
        }
      }
      if (dmu != nullptr) {
        T* dmu_u = dmu + unit * s * d;
        internal::Gemm<T>(true, false, s, d, n, T(1), w, s, gu, d, dmu_u, d);
        internal::Gemm<T>(true, false, s, d, n, b, ds.data(), s, vu, d, extra.data(), d);
        for (int64_t e = 0; e < s * d; ++e) dmu_u[e] += extra[e];
      }
    }
  });
}

struct LogitsGeometry {
  int64_t batch = 0, heads = 0, queries = 0, keys = 0, width = 0;
  int64_t Units() const { return batch * heads; }
};

// The composed form of em_query_logits.
Var ReferenceLogits(const Var& q, const Var& xi, const Var& alpha) {
  return mul(alpha, sub(matmul(q, xi, false, true), mul_scalar(sum(square(q), -1, true), 0.5)));
}

// S = q xi^T - |q|^2 / 2 for one unit, scaled by `scale`, into out [N, S].
template <typename T>
void ScaledScores(const LogitsGeometry& g, const T* qu, const T* xu, T scale, T* out) {
  const int64_t n = g.queries, s = g.keys, d = g.width;
  internal::Gemm<T>(false, true, n, s, d, scale, qu, d, xu, d, out, s);
  for (int64_t i = 0; i < n; ++i) {
    const T shift = scale * internal::VecDot(qu + i * d, qu + i * d, d) / T(2);
    T* row = out + i * s;
    for (int64_t j = 0; j < s; ++j) row[j] -= shift;
  }
}

template <typename T>
void LogitsForwardKernel(
    const LogitsGeometry& g, const Tensor& q, const Tensor& xi, const Tensor& alpha, T* out) {
  const int64_t n = g.queries, s = g.keys, d = g.width;
  ParallelFor(0, g.Units(), 1, [&](int64_t begin, int64_t end) {
    for (int64_t unit = begin; unit < end; ++unit) {
      ScaledScores<T>(g, q.data<T>() + unit * n * d, xi.data<T>() + unit * s * d,
                      PerHead<T>(alpha, unit % g.heads), out + unit * n * s);
    }
  });
}

// The gradients of the wanted inputs (null pointers: not wanted); alpha's
// per-unit partial sums go to alpha_parts [B * H].
template <typename T>
void LogitsBackwardKernel(const LogitsGeometry& g,
                          const Tensor& q,
                          const Tensor& xi,
                          const Tensor& alpha,
                          const T* grad_out,
                          T* dq,
                          T* dxi,
                          T* alpha_parts) {
  const int64_t n = g.queries, s = g.keys, d = g.width;
  ParallelFor(0, g.Units(), 1, [&](int64_t begin, int64_t end) {
    std::vector<T> scores(alpha_parts != nullptr ? static_cast<size_t>(n * s) : 0);
    for (int64_t unit = begin; unit < end; ++unit) {
      const T a = PerHead<T>(alpha, unit % g.heads);
      const T* qu = q.data<T>() + unit * n * d;
      const T* xu = xi.data<T>() + unit * s * d;
      const T* gu = grad_out + unit * n * s;
      if (dq != nullptr) {
        T* dqu = dq + unit * n * d;
        internal::Gemm<T>(false, false, n, d, s, a, gu, s, xu, d, dqu, d);
        for (int64_t i = 0; i < n; ++i) {
          T row_sum = T(0);
          for (int64_t j = 0; j < s; ++j) row_sum += gu[i * s + j];
          const T c = a * row_sum;
          for (int64_t e = 0; e < d; ++e) dqu[i * d + e] -= c * qu[i * d + e];
        }
      }
      if (dxi != nullptr) {
        internal::Gemm<T>(true, false, s, d, n, a, gu, s, qu, d, dxi + unit * s * d, d);
      }
      if (alpha_parts != nullptr) {
        ScaledScores<T>(g, qu, xu, T(1), scores.data());
        alpha_parts[unit] = internal::VecDot(gu, scores.data(), n * s);
      }
    }
  });
}

}  // namespace

Var em_update(const Var& v, const Var& logits, const Var& mu, const Var& beta) {
  SP_CHECK(v.defined() && logits.defined() && mu.defined() && beta.defined(),
           "em_update: an input is undefined");
  const bool fused =
      v.rank() == 4 && logits.rank() == 4 && mu.rank() == 4 && v.dtype() == logits.dtype() &&
      v.dtype() == mu.dtype() && v.dtype() == beta.dtype() && mu.dim(0) == v.dim(0) &&
      mu.dim(1) == v.dim(1) && mu.dim(3) == v.dim(3) && logits.dim(0) == v.dim(0) &&
      logits.dim(1) == v.dim(1) && logits.dim(2) == v.dim(2) && logits.dim(3) == mu.dim(2) &&
      IsPerHead(beta, v.dim(1)) &&
      mu.dim(2) > 0;
  if (!fused) return ReferenceEm(v, logits, mu, beta);
  const EmGeometry geo{v.dim(0), v.dim(1), v.dim(2), mu.dim(2), v.dim(3)};
  const VarList inputs = {v, logits, mu, beta};
  const bool recording = WouldRecord(inputs);
  auto weights = std::make_shared<Tensor>();
  if (recording) *weights = Tensor(logits.shape(), v.dtype());
  Tensor out(v.shape(), v.dtype());
  DispatchDType(v.dtype(), [&](auto zero) {
    using T = decltype(zero);
    EmForwardKernel<T>(geo, v.value(), logits.value(), mu.value(), beta.value(), out.data<T>(),
                       recording ? weights->data<T>() : nullptr);
  });
  return RecordOp("em_update", out, inputs,
                  [geo, weights](const VarList& in, const Var& self, const Var& g) {
                    if (GradModeEnabled()) {
                      return ComposedVjp(
                          [](const VarList& s) { return ReferenceEm(s[0], s[1], s[2], s[3]); },
                          in, g);
                    }
                    std::vector<bool> wanted;
                    for (size_t i = 0; i < in.size(); ++i) wanted.push_back(WantsInputGrad(in, i));
                    const DType dtype = in[0].dtype();
                    Tensor dv, dlogits, dmu, beta_parts;
                    if (wanted[0]) dv = Tensor(in[0].shape(), dtype);
                    if (wanted[1]) dlogits = Tensor(in[1].shape(), dtype);
                    if (wanted[2]) dmu = Tensor(in[2].shape(), dtype);
                    if (wanted[3]) beta_parts = Tensor(Shape{geo.Units()}, dtype);
                    const Tensor grad_out = g.value();
                    VarList grads(in.size());
                    DispatchDType(dtype, [&](auto zero) {
                      using T = decltype(zero);
                      auto ptr = [](Tensor& t) { return t.defined() ? t.data<T>() : nullptr; };
                      EmBackwardKernel<T>(geo, in[0].value(), in[2].value(), in[3].value(),
                                          weights->data<T>(), self.value().data<T>(),
                                          grad_out.data<T>(), ptr(dv), ptr(dlogits), ptr(dmu),
                                          ptr(beta_parts));
                      if (wanted[3]) grads[3] = SumPartsByHead<T>(beta_parts, in[3], geo.heads);
                    });
                    if (wanted[0]) grads[0] = constant(dv);
                    if (wanted[1]) grads[1] = constant(dlogits);
                    if (wanted[2]) grads[2] = constant(dmu);
                    return grads;
                  });
}

Var em_query_logits(const Var& q, const Var& xi, const Var& alpha) {
  SP_CHECK(q.defined() && xi.defined() && alpha.defined(),
           "em_query_logits: an input is undefined");
  const bool fused =
      q.rank() == 4 && xi.rank() == 4 && q.dtype() == xi.dtype() && q.dtype() == alpha.dtype() &&
      xi.dim(0) == q.dim(0) && xi.dim(1) == q.dim(1) && xi.dim(3) == q.dim(3) &&
      IsPerHead(alpha, q.dim(1));
  if (!fused) return ReferenceLogits(q, xi, alpha);
  const LogitsGeometry geo{q.dim(0), q.dim(1), q.dim(2), xi.dim(2), q.dim(3)};
  Tensor out(Shape{geo.batch, geo.heads, geo.queries, geo.keys}, q.dtype());
  DispatchDType(q.dtype(), [&](auto zero) {
    using T = decltype(zero);
    LogitsForwardKernel<T>(geo, q.value(), xi.value(), alpha.value(), out.data<T>());
  });
  return RecordOp(
      "em_query_logits", out, {q, xi, alpha},
      [geo](const VarList& in, const Var& self, const Var& g) {
        if (GradModeEnabled()) {
          return ComposedVjp([](const VarList& s) { return ReferenceLogits(s[0], s[1], s[2]); },
                             in, g);
        }
        std::vector<bool> wanted;
        for (size_t i = 0; i < in.size(); ++i) wanted.push_back(WantsInputGrad(in, i));
        const DType dtype = in[0].dtype();
        Tensor dq, dxi, alpha_parts;
        if (wanted[0]) dq = Tensor(in[0].shape(), dtype);
        if (wanted[1]) dxi = Tensor(in[1].shape(), dtype);
        if (wanted[2]) alpha_parts = Tensor(Shape{geo.Units()}, dtype);
        const Tensor grad_out = g.value();
        VarList grads(in.size());
        DispatchDType(dtype, [&](auto zero) {
          using T = decltype(zero);
          auto ptr = [](Tensor& t) { return t.defined() ? t.data<T>() : nullptr; };
          LogitsBackwardKernel<T>(geo, in[0].value(), in[1].value(), in[2].value(),
                                  grad_out.data<T>(), ptr(dq), ptr(dxi), ptr(alpha_parts));
          if (wanted[2]) grads[2] = SumPartsByHead<T>(alpha_parts, in[2], geo.heads);
        });
        if (wanted[0]) grads[0] = constant(dq);
        if (wanted[1]) grads[1] = constant(dxi);
        return grads;
      });
}

}  // namespace stillpoint
