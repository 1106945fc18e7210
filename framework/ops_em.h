// The EM update of probabilistic attention (layers/probabilistic_attention.h)
// with one value precision per head, and the query part of its logits, as
// fused ops. The update:
//
//   v <- softmax(logits + beta v mu^T) mu
//
// per batch entry and head, over values mu (one per key) and fixed logits
// (the query term, prior and masks). The value term of the EM logits,
// beta (v.mu_j - |v|^2 / 2), differs from beta v.mu_j by a constant per
// query row, which the softmax does not see: the update and its gradients
// are the same without it.
#pragma once

#include "framework/autograd.h"

namespace stillpoint {

// v [B, H, N, dv], logits [B, H, N, S], mu [B, H, S, dv], beta [1, H, 1, 1]
// (or one element); same dtype. Differentiable in all four. One task per
// (b, h) pair runs scores, softmax and weighted sum in a scratch [N, S]
// block (no [B, H, N, S] intermediates besides the weights a recorded
// forward keeps for the backward pass), and the VJP likewise, so results do
// not depend on the thread count. With create_graph the VJP differentiates
// the composed ops (matmul, mul, add, softmax, matmul), so second
// derivatives work.
Var em_update(const Var& v, const Var& logits, const Var& mu, const Var& beta);

// The query part of the EM logits with one query precision per head, as one
// fused op:
//
//   out = alpha (q xi^T - |q|^2 / 2)      (|q_i|^2 broadcast along the keys)
//
// per batch entry and head: q [B, H, N, d] queries, xi [B, H, S, d] keys,
// alpha [1, H, 1, 1] (or one element); out [B, H, N, S]. One GEMM and one
// pass over the [N, S] block per (b, h) instead of a product and four
// broadcast elementwise ops; the VJP likewise (dq = alpha (G xi - rowsum(G)
// q), dxi = alpha G^T q, dalpha = sum(G o out) / alpha computed without the
// division). Other shapes, and create_graph, use the composed ops.
Var em_query_logits(const Var& q, const Var& xi, const Var& alpha);

}  // namespace stillpoint
