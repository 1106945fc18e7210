// Multi-head self-attention over listed keys (see ops_neighbour_attention.h):
// each query sees only its own few keys (a local window on a grid), so the
// scores are [B, T, heads, per_query] instead of [B, heads, T, T].
//
// The forward pass works row by row (one task per token of one batch entry,
// writing only that token's output and probabilities). The backward pass
// scatters into the keys' and values' gradients (a key is the neighbour of
// several queries), so one task handles one batch entry and goes through
// its queries in order: every entry is written by one task, in a fixed
// order, and results do not depend on the thread count. Sums run in the
// inputs' dtype, as the dense products do. With create_graph the VJP differentiates the same
// attention written with gather, mul, sum and softmax.

#include "framework/ops_neighbour_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "framework/ops.h"
#include "framework/parallel.h"

namespace stillpoint {
namespace {

struct NeighbourGeometry {
  int64_t batch = 0;
  int64_t tokens = 0;
  int64_t heads = 0;
  int64_t dh = 0;
  int64_t dim = 0;
  int64_t per_query = 0;
  int64_t bias_heads = 0;  // 0: no bias
  double scale = 1.0;
};

NeighbourGeometry Check(const char* op,
                        const Var& q,
                        const Var& k,
                        const Var& v,
                        int64_t heads,
                        double scale,
                        const AttentionNeighbours& neighbours) {
  SP_CHECK(q.defined() && k.defined() && v.defined(), op, ": an input is undefined");
  SP_CHECK(q.rank() == 3 && k.shape() == q.shape() && v.shape() == q.shape(), op, ": q ", q.shape(),
           ", k ", k.shape(), " and v ", v.shape(), " must be one shape [B, T, D]");
  SP_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(), op, ": q, k and v must share a dtype");
  SP_CHECK(heads > 0 && q.dim(2) % heads == 0, op, ": width ", q.dim(2),
           " is not a positive multiple of heads ", heads);
  SP_CHECK(scale > 0.0 && std::isfinite(scale), op, ": scale must be > 0, got ", scale);
  NeighbourGeometry geo;
  geo.batch = q.dim(0);
  geo.tokens = q.dim(1);
  geo.heads = heads;
  geo.dim = q.dim(2);
  geo.dh = geo.dim / heads;
  geo.per_query = neighbours.per_query;
  geo.scale = scale;
  SP_CHECK(geo.per_query >= 1, op, ": per_query must be >= 1, got ", geo.per_query);
  SP_CHECK(static_cast<int64_t>(neighbours.keys.size()) == geo.tokens * geo.per_query, op, ": ",
           neighbours.keys.size(), " keys for ", geo.tokens, " tokens x ", geo.per_query,
           " per query");
  for (int64_t i = 0; i < geo.tokens; ++i) {
    bool any = false;
    for (int64_t n = 0; n < geo.per_query; ++n) {
      const int64_t j = neighbours.keys[i * geo.per_query + n];
      SP_CHECK(j >= -1 && j < geo.tokens, op, ": key ", j, " of query ", i, " is outside [-1, ",
               geo.tokens, ")");
      any = any || j >= 0;
    }
    SP_CHECK(any, op, ": query ", i, " sees no key");
  }
  if (neighbours.bias.defined()) {
    const Shape& s = neighbours.bias.shape();
    SP_CHECK(s.rank() == 3 && (s[0] == 1 || s[0] == heads) && s[1] == geo.tokens &&
                 s[2] == geo.per_query,
             op, ": bias ", s, " must be [1 or ", heads, ", ", geo.tokens, ", ", geo.per_query,
             "]");
    geo.bias_heads = s[0];
  }
  return geo;
}

// out [B, T, D] and, when probs is not null, the probabilities
// [B, T, heads, per_query] (0 at unused slots).
template <typename T>
void ForwardKernel(const NeighbourGeometry& geo,
                   const int64_t* keys,
                   const double* bias,
                   const T* q,
                   const T* k,
                   const T* v,
                   T* out,
                   T* probs) {
  const int64_t rows = geo.batch * geo.tokens;
  ParallelFor(0, rows, 8, [&](int64_t begin, int64_t end) {
    std::vector<T> p(geo.per_query), acc(geo.dh);
    const T scale = static_cast<T>(geo.scale);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / geo.tokens, i = row % geo.tokens;
      const int64_t* row_keys = keys + i * geo.per_query;
      for (int64_t h = 0; h < geo.heads; ++h) {
        const T* qi = q + row * geo.dim + h * geo.dh;
        T top = -std::numeric_limits<T>::infinity();
        for (int64_t n = 0; n < geo.per_query; ++n) {
          const int64_t j = row_keys[n];
          if (j < 0) continue;
          const T* kj = k + (b * geo.tokens + j) * geo.dim + h * geo.dh;
          T dot = 0;
          for (int64_t c = 0; c < geo.dh; ++c) dot += qi[c] * kj[c];
          T s = scale * dot;
          if (bias != nullptr) {
            const int64_t bh = geo.bias_heads == 1 ? 0 : h;
            s += static_cast<T>(bias[(bh * geo.tokens + i) * geo.per_query + n]);
          }
          p[n] = s;
          top = std::max(top, s);
        }
        T total = 0;
        for (int64_t n = 0; n < geo.per_query; ++n) {
          p[n] = row_keys[n] < 0 ? T(0) : std::exp(p[n] - top);
          total += p[n];
        }
        std::fill(acc.begin(), acc.end(), T(0));
        const T inverse = T(1) / total;
        for (int64_t n = 0; n < geo.per_query; ++n) {
          p[n] *= inverse;
          const int64_t j = row_keys[n];
          if (j < 0) continue;
          const T* vj = v + (b * geo.tokens + j) * geo.dim + h * geo.dh;
          for (int64_t c = 0; c < geo.dh; ++c) acc[c] += p[n] * vj[c];
        }
        T* oi = out + row * geo.dim + h * geo.dh;
        std::copy(acc.begin(), acc.end(), oi);
        if (probs != nullptr)
          std::copy(p.begin(), p.end(), probs + (row * geo.heads + h) * geo.per_query);
      }
    }
  });
}

