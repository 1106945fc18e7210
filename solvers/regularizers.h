// Regularizers and diagnostics of implicit layers, all computed from VJPs of
// the cell f at a point (usually the fixed point z*):
//
// - JacobianFrobeniusPenalty: a Hutchinson estimate of ||J_f(z)||_F^2 / numel,
//   differentiable w.r.t. f's parameters. Adding it to the loss keeps J small,
//   so the forward and adjoint solves stay contractive and fast.
// - EstimateSpectralRadius: Arnoldi (or power iteration) on J^T per sample
//   (diagnostic; the adjoint fixed-point iteration converges iff it is below
//   1), keeping
//   the sign of the dominant eigenvalue: near -rho the step overshoots
//   (damping or a smaller step contracts it again), near +rho the map
//   expands along that direction (for an energy update, a saddle of E).
// - SpectralRadiusPenalty: a hinge on that estimate, differentiable w.r.t.
//   f's parameters, to keep the radius below a target during training.
// - FixedPointCorrectionLoss: the task loss applied to intermediate forward
//   iterates after a few recorded damped steps of f, weighted towards the
//   last; trains f so that early iterates are already good.
//
// The cell's contract is that of solvers/implicit_solve.h (CellFn): rows are
// samples and do not interact.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "framework/autograd.h"
#include "framework/random.h"
#include "framework/tensor.h"
#include "solvers/implicit_solve.h"

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

// How EstimateSpectralRadius finds the dominant eigenvalue of J^T.
enum class SpectralRadiusMethod {
  // Arnoldi: an orthonormal Krylov basis of J_b^T per sample and the
  // eigenvalues (Ritz values) of its small Hessenberg matrix. One VJP per
  // step, like power iteration, but it does not read high on a non-normal
  // J (where ||J^T v|| grows for a while before it decays, power iteration
  // overestimates the radius for many steps) and it finds a complex pair.
  kArnoldi,
  // Power iteration: radius ||J_b^T v_b|| for the last unit iterate, the
  // sign from its Rayleigh quotient.
  kPowerIteration,
};

struct SpectralRadiusOptions {
  SpectralRadiusMethod method = SpectralRadiusMethod::kArnoldi;
  // Steps per sample (each one batched VJP); for Arnoldi also the largest
  // Krylov dimension.
  int max_iterations = 50;
  // A sample stops when its estimate is within tolerance x estimate: for
  // Arnoldi when the dominant Ritz pair's residual ||J^T y - lambda y|| is at
  // most tolerance x |lambda| (or the Krylov space is invariant: exact), for
  // power iteration when the estimate changes by at most that between two
  // steps.
  double tolerance = 1e-6;
  // Seed of the random start vectors.
  uint64_t seed = 0;
};

struct SpectralRadiusResult {
  // Per sample: the estimate of the largest |eigenvalue| of J_b. Arnoldi:
  // the modulus of the dominant Ritz value. Power iteration: ||J_b^T v_b||
  // for the last unit iterate v_b, which tends to it when that eigenvalue is
  // unique in modulus and reads high before convergence on a non-normal J.
  std::vector<double> radius;
  // Per sample: the dominant eigenvalue with its sign (Arnoldi: the real
  // part of the dominant Ritz value; power iteration: the Rayleigh quotient
  // v_b . (J_b^T v_b)). For a complex pair, |eigenvalue| < radius.
  std::vector<double> eigenvalue;
  // Per sample (rows of [B, n]): a unit vector along the dominant direction,
  // SpectralRadiusPenalty's directions. Arnoldi: the dominant Ritz vector
  // for a real eigenvalue (||J_b^T v_b|| = radius[b] once converged); for a
  // complex pair the direction of its invariant plane that J^T stretches
  // most (||J_b^T v_b|| >= radius[b]). Power iteration: v_b.
  Tensor directions;
  std::vector<int> iterations;
  std::vector<char> converged;  // met the tolerance
  double max_radius = 0.0;
  // The eigenvalue of the sample with the largest radius: its sign tells an
  // overshooting step (near -max_radius) from an expanding direction or
  // saddle (near +max_radius).
  double dominant_eigenvalue = 0.0;
};

// The spectral radius of J^T = (d f / d z)^T at z ([B, ...]) per sample, by
// options.method; not differentiable (diagnostic).
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
