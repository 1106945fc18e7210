// Fused row kernels over the last axis: logsumexp, softmax, log_softmax,
// layer_norm, layer_norm_of_sum and cross_entropy.
//
// Every kernel treats its input as [rows, n] and runs ParallelFor over rows;
// a row is always reduced by one task in index order, so results do not
// depend on the thread count. Reductions across rows (layer_norm's gain and
// bias gradients, cross_entropy's mean) add fixed blocks of rows in a fixed
// order for the same reason.
//
// Each VJP has two forms. When GradModeEnabled() is false (a backward
// without create_graph) it runs a fused tensor-only kernel; when it is true
// it is written with differentiable ops so the gradient can be
// differentiated again.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "framework/kernels/layer_norm_rows.h"
#include "framework/ops.h"
#include "framework/parallel_loops.h"
#include "framework/kernels/vector_math.h"

namespace stillpoint {
namespace {

// Rows per block of the deterministic cross-row reductions.
constexpr int64_t kRowsPerBlock = 32;

// x seen as [rows, n] with n the last extent.
struct RowLayout {
  int64_t rows = 1;
  int64_t n = 1;
};

RowLayout Rows(const Var& x, const char* op) {
  SP_CHECK(x.defined(), op, ": input is undefined");
  SP_CHECK(x.rank() >= 1, op, ": needs rank >= 1 (works over the last axis), got ", x.shape());
  RowLayout layout;
  layout.n = x.shape()[-1];
  for (int i = 0; i + 1 < x.rank(); ++i) layout.rows *= x.shape()[i];
  return layout;
}

// x's shape with the last extent set to 1 (keepdim = true), or dropped.
Shape ReducedShape(const Shape& shape, bool keepdim) {
  std::vector<int64_t> dims = shape.dims();
  if (keepdim) {
    dims.back() = 1;
  } else {
    dims.pop_back();
  }
  return Shape(dims);
}

template <typename T>
T RowMax(const T* x, int64_t n) {
  return internal::VecMax(x, n);
}

// sum(exp(x - m)) over a row, in index order, through a stack buffer (the
// vectorised exp writes its results somewhere).
template <typename T>
T RowExpSum(const T* x, T m, int64_t n) {
  constexpr int64_t kChunk = 256;
  T buffer[kChunk];
  T s = 0;
  for (int64_t i = 0; i < n; i += kChunk) {
    s += internal::VecExpShifted(x + i, m, buffer, std::min(kChunk, n - i));
  }
  return s;
}

// log(sum(exp(x))) shifted by the row maximum. A row that is all -inf gives
// -inf (log 0); a +inf entry gives +inf; NaN propagates.
template <typename T>
T RowLogSumExp(const T* x, int64_t n) {
  const T m = RowMax(x, n);
  if (!std::isfinite(m)) return m;
  return m + std::log(RowExpSum(x, m, n));
}

void CheckSameDType(const Var& x, const Var& other, const char* op, const char* name) {
  SP_CHECK(other.dtype() == x.dtype(), op, ": ", name, " ", other.shape(), " is ",
           ToString(other.dtype()), " but x ", x.shape(), " is ", ToString(x.dtype()));
}

// ------------------------------------------------------------ fused kernels

// out[r] = logsumexp of row r.
Tensor LogSumExpValue(const Tensor& x, const RowLayout& rl, const Shape& out_shape) {
  Tensor out(out_shape, x.dtype());
  DispatchDType(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* in = x.data<T>();
    T* dst = out.data<T>();
    ParallelFor(0, rl.rows, MinChunk(rl.n), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) dst[r] = RowLogSumExp(in + r * rl.n, rl.n);
    });
  });
  return out;
}