// The gradients dq, dk, dv (each null when not wanted; dk and dv zeroed by
// the caller) from the output gradient g and the kept probabilities.
template <typename T>
void BackwardKernel(const NeighbourGeometry& geo,
                    const int64_t* keys,
                    const T* q,
                    const T* k,
                    const T* v,
                    const T* probs,
                    const T* g,
                    T* dq,
                    T* dk,
                    T* dv) {
  ParallelFor(0, geo.batch, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> ds(geo.per_query), acc(geo.dh);
    const T scale = static_cast<T>(geo.scale);
    for (int64_t b = begin; b < end; ++b) {
      for (int64_t i = 0; i < geo.tokens; ++i) {
        const int64_t row = b * geo.tokens + i;
        const int64_t* row_keys = keys + i * geo.per_query;
        for (int64_t h = 0; h < geo.heads; ++h) {
          const int64_t offset = row * geo.dim + h * geo.dh;
          const T* p = probs + (row * geo.heads + h) * geo.per_query;
          const T* gi = g + offset;
          // dp_n = g . v_j; ds_n = p_n (dp_n - sum_m p_m dp_m).
          T mean = 0;
          for (int64_t n = 0; n < geo.per_query; ++n) {
            const int64_t j = row_keys[n];
            ds[n] = 0;
            if (j < 0) continue;
            const T* vj = v + (b * geo.tokens + j) * geo.dim + h * geo.dh;
            T dp = 0;
            for (int64_t c = 0; c < geo.dh; ++c) dp += gi[c] * vj[c];
            ds[n] = dp;
            mean += p[n] * dp;
          }
          std::fill(acc.begin(), acc.end(), T(0));
          for (int64_t n = 0; n < geo.per_query; ++n) {
            const int64_t j = row_keys[n];
            if (j < 0) continue;
            const T score_grad = p[n] * (ds[n] - mean) * scale;
            const T weight = p[n];
            const int64_t key_offset = (b * geo.tokens + j) * geo.dim + h * geo.dh;
            if (dq != nullptr) {
              for (int64_t c = 0; c < geo.dh; ++c) acc[c] += score_grad * k[key_offset + c];
            }
            if (dk != nullptr) {
              for (int64_t c = 0; c < geo.dh; ++c) {
                dk[key_offset + c] += score_grad * q[offset + c];
              }
            }
            if (dv != nullptr) {
              for (int64_t c = 0; c < geo.dh; ++c) {
                dv[key_offset + c] += weight * gi[c];
              }
            }
          }
          if (dq != nullptr) {
            std::copy(acc.begin(), acc.end(), dq + offset);
          }
        }
      }
    }
  });
}

}  // namespace

