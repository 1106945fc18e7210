// MultiHeadAttention: explicit (one-step) scaled dot-product attention.
//
//   Q = x Wq + bq,  K = c Wk + bk,  V = c Wv + bv       (c = x for self-attention)
//   head h uses the columns [h*dh, (h+1)*dh) of Q, K and V (dh = dim / heads)
//   O_h = softmax(s Q_h K_h^T + A) V_h,   s = 1/sqrt(dh) unless options.scale is set
//   y = concat_h(O_h) Wo + bo
//
// Shapes: x [B, Tq, dim], c [B, Tk, dim] -> y [B, Tq, dim]. W* are [dim, dim]
// (y = x W, as in Linear), b* are [dim].
// Parameters: "wq", "wk", "wv", "wo", each a Linear ("wq.weight", "wq.bias").
//
// Masks (A above), all optional and combined:
//   - options.causal: query i sees keys j <= i + (Tk - Tq) (the usual
//     lower-triangular mask when Tq = Tk);
//   - AttentionMask::key_mask [B, Tk] or [Tk], nonzero = that key is hidden
//     from every query (padding);
//   - AttentionMask::additive, broadcastable to [B, heads, Tq, Tk], added to
//     the scaled scores (relative-position biases, or -inf entries);
//   - options.layout (positions.h), self-attention only: its mask (causal,
//     local) and ALiBi bias, and rotary positions on Q and K.
// Hidden keys get weight exactly 0. Every query must keep at least one key;
// a query whose keys are all hidden gets NaN (softmax of all -inf).
//
// Contract: x and c have the parameters' dtype and last extent dim; masks
// have a matching shape (any dtype); otherwise a stillpoint::Error names the
// layer and the shapes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "framework/autograd.h"
#include "framework/module.h"
#include "framework/option_fields.h"
#include "framework/random.h"
#include "framework/tensor.h"
#include "layers/linear.h"
#include "layers/positions.h"

namespace stillpoint {

struct AttentionOptions {
  // Lower-triangular (autoregressive) masking.
  bool causal = false;
  // Multiplies Q K^T in every head; 0 means the default 1/sqrt(dim / heads).
  double scale = 0.0;
  // Biases on the four projections.
  bool bias = true;
  DType dtype = DType::kFloat32;
  // Positions and mask (positions.h); null: none. Shared with the model,
  // which sets its grid width at run time. Not a field.
  std::shared_ptr<const AttentionLayout> layout = nullptr;

  // The fields, declared once (framework/option_fields.h); not config keys.
  static const OptionFields<AttentionOptions>& Fields();
  // The fields' ranges (dim and heads are the constructor's).
  bool IsValid(std::string* error) const;
  std::string ToString() const;
};

// The keys and values of the positions a causal self-attention has read so
// far, for incremental decoding (MultiHeadAttention::ForwardStep): [B, n,
// dim] each after the projections (undefined while n = 0). Position j's key
// and value depend only on its own input, so they are computed once.
struct KeyValueCache {
  Tensor keys;
  Tensor values;

  int64_t length() const { return keys.defined() ? keys.dim(1) : 0; }
};

struct AttentionMask {
  // [B, Tk] or [Tk]; nonzero entries hide that key from every query.
  Tensor key_mask;
  // Broadcastable to [B, heads, Tq, Tk]; added to the scaled scores.
  Tensor additive;
};

class MultiHeadAttention : public Module {
 public:
  MultiHeadAttention(int64_t dim, int64_t heads, Rng& rng, const AttentionOptions& options = {});

  std::string Name() const override;

  // Self-attention: x [B, T, dim] -> [B, T, dim].
  Var Forward(const Var& x, const AttentionMask& mask = {}) const;
  // Cross-attention: queries from x [B, Tq, dim], keys and values from
  // context [B, Tk, dim] -> [B, Tq, dim].
  Var Forward(const Var& x, const Var& context, const AttentionMask& mask = {}) const;

  // Self-attention of a zero input [batch, length, dim], for the cost of one
  // row: every query, key and value is its projection's bias, so a query's
  // scores are all equal and its weights average copies of one value; the
  // result is wo(bv) at every position, with or without the causal mask.
  // Gradients reach wv's bias and wo; wq, wk and wv's weight get zeros (the
  // output does not depend on them).
  Var ForwardAtZero(int64_t batch, int64_t length) const;

  // Incremental decoding: the output at n >= 1 new positions x [B, n, dim]
  // of a causal self-attention whose earlier positions' keys and values are
  // `past` (each new position sees every cached key and the new ones up to
  // itself): the same values, up to rounding, as the last n rows of
  // Forward(all positions). With `next`, *next becomes past plus the new
  // positions' keys and values (it may be &past). Throws unless
  // SupportsStep().
  Var ForwardStep(const Var& x, const KeyValueCache& past, KeyValueCache* next = nullptr) const;
  // Whether ForwardStep applies: causal, and no layout that makes a key
  // depend on where the query is (rotary, ALiBi, a window, a grid). Else
  // false with the reason in *why.
  bool SupportsStep(std::string* why = nullptr) const;

  int64_t dim() const { return dim_; }
  int64_t heads() const { return heads_; }
  int64_t head_dim() const { return dim_ / heads_; }
  bool causal() const { return causal_; }
  // The factor s applied to Q K^T.
  double scale() const { return scale_; }

  const std::shared_ptr<Linear>& wq() const { return wq_; }
  const std::shared_ptr<Linear>& wk() const { return wk_; }
  const std::shared_ptr<Linear>& wv() const { return wv_; }
  const std::shared_ptr<Linear>& wo() const { return wo_; }

 private:
  // [B, T, dim] -> [B, heads, T, dh].
  Var SplitHeads(const Var& x) const;
  // [B, heads, T, dh] -> [B, T, dim].
  Var MergeHeads(const Var& x) const;

  int64_t dim_;
  int64_t heads_;
  bool causal_;
  std::shared_ptr<const AttentionLayout> layout_;
  double scale_;
  std::shared_ptr<Linear> wq_, wk_, wv_, wo_;
};

}  // namespace stillpoint