Tensor SoftmaxValue(const Tensor& x, const RowLayout& rl, bool log_space) {
  Tensor out(x.shape(), x.dtype());
  DispatchDType(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* in = x.data<T>();
    T* dst = out.data<T>();
    ParallelFor(0, rl.rows, MinChunk(rl.n), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T* row = in + r * rl.n;
        T* y = dst + r * rl.n;
        const T m = RowMax(row, rl.n);
        const T s = internal::VecExpShifted(row, m, y, rl.n);
        if (log_space) {
          const T log_s = std::log(s);
          for (int64_t i = 0; i < rl.n; ++i) y[i] = (row[i] - m) - log_s;
        } else {
          for (int64_t i = 0; i < rl.n; ++i) y[i] /= s;
        }
      }
    });
  });
  return out;
}

// dx = g[r] * exp(x - lse[r]).
Tensor LogSumExpBackward(const Tensor& x, const Tensor& lse, const Tensor& g, const RowLayout& rl) {
  Tensor dx(x.shape(), x.dtype());
  DispatchDType(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* in = x.data<T>();
    const T* l = lse.data<T>();
    const T* gr = g.data<T>();
    T* dst = dx.data<T>();
    ParallelFor(0, rl.rows, MinChunk(rl.n), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        T* d = dst + r * rl.n;
        internal::VecExpShifted(in + r * rl.n, l[r], d, rl.n);
        for (int64_t i = 0; i < rl.n; ++i) d[i] *= gr[r];
      }
    });
  });
  return dx;
}

// softmax: dx = y (g - <g, y>); log_softmax: dx = g - exp(y) sum(g).
Tensor SoftmaxBackward(const Tensor& y, const Tensor& g, const RowLayout& rl, bool log_space) {
  Tensor dx(y.shape(), y.dtype());
  DispatchDType(y.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* yv = y.data<T>();
    const T* gv = g.data<T>();
    T* dst = dx.data<T>();
    ParallelFor(0, rl.rows, MinChunk(rl.n), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T* yr = yv + r * rl.n;
        const T* gr = gv + r * rl.n;
        T* d = dst + r * rl.n;
        T acc = 0;
        if (log_space) {
          for (int64_t i = 0; i < rl.n; ++i) acc += gr[i];
          internal::VecExp(yr, d, rl.n);
          for (int64_t i = 0; i < rl.n; ++i) d[i] = gr[i] - d[i] * acc;
        } else {
          for (int64_t i = 0; i < rl.n; ++i) acc += gr[i] * yr[i];
          for (int64_t i = 0; i < rl.n; ++i) d[i] = yr[i] * (gr[i] - acc);
        }
      }
    });
  });
  return dx;
}

}  // namespace

// ------------------------------------------------------------ softmax family

Var logsumexp(const Var& x, bool keepdim) {
  const RowLayout rl = Rows(x, "logsumexp");
  const Shape keep_shape = ReducedShape(x.shape(), true);
  Tensor out = LogSumExpValue(x.value(), rl, ReducedShape(x.shape(), keepdim));
  return RecordOp(
      "logsumexp", out, {x}, [rl, keep_shape](const VarList& in, const Var& self, const Var& g) {
        if (!GradModeEnabled()) {
          return VarList{Var(LogSumExpBackward(in[0].value(), self.value(), g.value(), rl))};
        }
        return VarList{mul(reshape(g, keep_shape), softmax(in[0]))};
      });
}

Var softmax(const Var& x) {
  const RowLayout rl = Rows(x, "softmax");
  Tensor out = SoftmaxValue(x.value(), rl, /*log_space=*/false);
  return RecordOp("softmax", out, {x}, [rl](const VarList&, const Var& self, const Var& g) {
    if (!GradModeEnabled()) {
      return VarList{Var(SoftmaxBackward(self.value(), g.value(), rl, false))};
    }
    // y (g - <g, y>), with y the (differentiable) output.
    return VarList{mul(self, sub(g, sum(mul(g, self), -1, true)))};
  });
}