Var neighbour_attention_reference(const Var& q,
                                  const Var& k,
                                  const Var& v,
                                  int64_t heads,
                                  double scale,
                                  const AttentionNeighbours& neighbours) {
  const NeighbourGeometry geo =
      Check("neighbour_attention_reference", q, k, v, heads, scale, neighbours);
  const int64_t rows = geo.batch * geo.tokens, slots = geo.per_query;
  // Unused slots read the query's own key and are hidden by -inf.
  std::vector<int64_t> index(neighbours.keys);
  const int64_t bias_heads = std::max<int64_t>(geo.bias_heads, 1);
  std::vector<double> addend(geo.tokens * bias_heads * slots, 0.0);
  const std::vector<double> bias =
      neighbours.bias.defined() ? neighbours.bias.ToVector() : std::vector<double>();
  for (int64_t i = 0; i < geo.tokens; ++i) {
    for (int64_t n = 0; n < slots; ++n) {
      const bool unused = index[i * slots + n] < 0;
      if (unused) index[i * slots + n] = i;
      for (int64_t h = 0; h < bias_heads; ++h) {
        double& a = addend[(i * bias_heads + h) * slots + n];
        if (unused) {
          a = -std::numeric_limits<double>::infinity();
        } else if (!bias.empty()) {
          a = bias[(h * geo.tokens + i) * slots + n];
        }
      }
    }
  }
  // [B, T, D] -> the listed rows [B * T, heads, slots, dh].
  const auto listed = [&](const Var& x) {
    return permute(reshape(gather(x, 1, index), Shape{rows, slots, geo.heads, geo.dh}),
                   {0, 2, 1, 3});
  };
  const Var queries = reshape(q, Shape{rows, geo.heads, 1, geo.dh});
  Var scores = mul_scalar(sum(mul(queries, listed(k)), 3), scale);  // [B * T, heads, slots]
  scores =
      add(reshape(scores, Shape{geo.batch, geo.tokens, geo.heads, slots}),
          constant(Tensor::FromVector(Shape{geo.tokens, bias_heads, slots}, addend, q.dtype())));
  const Var weights = reshape(softmax(scores), Shape{rows, geo.heads, slots, 1});
  return reshape(sum(mul(weights, listed(v)), 2), Shape{geo.batch, geo.tokens, geo.dim});
}

Var neighbour_attention(const Var& q,
                        const Var& k,
                        const Var& v,
                        int64_t heads,
                        double scale,
                        const AttentionNeighbours& neighbours) {
  const NeighbourGeometry geo = Check("neighbour_attention", q, k, v, heads, scale, neighbours);
  const DType dtype = q.dtype();
  const bool recording = WouldRecord({q, k, v});
  auto keys = std::make_shared<const std::vector<int64_t>>(neighbours.keys);
  std::vector<double> bias;
  if (neighbours.bias.defined()) bias = neighbours.bias.ToVector();
  Tensor probs;
  if (recording) probs = Tensor(Shape{geo.batch, geo.tokens, geo.heads, geo.per_query}, dtype);
  Tensor out(q.shape(), dtype);
  DispatchDType(dtype, [&](auto zero) {
    using T = decltype(zero);
    ForwardKernel<T>(geo, keys->data(), bias.empty() ? nullptr : bias.data(), q.value().data<T>(),
                     k.value().data<T>(), v.value().data<T>(), out.data<T>(),
                     recording ? probs.data<T>() : nullptr);
  });
  return RecordOp(
      "neighbour_attention", out, {q, k, v},
      [geo, keys, probs, neighbours](const VarList& in, const Var&, const Var& g) {
        std::vector<bool> wanted;
        for (size_t i = 0; i < in.size(); ++i) wanted.push_back(WantsInputGrad(in, i));
        if (GradModeEnabled()) {
          // create_graph: differentiate the differentiable form, with
          // respect to one node per slot (a product by 1, exact), so an input
          // passed in two slots gets each slot's share.
          VarList slots;
          for (const Var& input : in) slots.push_back(mul_scalar(input, 1.0));
          VarList grads = grad({neighbour_attention_reference(slots[0], slots[1], slots[2],
                                                              geo.heads, geo.scale, neighbours)},
                               slots, {g}, {.create_graph = true});
          for (size_t i = 0; i < in.size(); ++i) {
            if (!wanted[i]) grads[i] = Var();
          }
          return grads;
        }
        const DType dtype = in[0].dtype();
        VarList grads(3);
        Tensor dq, dk, dv;
        if (wanted[0]) dq = Tensor(in[0].shape(), dtype);
        if (wanted[1]) dk = Tensor::Zeros(in[1].shape(), dtype);
        if (wanted[2]) dv = Tensor::Zeros(in[2].shape(), dtype);
        DispatchDType(dtype, [&](auto zero) {
          using T = decltype(zero);
          BackwardKernel<T>(geo, keys->data(), in[0].value().data<T>(), in[1].value().data<T>(),
                            in[2].value().data<T>(), probs.data<T>(), g.value().data<T>(),
                            wanted[0] ? dq.data<T>() : nullptr, wanted[1] ? dk.data<T>() : nullptr,
                            wanted[2] ? dv.data<T>() : nullptr);
        });
        if (wanted[0]) grads[0] = Var(dq);
        if (wanted[1]) grads[1] = Var(dk);
        if (wanted[2]) grads[2] = Var(dv);
        return grads;
      });
}

}  // namespace stillpoint
