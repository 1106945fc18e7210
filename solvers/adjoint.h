// The backward half of an implicit layer: options for how gradients flow
// through a fixed point z* = f(z*), and the adjoint linear solvers.
//
// For a loss L(z*) with g = dL/dz*, the implicit function theorem gives
// dL/dtheta = w^T df/dtheta (at z*), where w solves the adjoint equation
//
//   w = g + J^T w,      J = J_f(z*) = df/dz at the fixed point,     (*)
//
// i.e. (I - J^T) w = g. Samples are independent (f acts row by row), so (*)
// is one n x n system per sample b: w_b = g_b + J_b^T w_b. The solvers below
// only see J^T through a batched vector-Jacobian product (one VJP through
// the recorded evaluation of f at z* per application), never J itself,
// except `dense`, which assembles it from n VJPs.
//
// Stopping rule, shared by every adjoint solver (per sample b):
//   r_b = g_b + J_b^T w_b - w_b,   converged when ||r_b||_2 <= tolerance ||g_b||_2.
// A sample with g_b = 0 has the solution w_b = 0 and converges at once.
// Tolerance 0 asks for a fixed budget: no residual meets it, and a sample
// that uses the whole budget (max_iterations, or neumann_terms terms) ends
// INEXACT, not MAX_ITERATIONS: the truncated iteration is what was asked
// for. Its residual is still measured and reported.
//
// SolveAdjoint is defined in solvers/adjoint.cc; the pieces live in
// solvers/adjoint/: backward_options.h (BackwardMode, AdjointSolverType,
// BackwardOptions), adjoint_summary.h (AdjointSummary), and, internal to the
// solvers, operator.h (the operator on float64 rows), sample_loop.h (the
// per-sample loop every iterative method runs), methods.h with krylov.cc,
// neumann.cc, dense.cc and forward_solvers.cc (the methods).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "framework/tensor.h"
#include "solvers/adjoint/backward_options.h"
#include "solvers/adjoint/adjoint_summary.h"
#include "solvers/forward_options.h"
#include "solvers/solver_summary.h"

namespace stillpoint {

// J^T v for every sample: v and *out are [B, n] in the dtype of the solve.
// Writes J^T v into *out, which is preallocated, or rebinds *out to a
// tensor of that shape and dtype holding it (the tensor the VJP's own
// computation made, so it need not be copied); the solver only reads it.
// Must not keep references to v or out.
using BatchedVjp = std::function<void(const Tensor& v, Tensor* out)>;

// Solves (*) for every sample with options.solver (options.mode is not
// read). g: [B, n], float32 or float64. *w: on entry an initial guess of
// g's shape and dtype, or an empty Tensor to start from g; on return the
// solution (the lowest-residual iterate for solvers that track one). A
// sample whose solve ends non-finite gets w_b = g_b (the Jacobian-free
// gradient) and kNonFinite, so a NaN never reaches the parameters silently.
// Throws stillpoint::Error for invalid options or shapes.
AdjointSummary SolveAdjoint(const BackwardOptions& options,
                            const BatchedVjp& vjp,
                            const Tensor& g,
                            Tensor* w);

// SolveAdjoint from a start that is usually good but not guaranteed to be
// (*w, defined; e.g. the solution of a nearby right-hand side). When the
// solve from *w misses the tolerance, the start is judged by its first
// relative residual against that of the start from g (|J^T g_b| / |g_b|, one
// more VJP): if g was the better start, (*) is solved again from g and the
// solution with the smaller largest relative residual is kept; if not, the
// solve from *w stands (from a smaller residual the same iterations end at
// least as close on the contractions the iterative solvers converge on).
// The summary is the kept solve's, with every VJP counted and its message
// saying what happened.
AdjointSummary SolveAdjointFromStart(const BackwardOptions& options,
                                     const BatchedVjp& vjp,
                                     const Tensor& g,
                                     Tensor* w);

}  // namespace stillpoint