Var log_softmax(const Var& x) {
  const RowLayout rl = Rows(x, "log_softmax");
  Tensor out = SoftmaxValue(x.value(), rl, /*log_space=*/true);
  return RecordOp("log_softmax", out, {x}, [rl](const VarList&, const Var& self, const Var& g) {
    if (!GradModeEnabled()) {
      return VarList{Var(SoftmaxBackward(self.value(), g.value(), rl, true))};
    }
    // g - softmax(x) sum(g), with softmax(x) = exp(y).
    return VarList{sub(g, mul(exp(self), sum(g, -1, true)))};
  });
}

// --------------------------------------------------------------- layer_norm

namespace {

struct LayerNormGrads {
  Tensor dx, dgain, dbias;
};

// One row: mean and rstd of row, then y = (row - mean) rstd gain + bias.
// yr may equal row (normalising in place reads each entry before writing it).
template <typename T>
void NormalizeRow(
    const T* row, const T* gv, const T* bv, T eps, int64_t n, T* yr, T* mean_out, T* rstd_out) {
  const T inv_n = T(1) / static_cast<T>(n);
  const T mean = internal::VecSum(row, n) * inv_n;
  const T var = internal::VecSumSquaredDeviation(row, mean, n) * inv_n;
  const T rstd = T(1) / std::sqrt(var + eps);
  // One loop per case, so each vectorises without a branch inside.
  if (gv && bv) {
    for (int64_t i = 0; i < n; ++i) yr[i] = (row[i] - mean) * rstd * gv[i] + bv[i];
  } else if (gv) {
    for (int64_t i = 0; i < n; ++i) yr[i] = (row[i] - mean) * rstd * gv[i];
  } else if (bv) {
    for (int64_t i = 0; i < n; ++i) yr[i] = (row[i] - mean) * rstd + bv[i];
  } else {
    for (int64_t i = 0; i < n; ++i) yr[i] = (row[i] - mean) * rstd;
  }
  *mean_out = mean;
  *rstd_out = rstd;
}

// sum[i] = ((parts[0][i] + parts[1][i]) + parts[2][i]) + ... over one row
// (at least two parts): the order, and so the values, of chained add().
template <typename T>
void SumPartsRow(const std::vector<const T*>& parts, int64_t offset, int64_t n, T* sum) {
  const T* p0 = parts[0] + offset;
  const T* p1 = parts[1] + offset;
  for (int64_t i = 0; i < n; ++i) sum[i] = p0[i] + p1[i];
  for (std::size_t k = 2; k < parts.size(); ++k) {
    const T* pk = parts[k] + offset;
    for (int64_t i = 0; i < n; ++i) sum[i] += pk[i];
  }
}

// Layer norm of the sum of `parts` (all [rows, n]; one part is plain
// layer_norm). Each row's sum is formed in sum_out when it is given (the
// backward needs it) and otherwise in the output row, which is then
// normalised in place: one pass over the parts, no separate sum tensor.
// stats holds (mean, rstd) per row.
template <typename T>
void LayerNormForwardKernel(const std::vector<const T*>& parts,
                            const T* gv,
                            const T* bv,
                            double eps,
                            const RowLayout& rl,
                            T* y,
                            T* sum_out,
                            T* stats) {
  const int64_t n = rl.n;
  const T eps_t = static_cast<T>(eps);
  if constexpr (std::is_same_v<T, float>) {
    // Rows of whole packets: in registers (layer_norm_rows.h), same values.
    const bool in_registers = internal::WithRowPackets(n, [&](auto packets) {
      constexpr int kPackets = decltype(packets)::value;
      ParallelFor(0, rl.rows, MinChunk(n), [&](int64_t begin, int64_t end) {
        internal::NormalizeRowsInRegisters<kPackets>(parts, begin, end, gv, bv, eps_t, y, sum_out,
                                                     stats);
      });
    });
    if (in_registers) return;
  }
  ParallelFor(0, rl.rows, MinChunk(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      T* yr = y + r * n;
      const T* row = parts[0] + r * n;
      if (parts.size() > 1) {
        T* sum_row = sum_out ? sum_out + r * n : yr;
        SumPartsRow(parts, r * n, n, sum_row);
        row = sum_row;
      }
      NormalizeRow(row, gv, bv, eps_t, n, yr, &stats[2 * r], &stats[2 * r + 1]);
    }
  });
}

