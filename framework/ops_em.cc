// The fused EM update of probabilistic attention (see em_update.h).
//
// Forward, per (b, h): S = beta v mu^T (one GEMM), S += logits, row
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

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "framework/em_update.h"
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

template <typename T>
T BetaOf(const Tensor& beta, int64_t head) {
  return beta.numel() == 1 ? beta.data<T>()[0] : beta.data<T>()[head];
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
      const T b = BetaOf<T>(beta, unit % g.heads);
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
      const T b = BetaOf<T>(beta, unit % g.heads);
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

}  // namespace

Var em_update(const Var& v, const Var& logits, const Var& mu, const Var& beta) {
  SP_CHECK(v.defined() && logits.defined() && mu.defined() && beta.defined(),
           "em_update: an input is undefined");
  const bool fused =
      v.rank() == 4 && logits.rank() == 4 && mu.rank() == 4 && v.dtype() == logits.dtype() &&
      v.dtype() == mu.dtype() && v.dtype() == beta.dtype() && mu.dim(0) == v.dim(0) &&
      mu.dim(1) == v.dim(1) && mu.dim(3) == v.dim(3) && logits.dim(0) == v.dim(0) &&
      logits.dim(1) == v.dim(1) && logits.dim(2) == v.dim(2) && logits.dim(3) == mu.dim(2) &&
      (beta.numel() == 1 || (beta.rank() == 4 && beta.dim(0) == 1 && beta.dim(1) == v.dim(1) &&
                             beta.dim(2) == 1 && beta.dim(3) == 1)) &&
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
                    std::vector<bool> wanted;
                    for (size_t i = 0; i < in.size(); ++i) wanted.push_back(WantsInputGrad(in, i));
                    if (GradModeEnabled()) {
                      // create_graph: one node per slot, as the fused attention does.
                      VarList slots;
                      for (const Var& input : in) slots.push_back(mul_scalar(input, 1.0));
                      VarList grads = grad({ReferenceEm(slots[0], slots[1], slots[2], slots[3])},
                                           slots, {g}, {.create_graph = true});
                      for (size_t i = 0; i < in.size(); ++i) {
                        if (!wanted[i]) grads[i] = Var();
                      }
                      return grads;
                    }
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
                      if (wanted[3]) {
                        // Sum over the batch, head by head, in batch order.
                        Tensor dbeta = Tensor::Zeros(in[3].shape(), dtype);
                        T* db = dbeta.data<T>();
                        const T* parts = beta_parts.data<T>();
                        for (int64_t unit = 0; unit < geo.Units(); ++unit) {
                          db[in[3].numel() == 1 ? 0 : unit % geo.heads] += parts[unit];
                        }
                        grads[3] = constant(dbeta);
                      }
                    });
                    if (wanted[0]) grads[0] = constant(dv);
                    if (wanted[1]) grads[1] = constant(dlogits);
                    if (wanted[2]) grads[2] = constant(dmu);
                    return grads;
                  });
}

}  // namespace stillpoint
