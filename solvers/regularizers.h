// Regularizers and diagnostics of implicit layers, all computed from VJPs of
// the cell f at a point (usually the fixed point z*):
//
// - JacobianFrobeniusPenalty: a Hutchinson estimate of ||J_f(z)||_F^2 / numel,
//   differentiable w.r.t. f's parameters. Adding it to the loss keeps J small,
//   so the forward and adjoint solves stay contractive and fast.
// - EstimateSpectralRadius: power iteration on J^T per sample (diagnostic;
//   the adjoint fixed-point iteration converges iff it is below 1), keeping
//   the sign of the dominant eigenvalue: near -rho the step overshoots
//   (damping or a smaller step contracts it again), near +rho the map
//   expands along that direction (for an energy update, a saddle of E).
// - SpectralRadiusPenalty: a hinge on that estimate, differentiable w.r.t.
//   f's parameters, to keep the radius below a target during training.
// - FixedPointCorrectionLoss: the task loss applied to intermediate forward
//   iterates after a few recorded damped steps of f, weighted towards the
//   last; trains f so that early iterates are already good.
//
// The cell's contract is that of solvers/implicit.h (CellFn): rows are
// samples and do not interact.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "framework/autograd.h"
#include "framework/random.h"
#include "framework/tensor.h"
#include "solvers/implicit.h"

namespace stillpoint {

// mean over num_probes probes v ~ N(0, I) (shape of f_z) of
// ||v^T J||_2^2 / numel(z), where J = d f_z / d z. Unbiased for
// ||J||_F^2 / numel(z), which for B samples of size n is the mean over
// samples of ||J_b||_F^2 / n. f_z must have been recorded from z (a leaf
// with requires_grad, or any Var on the tape); the VJPs are recorded
// (create_graph), so the result, shape [], is differentiable w.r.t. the
// parameters f_z depends on. Draws the probes from rng.
Var JacobianFrobeniusPenalty(const Var& f_z, const Var& z, int num_probes, Rng& rng);

// The same at a point z ([B, ...]): records f at a fresh leaf holding z.
Var JacobianFrobeniusPenalty(const CellFn& f, const Tensor& z, int num_probes, Rng& rng);

struct SpectralRadiusOptions {
  // Power-iteration steps per sample (each one batched VJP).
  int max_iterations = 50;
  // A sample stops when its estimate changes by at most tolerance x estimate
  // between two steps.
  double tolerance = 1e-6;
  // Seed of the random start vectors.
  uint64_t seed = 0;
};

struct SpectralRadiusResult {
  // Per sample: ||J_b^T v_b|| for the last unit iterate v_b, which tends to
  // the largest |eigenvalue| of J_b when that eigenvalue is unique in modulus
  // (for a complex pair or non-normal J it is an estimate).
  std::vector<double> radius;
  // Per sample: the Rayleigh quotient v_b . (J_b^T v_b) of the same step,
  // the dominant eigenvalue with its sign once v_b has converged to its
  // eigenvector (then |eigenvalue| = radius). For a complex pair, or before
  // convergence, |eigenvalue| < radius.
  std::vector<double> eigenvalue;
  // Per sample (rows of [B, n]): the unit vector v_b the last estimate was
  // taken along, radius[b] = ||J_b^T v_b||; SpectralRadiusPenalty's
  // directions.
  Tensor directions;
  std::vector<int> iterations;
  std::vector<char> converged;  // met the tolerance
  double max_radius = 0.0;
  // The eigenvalue of the sample with the largest radius: its sign tells an
  // overshooting step (near -max_radius) from an expanding direction or
  // saddle (near +max_radius).
  double dominant_eigenvalue = 0.0;
};

// Power iteration on J^T at z ([B, ...]); not differentiable (diagnostic).
SpectralRadiusResult EstimateSpectralRadius(const CellFn& f,
                                            const Tensor& z,
                                            const SpectralRadiusOptions& options = {});

// mean over samples of max(0, ||J_b^T v_b|| - target)^2 at z ([B, ...]),
// with the unit directions v_b ([B, n], e.g. EstimateSpectralRadius's
// `directions`) held fixed: along the dominant direction the norm is the
// spectral-radius estimate, so the penalty pushes the radius of J_f below
// `target` (the adjoint and Picard iterations converge when it is below 1)
// and is zero, with zero gradient, where it already is. The VJP is recorded
// (create_graph), so the result, shape [], is differentiable w.r.t. f's
// parameters; v's own dependence on them is not followed (an envelope
// argument makes that exact for a symmetric J).
Var SpectralRadiusPenalty(const CellFn& f, const Tensor& z, const Tensor& directions,
                          double target);

struct FixedPointCorrectionOptions {
  // Recorded damped steps z <- (1 - tau) z + tau f(z) applied to each
  // (detached) iterate before the loss.
  int steps = 1;
  double tau = 1.0;  // in (0, 1]
  // Iterate i of N (oldest first) is weighted gamma^(N - 1 - i): the last
  // has weight 1.
  double gamma = 0.8;  // in (0, 1]
};

// sum_i gamma^(N-1-i) loss(z_hat_i), where z_hat_i is `steps` recorded damped
// steps of f from iterates[i] (each [B, ...], e.g.
// ImplicitResult::sampled_iterates). The gradient reaches f's parameters
// through the recorded steps only (phantom-gradient style), never through the
// forward iterations. loss maps a state [B, ...] to a Var of shape [].
// Throws stillpoint::Error if iterates is empty or options are out of range.
Var FixedPointCorrectionLoss(const CellFn& f,
                             const std::vector<Tensor>& iterates,
                             const std::function<Var(const Var&)>& loss,
                             const FixedPointCorrectionOptions& options = {});

}  // namespace stillpoint
