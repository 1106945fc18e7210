// Multi-head self-attention over listed keys: each query sees only its own
// few keys (a local window on a grid), at T x keys-per-query work instead of
// the dense T x T scores. The layers build the lists (LocalNeighbours,
// layers/positions.h); implemented in ops_neighbour_attention.cc.
#pragma once

#include <cstdint>
#include <vector>

#include "framework/autograd.h"
#include "framework/tensor.h"

namespace stillpoint {

// Which keys each query of a self-attention over T tokens sees: query i sees
// keys[i * per_query + n] for n < per_query, where -1 fills the unused slots
// (a token at a grid's edge has fewer neighbours). bias, when defined, is
// [1 or heads, T, per_query]: added to slot n's score of query i (ALiBi);
// its entries at unused slots are ignored.
struct AttentionNeighbours {
  int64_t per_query = 0;
  std::vector<int64_t> keys;
  Tensor bias;
};
// Multi-head self-attention in which each query sees only its listed keys:
// q, k, v [B, T, D], D = heads * dh -> [B, T, D], with
//   out_h[i] = sum_n p_n v_h[j_n],  p = softmax_n(scale q_h[i].k_h[j_n] + bias),
// over the used slots n of query i (keys j_n = keys[i * per_query + n]). The
// same values as multi_head_attention's dense scores with every other key
// masked out, at T * per_query instead of T^2 work and memory: a local
// window on a grid (model.attention_mask local) is 9 keys per query at
// window 1. Every query needs at least one key. When recording, the
// probabilities [B, T, heads, per_query] are kept for the backward pass.
// With create_graph the VJP differentiates neighbour_attention_reference.
Var neighbour_attention(const Var& q,
                        const Var& k,
                        const Var& v,
                        int64_t heads,
                        double scale,
                        const AttentionNeighbours& neighbours);
// The same computation with differentiable ops (gather, mul, sum, softmax).
Var neighbour_attention_reference(const Var& q,
                                  const Var& k,
                                  const Var& v,
                                  int64_t heads,
                                  double scale,
                                  const AttentionNeighbours& neighbours);

}  // namespace stillpoint
