// The modern Hopfield update (Ramsauer et al. 2020), the one map behind
// Hopfield retrieval (training/retrieve.h) and the Hopfield attention layer
// (layers/hopfield.h):
//
//   xi <- softmax(beta xi X^T + mask) X
//
// over stored patterns X (one per row), a CCCP descent of the energy
// E(xi) = 1/2 |xi|^2 - (1/beta) lse(beta X xi).
#pragma once

#include <cstdint>
#include <vector>

#include "framework/autograd.h"
#include "framework/tensor.h"

namespace stillpoint {

// xi [..., N, d], patterns [..., S, d] (batch axes broadcast as in matmul),
// beta broadcastable against the scores [..., N, S] (one element, or one per
// head as [1, H, 1, 1]), mask (optional) an additive [..., N, S] mask.
// Differentiable: the ops matmul, mul, add, softmax, matmul in that order.
// When nothing is recorded (grad mode off or no input requires grad) and xi
// and patterns are matrices with one beta and no mask, the values come from
// HopfieldUpdateInto instead.
Var hopfield_update(const Var& xi, const Var& patterns, const Var& beta, const Var& mask = Var());

// The values alone, for many queries at once: out [Q, d] = the update of
// every row of z [Q, d] against patterns [N, d] (same dtype), parallel over
// blocks of rows. float32 runs the softmax in base 2 on packed patterns
// (beta log2(e) folded into the packing) and normalises the [Q, d] output
// rather than the [Q, N] weights, so it agrees with the composed ops above to
// float32 rounding, not bitwise; float64 is two GEMMs around an exact
// softmax.
void HopfieldUpdateInto(const Tensor& patterns, double beta, const Tensor& z, Tensor* out);

// In float64, for every row xi_r of xi [Q, d]: the nearest pattern
// argmax_j <x_j, xi_r> into nearest[r] and the energy E(xi_r) into energy[r].
void HopfieldNearestAndEnergy(const Tensor& patterns,
                              double beta,
                              const Tensor& xi,
                              std::vector<int64_t>* nearest,
                              std::vector<double>* energy);

}  // namespace stillpoint
