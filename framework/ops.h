// The differentiable ops. Each op is one function that computes its value
// and records its VJP (see autograd.h for the contract). VJPs are written
// with these same ops, so every op here supports second derivatives unless
// its comment says otherwise. When grad mode is off (NoGrad, or a backward
// without create_graph) an op records nothing.
//
// Shapes: tensors have rank 0..4. "Broadcasting" follows NumPy: shapes are
// aligned at the trailing axis and an extent of 1 stretches. All inputs of an
// op must share one dtype; a mismatch, or shapes that do not fit, throws
// stillpoint::Error naming the op and the shapes.
//
// The implementations live in family files: ops_elementwise.cc,
// ops_reduce.cc, ops_linalg.cc, ops_shape.cc and ops_nn.cc.
#pragma once

#include <cstdint>
#include <vector>

#include "framework/autograd.h"
#include "framework/tensor.h"

namespace stillpoint {

// ------------------------------------------------------------ constants

// A leaf that does not require grad.
Var constant(const Tensor& value);
// A one-element constant of x's dtype, shape [] (broadcasts anywhere).
Var scalar_like(const Var& x, double value);
Var zeros_like(const Var& x);
Var ones_like(const Var& x);

// ------------------------------------------ elementwise binary (broadcast)

// a, b: broadcastable shapes -> broadcast shape.
Var add(const Var& a, const Var& b);
Var sub(const Var& a, const Var& b);
Var mul(const Var& a, const Var& b);
Var div(const Var& a, const Var& b);
// max(a, b) elementwise; where equal, the gradient goes to a.
Var maximum(const Var& a, const Var& b);

// ------------------------------------------------- scalar and unary ops

// x -> same shape.
Var add_scalar(const Var& x, double s);
Var mul_scalar(const Var& x, double s);
// s / x
Var rdiv_scalar(double s, const Var& x);
Var neg(const Var& x);
Var exp(const Var& x);
Var log(const Var& x);
Var sqrt(const Var& x);
Var rsqrt(const Var& x);  // 1 / sqrt(x)
Var square(const Var& x);
Var pow(const Var& x, double exponent);
// |x|; the derivative at 0 is taken as 0.
Var abs(const Var& x);
Var tanh(const Var& x);
Var sigmoid(const Var& x);
// max(x, 0); the derivative at 0 is taken as 0.
Var relu(const Var& x);
// GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). When
// recording, gelu'(x) is computed in the same pass and kept with the node
// (one tensor of x's size) so the backward is one multiply.
Var gelu(const Var& x);
// log(1 + exp(x)), computed stably.
Var softplus(const Var& x);

Var operator+(const Var& a, const Var& b);
Var operator-(const Var& a, const Var& b);
Var operator*(const Var& a, const Var& b);
Var operator/(const Var& a, const Var& b);
Var operator-(const Var& x);
Var operator+(const Var& a, double s);
Var operator+(double s, const Var& a);
Var operator-(const Var& a, double s);
Var operator-(double s, const Var& a);
Var operator*(const Var& a, double s);
Var operator*(double s, const Var& a);
Var operator/(const Var& a, double s);
Var operator/(double s, const Var& a);

// ------------------------------------------------------------ reductions

// All elements -> shape [].
Var sum(const Var& x);
Var mean(const Var& x);
// Over one axis (negative counts from the end). keepdim keeps it as extent 1.
Var sum(const Var& x, int axis, bool keepdim = false);
Var mean(const Var& x, int axis, bool keepdim = false);
// Maximum over one axis; the gradient flows to the first maximal entry.
Var max(const Var& x, int axis, bool keepdim = false);

// Sums x down to `shape`, which x's shape must broadcast from (the VJP of
// broadcasting). broadcast_to is its adjoint.
Var sum_to(const Var& x, const Shape& shape);
Var broadcast_to(const Var& x, const Shape& shape);

// ---------------------------------------------------- softmax family (last axis)

// [..., n] -> [..., 1] if keepdim else [...]; max-shifted, stable for any
// finite input and for -inf entries (as long as one entry per row is finite).
Var logsumexp(const Var& x, bool keepdim = false);
// [..., n] -> [..., n].
Var softmax(const Var& x);
Var log_softmax(const Var& x);

// ---------------------------------------------------------------- linalg

// a: [m, k] (or [k, m] if transpose_a), b: [k, n] (or [n, k] if transpose_b)
// -> [m, n]. Batched: a [..., m, k] with b [..., k, n] of the same leading
// extents, or b of rank 2 shared by every batch entry -> [..., m, n].
Var matmul(const Var& a, const Var& b, bool transpose_a = false, bool transpose_b = false);
// x: [m, k], weight: [k, n], bias: [n] or undefined -> x weight + bias,
// [m, n]. The same values as add(matmul(x, weight), bias), with the bias
// added to each block of the product while it is in cache (one pass and
// one tensor fewer).
Var linear(const Var& x, const Var& weight, const Var& bias);
// gelu(linear(x, weight, bias)) in one pass: each block of the product gets
// its bias and GELU (and, when recording, gelu' for the backward) while it
// is in cache, so the pre-activation is never written out. Bitwise the
// values and gradients of the two ops in sequence.
Var linear_gelu(const Var& x, const Var& weight, const Var& bias);
// A transformer's feed-forward block, x: [m, k] -> linear(linear_gelu(x,
// w1, b1), w2, b2), [m, n] (biases may be undefined), as one recorded op:
// the values and gradients of those two ops, bitwise, with the backward's
// product g w2^T multiplied by gelu' as it is stored instead of in a pass
// of its own.
Var feed_forward(const Var& x, const Var& w1, const Var& b1, const Var& w2, const Var& b2);

// ------------------------------------------------------- shape and index

// Same numel; the result shares storage with x (a view).
Var reshape(const Var& x, const Shape& shape);
// Swaps two axes (copies).
Var transpose(const Var& x, int axis0, int axis1);
// Result axis i is x's axis perm[i] (copies).
Var permute(const Var& x, const std::vector<int>& perm);
// Entries [begin, end) along axis.
Var slice(const Var& x, int axis, int64_t begin, int64_t end);
// Joins along axis; all other extents must agree.
Var concat(const VarList& parts, int axis);
// Picks entries indices[j] along axis: the result has extent indices.size()
// on that axis. Indices may repeat (gradients add up).
Var gather(const Var& x, int axis, const std::vector<int64_t>& indices);
// table: [V, D], ids: any shape S (given as ids_shape, values in [0, V))
// -> S + [D].
Var embedding(const Var& table, const std::vector<int64_t>& ids, const Shape& ids_shape);
// Where mask (broadcastable to x, nonzero = true) is set, the result holds
// value (e.g. -inf for attention masks) and the gradient is zero.
Var masked_fill(const Var& x, const Tensor& mask, double value);

// ----------------------------------------------------------------- fused nn

// Multi-head scaled dot-product attention, fused, on the projections' own
// layout (no head permutes): q [B, Tq, D], k and v [B, Tk, D], D = heads * dh
// -> [B, Tq, D]. Head h uses columns [h dh, (h + 1) dh) of all three:
//   out_h = softmax(scale q_h k_h^T + M) v_h,
// where M hides key j from query i (weight exactly 0) when causal and
// j > i + Tk - Tq. A query that sees no key gets NaN. scale > 0. When
// recording, the [B, heads, Tq, Tk] probabilities are kept from the forward
// pass if they are no larger than q, k and v together, else recomputed in
// backward (per (b, h) block in scratch by the first call, in one pass per
// row from each row's max and softmax sum kept by the forward pass, [B,
// heads, Tq] each; kept by the second call through the node for all later
// ones when no more than 8 times the size of q, k and v, else recomputed by
// every call, so that the many VJPs of an implicit layer's adjoint do not
// hold a [B, heads, Tq, Tk] tensor at long sequences). A forward pass with
// no tape holds no [Tq, Tk] block either: each task works through its
// queries in blocks of rows, in scratch.
Var multi_head_attention(
    const Var& q, const Var& k, const Var& v, int64_t heads, double scale, bool causal = false);
// Self-attention on one packed projection: qkv [B, T, 3 D] holds q, k and v
// side by side (columns [0, D), [D, 2 D), [2 D, 3 D)) -> [B, T, D]; the same
// values as multi_head_attention on the three column ranges, with one input
// (and so one gradient, [B, T, 3 D]) instead of three. One [D, 3 D]
// projection product replaces three [D, D] ones.
Var multi_head_self_attention(const Var& qkv, int64_t heads, double scale, bool causal = false);
// The same computation with unfused differentiable ops (permutes, matmul,
// masked_fill, softmax): the reference for tests, and what the fused VJP
// differentiates under create_graph.
Var multi_head_attention_reference(
    const Var& q, const Var& k, const Var& v, int64_t heads, double scale, bool causal = false);

// Normalises over the last axis: (x - mean) / sqrt(var + eps) * gain + bias,
// with the biased variance. gain, bias: [D] (either may be undefined).
Var layer_norm(const Var& x, const Var& gain, const Var& bias, double eps = 1e-5);
// layer_norm of parts[0] + parts[1] + ... (a residual sum before a norm) in
// one pass per row: the same values, bitwise, as layer_norm of chained add()s
// ((p0 + p1) + p2 ...), without a separate pass and tensor per add. Every
// part gets layer_norm's dx as its gradient. parts: one or more Vars of one
// shape [..., D] and dtype (no broadcasting); gain, bias as for layer_norm.
// When recording, the sum is kept for the backward (as layer_norm keeps x);
// create_graph differentiates the unfused form.
Var layer_norm_of_sum(const VarList& parts, const Var& gain, const Var& bias, double eps = 1e-5);
// logits [..., C], targets: one class per row of logits (numel / C entries,
// each in [0, C), or ignore_index to skip the row) -> mean over the kept rows,
// shape []. Fused with log_softmax.
Var cross_entropy(const Var& logits,
                  const std::vector<int64_t>& targets,
                  int64_t ignore_index = -1);

// --------------------------------------------------------------- helpers

// The broadcast shape of a and b, or a thrown Error naming `op`.
Shape BroadcastShapes(const Shape& a, const Shape& b, const char* op);

}  // namespace stillpoint