// The fused backward: dx from the saved row statistics, and the gain/bias
// gradients summed over fixed blocks of rows, then over blocks in order.
template <typename T>
LayerNormGrads LayerNormBackwardKernel(const Tensor& x,
                                       const Tensor* gain,
                                       bool want_gain,
                                       bool want_bias,
                                       const Tensor& stats,
                                       const Tensor& g,
                                       const RowLayout& rl) {
  const int64_t n = rl.n;
  const int64_t blocks = (rl.rows + kRowsPerBlock - 1) / kRowsPerBlock;
  std::vector<T> gain_partial(want_gain ? blocks * n : 0, T(0));
  std::vector<T> bias_partial(want_bias ? blocks * n : 0, T(0));
  LayerNormGrads grads;
  grads.dx = Tensor(x.shape(), x.dtype());
  const T* in = x.data<T>();
  const T* gv = gain ? gain->data<T>() : nullptr;
  const T* st = stats.data<T>();
  const T* go = g.data<T>();
  T* dx = grads.dx.data<T>();
  const T inv_n = T(1) / static_cast<T>(n);
  ParallelFor(0, blocks, MinChunk(kRowsPerBlock * n), [&](int64_t block_begin, int64_t block_end) {
    // xhat (and dxhat = g gain, with a gain) of the current row, so the two row sums are
    // vectorised reductions over plain arrays.
    std::vector<T> xhat(n), dxhat(n);
    for (int64_t b = block_begin; b < block_end; ++b) {
      const int64_t row_end = std::min(rl.rows, (b + 1) * kRowsPerBlock);
      if constexpr (std::is_same_v<T, float>) {
        // Rows of whole packets: in registers (layer_norm_rows.h), same values.
        const bool in_registers = internal::WithRowPackets(n, [&](auto packets) {
          internal::LayerNormBackwardRowsInRegisters<decltype(packets)::value>(
              b * kRowsPerBlock, row_end, in, go, st, gv, dx,
              want_gain ? gain_partial.data() + b * n : nullptr,
              want_bias ? bias_partial.data() + b * n : nullptr);
        });
        if (in_registers) continue;
      }
      for (int64_t r = b * kRowsPerBlock; r < row_end; ++r) {
        const T* row = in + r * n;
        const T* gr = go + r * n;
        T* dr = dx + r * n;
        const T mean = st[2 * r];
        const T rstd = st[2 * r + 1];
        // dxhat = g * gain; dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)).
        for (int64_t i = 0; i < n; ++i) xhat[i] = (row[i] - mean) * rstd;
        // Without a gain, dxhat is the row of g itself.
        const T* dxh = gr;
        if (gv) {
          for (int64_t i = 0; i < n; ++i) dxhat[i] = gr[i] * gv[i];
          dxh = dxhat.data();
        }
        const T mean_d = internal::VecSum(dxh, n) * inv_n;
        const T mean_dx = internal::VecDot(dxh, xhat.data(), n) * inv_n;
        for (int64_t i = 0; i < n; ++i) dr[i] = rstd * (dxh[i] - mean_d - xhat[i] * mean_dx);
        if (want_gain) {
          T* gp = gain_partial.data() + b * n;
          for (int64_t i = 0; i < n; ++i) gp[i] += gr[i] * xhat[i];
        }
        if (want_bias) {
          T* bp = bias_partial.data() + b * n;
          for (int64_t i = 0; i < n; ++i) bp[i] += gr[i];
        }
      }
    }
  });
  auto reduce = [&](const std::vector<T>& partial) {
    Tensor total = Tensor::Zeros(Shape{n}, x.dtype());
    T* t = total.data<T>();
    for (int64_t b = 0; b < blocks; ++b) {
      for (int64_t i = 0; i < n; ++i) t[i] += partial[b * n + i];
    }
    return total;
  };
  if (want_gain) grads.dgain = reduce(gain_partial);
  if (want_bias) grads.dbias = reduce(bias_partial);
  return grads;
}

