// What a forward solver is asked to solve: a batched fixed-point problem
//
//   z_b = f(z_b)   for every sample b = 0..B-1,  z_b in R^n,
//
// equivalently the root F(z) = f(z) - z = 0. States are tensors of shape
// [B, n] (float32 or float64). Samples are independent: the solver judges
// convergence per sample and stops evaluating samples that have converged,
// so the map is called on the rows that are still active, together with
// their sample indices (a DEQ layer uses them to pick each sample's
// injection).
//
// Solvers only know maps on tensors, never layers (DESIGN.md).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "framework/tensor.h"

namespace stillpoint {

// Evaluates f on a subset of samples: z is [k, n] holding the states of the
// samples listed in sample_ids (k = sample_ids.size(), increasing order);
// writes f(z) into *out, a preallocated [k, n] tensor of z's dtype, or
// rebinds *out to a [k, n] tensor of that dtype holding f(z) (the solver
// then takes that storage over when nothing else shares it, else copies
// it). Must not keep references to z or out. Returns false if it could not
// evaluate (the solver reports FAILURE for those samples); non-finite values
// are fine to return and are detected by the solver.
using BatchedMap =
    std::function<bool(const Tensor& z, const std::vector<int64_t>& sample_ids, Tensor* out)>;

// Optional Jacobian-vector product of f: writes J_f(z) v into *out (all
// [k, n]). Solvers that need it (Newton-Krylov, the Ceres trust-region
// backend) fall back to finite differences of f when it is absent.
using BatchedJvp = std::function<bool(const Tensor& z, const Tensor& v,
                                      const std::vector<int64_t>& sample_ids, Tensor* out)>;

// Optional per-sample scalar energy E(z_b) whose stationary points are the
// fixed points (f = z - s grad E): enables the Ceres GradientProblemSolver
// backend and energy traces. energy: [k] values; gradient: [k, n].
using BatchedEnergy = std::function<bool(const Tensor& z, const std::vector<int64_t>& sample_ids,
                                         Tensor* energy, Tensor* gradient)>;

struct FixedPointProblem {
  BatchedMap map;       // required
  BatchedJvp jvp;       // optional
  BatchedEnergy energy; // optional
  int64_t batch_size = 0;
  int64_t state_size = 0;  // n
};

}  // namespace stillpoint