// The fused backward as Vars (constants), for a VJP without create_graph.
VarList FusedLayerNormGrads(const Tensor& x,
                            const Var& gain,
                            bool want_gain,
                            bool want_bias,
                            const Tensor& stats,
                            const Var& g,
                            const RowLayout& rl) {
  LayerNormGrads grads = DispatchDType(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const Tensor gain_value = gain.defined() ? gain.value() : Tensor();
    return LayerNormBackwardKernel<T>(x, gain.defined() ? &gain_value : nullptr, want_gain,
                                      want_bias, stats, g.value(), rl);
  });
  return VarList{Var(grads.dx), grads.dgain.defined() ? Var(grads.dgain) : Var(),
                 grads.dbias.defined() ? Var(grads.dbias) : Var()};
}

// The same gradients {dx, dgain, dbias} written with differentiable ops (for
// create_graph), recomputing the statistics from x so they carry their
// dependence on x.
VarList RecordedLayerNormGrads(
    const Var& x, const Var& gain, bool want_gain, bool want_bias, double eps, const Var& g) {
  const Shape param_shape{x.shape()[-1]};
  const Var centered = sub(x, mean(x, -1, true));
  const Var rstd = rsqrt(add_scalar(mean(square(centered), -1, true), eps));
  const Var xhat = mul(centered, rstd);
  const Var dxhat = gain.defined() ? mul(g, gain) : g;
  const Var dx = mul(
      rstd, sub(sub(dxhat, mean(dxhat, -1, true)), mul(xhat, mean(mul(dxhat, xhat), -1, true))));
  Var dgain, dbias;
  if (want_gain) dgain = sum_to(mul(g, xhat), param_shape);
  if (want_bias) dbias = sum_to(g, param_shape);
  return VarList{dx, dgain, dbias};
}

// Checks gain, bias and eps against x (the normalised input, or the first
// part), naming `op`.
void CheckLayerNormArguments(const Var& x,
                             const RowLayout& rl,
                             const Var& gain,
                             const Var& bias,
                             double eps,
                             const char* op) {
  const Shape param_shape{rl.n};
  if (gain.defined()) {
    SP_CHECK(gain.shape() == param_shape, op, ": gain ", gain.shape(),
             " must be [D] = ", param_shape, " for x ", x.shape());
    CheckSameDType(x, gain, op, "gain");
  }
  if (bias.defined()) {
    SP_CHECK(bias.shape() == param_shape, op, ": bias ", bias.shape(),
             " must be [D] = ", param_shape, " for x ", x.shape());
    CheckSameDType(x, bias, op, "bias");
  }
  SP_CHECK(eps >= 0.0, op, ": eps must be >= 0, got ", eps);
  SP_CHECK(rl.n > 0, op, ": the last axis of x ", x.shape(), " is empty");
}

// Every part defined and of part 0's shape and dtype.
void CheckSumParts(const VarList& parts) {
  SP_CHECK(!parts.empty(), "layer_norm_of_sum: needs at least one part");
  for (std::size_t k = 0; k < parts.size(); ++k) {
    SP_CHECK(parts[k].defined(), "layer_norm_of_sum: part ", k, " is undefined");
  }
  for (std::size_t k = 1; k < parts.size(); ++k) {
    SP_CHECK(parts[k].shape() == parts[0].shape(), "layer_norm_of_sum: part ", k, " has shape ",
             parts[k].shape(), " but part 0 has shape ", parts[0].shape(),
             " (all parts must share one shape; no broadcasting)");
    SP_CHECK(parts[k].dtype() == parts[0].dtype(), "layer_norm_of_sum: part ", k, " ",
             parts[k].shape(), " is ", ToString(parts[k].dtype()), " but part 0 ", parts[0].shape(),
             " is ", ToString(parts[0].dtype()));
  }
}

template <typename T>
std::vector<const T*> DataPointers(const VarList& parts) {
  std::vector<const T*> pointers;
  pointers.reserve(parts.size());
  for (const Var& part : parts) pointers.push_back(part.value().data<T>());
  return pointers;
}

}  // namespace

Var layer_norm(const Var& x, const Var& gain, const Var& bias, double eps) {
  const RowLayout rl = Rows(x, "layer_norm");
  CheckLayerNormArguments(x, rl, gain, bias, eps, "layer_norm");

  Tensor out(x.shape(), x.dtype());
  Tensor stats(Shape{rl.rows, 2}, x.dtype());
  DispatchDType(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    LayerNormForwardKernel<T>({x.value().data<T>()},
                              gain.defined() ? gain.value().data<T>() : nullptr,
                              bias.defined() ? bias.value().data<T>() : nullptr, eps, rl,
                              out.data<T>(), /*sum_out=*/nullptr, stats.data<T>());
  });

  return RecordOp("layer_norm", out, {x, gain, bias},
                  [rl, eps, stats](const VarList& in, const Var&, const Var& g) {
                    const bool want_gain = WantsInputGrad(in, 1);
                    const bool want_bias = WantsInputGrad(in, 2);
                    if (!GradModeEnabled()) {
                      return FusedLayerNormGrads(in[0].value(), in[1], want_gain, want_bias, stats,
                                                 g, rl);
                    }
                    return RecordedLayerNormGrads(in[0], in[1], want_gain, want_bias, eps, g);
                  });
}

Var layer_norm_of_sum(const VarList& parts, const Var& gain, const Var& bias, double eps) {
  CheckSumParts(parts);
  if (parts.size() == 1) return layer_norm(parts[0], gain, bias, eps);
  const Var& first = parts[0];
  const RowLayout rl = Rows(first, "layer_norm_of_sum");
  CheckLayerNormArguments(first, rl, gain, bias, eps, "layer_norm_of_sum");

  VarList inputs = parts;
  inputs.push_back(gain);
  inputs.push_back(bias);
  const bool recording = WouldRecord(inputs);
  Tensor out(first.shape(), first.dtype());
  Tensor stats(Shape{rl.rows, 2}, first.dtype());
  // The sum is kept only for the fused backward (x of layer_norm's VJP).
  Tensor saved_sum = recording ? Tensor(first.shape(), first.dtype()) : Tensor();
  DispatchDType(first.dtype(), [&](auto zero) {
    using T = decltype(zero);
    LayerNormForwardKernel<T>(
        DataPointers<T>(parts), gain.defined() ? gain.value().data<T>() : nullptr,
        bias.defined() ? bias.value().data<T>() : nullptr, eps, rl, out.data<T>(),
        recording ? saved_sum.data<T>() : nullptr, stats.data<T>());
  });

  const std::size_t num_parts = parts.size();
  return RecordOp(
      "layer_norm_of_sum", out, std::move(inputs),
      [rl, eps, stats, saved_sum, num_parts](const VarList& in, const Var&, const Var& g) {
        const Var& gain = in[num_parts];
        const bool want_gain = WantsInputGrad(in, num_parts);
        const bool want_bias = WantsInputGrad(in, num_parts + 1);
        VarList grads;  // {dx, dgain, dbias} of layer_norm at x = the sum
        if (!GradModeEnabled()) {
          grads = FusedLayerNormGrads(saved_sum, gain, want_gain, want_bias, stats, g, rl);
        } else {
          // create_graph: the unfused form, so the sum carries its
          // dependence on every part.
          Var x = add(in[0], in[1]);
          for (std::size_t k = 2; k < num_parts; ++k) x = add(x, in[k]);
          grads = RecordedLayerNormGrads(x, gain, want_gain, want_bias, eps, g);
        }
        // d(sum)/d(part) is the identity, so every part gets dx itself: one
        // Var shared by all of them, as add's VJP does (the engine adds
        // gradients into fresh tensors and never mutates one).
        VarList result(num_parts + 2);
        for (std::size_t k = 0; k < num_parts; ++k) {
          if (WantsInputGrad(in, k)) result[k] = grads[0];
        }
        result[num_parts] = grads[1];
        result[num_parts + 1] = grads[2];
        return result;
      });
}

// ------------------------------------------------------------ cross_entropy

Var cross_entropy(const Var& logits, const std::vector<int64_t>& targets, int64_t ignore_index) {
  const RowLayout rl = Rows(logits, "cross_entropy");
  SP_CHECK(rl.n > 0, "cross_entropy: logits ", logits.shape(), " have no classes");
  SP_CHECK(static_cast<int64_t>(targets.size()) == rl.rows, "cross_entropy: ", targets.size(),
           " targets for logits ", logits.shape(), " (", rl.rows, " rows of ", rl.n, " classes)");
  int64_t kept = 0;
  for (std::size_t r = 0; r < targets.size(); ++r) {
    if (targets[r] == ignore_index) continue;
    SP_CHECK(targets[r] >= 0 && targets[r] < rl.n, "cross_entropy: target ", targets[r], " (row ",
             r, ") is out of range [0, ", rl.n, ") for logits ", logits.shape(), " (ignore_index ",
             ignore_index, ")");
    ++kept;
  }

  // Per-row lse is kept for the fused backward; per-row losses are added in
  // row order afterwards.
  Tensor lse(Shape{rl.rows}, logits.dtype());
  std::vector<double> row_loss(rl.rows, 0.0);
  DispatchDType(logits.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* in = logits.value().data<T>();
    T* l = lse.data<T>();
    ParallelFor(0, rl.rows, MinChunk(rl.n), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        l[r] = RowLogSumExp(in + r * rl.n, rl.n);
        if (targets[r] != ignore_index) {
          row_loss[r] = static_cast<double>(l[r] - in[r * rl.n + targets[r]]);
        }
      }
    });
  });
  double total = 0.0;
  for (double v : row_loss) total += v;
  // With every row ignored the loss (and its gradient) is 0, not 0/0.
  const double inv_kept = kept > 0 ? 1.0 / static_cast<double>(kept) : 0.0;
  Tensor out = Tensor::Scalar(total * inv_kept, logits.dtype());

  return RecordOp(
      "cross_entropy", out, {logits},
      [rl, targets, ignore_index, inv_kept, lse](const VarList& in, const Var&, const Var& g) {
        const Var& x = in[0];
        if (!GradModeEnabled()) {
          // (softmax - onehot) * g / N on kept rows, 0 on ignored rows.
          Tensor dx(x.shape(), x.dtype());
          DispatchDType(x.dtype(), [&](auto zero) {
            using T = decltype(zero);
            const T* xv = x.value().data<T>();
            const T* l = lse.data<T>();
            T* d = dx.data<T>();
            const T scale = static_cast<T>(g.value().item() * inv_kept);
            ParallelFor(0, rl.rows, MinChunk(rl.n), [&](int64_t begin, int64_t end) {
              for (int64_t r = begin; r < end; ++r) {
                T* dr = d + r * rl.n;
                if (targets[r] == ignore_index) {
                  std::fill_n(dr, rl.n, T(0));
                  continue;
                }
                internal::VecExpShifted(xv + r * rl.n, l[r], dr, rl.n);
                for (int64_t i = 0; i < rl.n; ++i) dr[i] *= scale;
                dr[targets[r]] -= scale;
              }
            });
          });
          return VarList{Var(dx)};
        }
        Tensor onehot = Tensor::Zeros(x.shape(), x.dtype());
        Tensor weight = Tensor::Zeros(ReducedShape(x.shape(), true), x.dtype());
        for (int64_t r = 0; r < rl.rows; ++r) {
          if (targets[r] == ignore_index) continue;
          onehot.set(r * rl.n + targets[r], 1.0);
          weight.set(r, inv_kept);
        }
        const Var per_entry = mul(sub(softmax(x), constant(onehot)), constant(weight));
        return VarList{mul(per_entry, g)};
      });
}

}  // namespace stillpoint
