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
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "framework/tensor.h"
#include "solvers/options.h"
#include "solvers/summary.h"

namespace stillpoint {

// How gradients flow through an implicit layer (solvers/implicit.h).
enum class BackwardMode {
  // "ift" (the default): exact implicit gradient; solves (*) with
  // BackwardOptions::solver.
  kIft,
  // "jfb": Jacobian-free backward, w = g (as if J = 0). One VJP through f,
  // no linear solve. An approximation that is a descent direction when f is
  // a strong enough contraction.
  kJfb,
  // "phantom": phantom gradient. The forward value is k damped steps
  // z <- (1 - tau) z + tau f(z) taken from z* (detached), recorded on the
  // tape; backward is plain backprop through those k steps.
  kPhantom,
  // "unrolled": the explicit reference. No solver: the value is k plain
  // steps z <- f(z) from z0, recorded on the tape, and backward differentiates
  // through all of them (memory grows with k).
  kUnrolled
};
const char* ToString(BackwardMode mode);
bool StringToBackwardMode(const std::string& text, BackwardMode* mode);

// Linear solver for (*) in BackwardMode::kIft.
enum class AdjointSolverType {
  // "fixed_point": w <- g + J^T w, the forward Picard solver (tau = 1) run
  // on (*). Converges when the spectral radius of J is below 1.
  kFixedPoint,
  // "anderson": the forward Anderson solver run on (*) (memory
  // anderson_memory); converges faster and also for mildly expansive J.
  kAnderson,
  // "broyden": the forward limited-memory Broyden solver run on (*).
  kBroyden,
  // "gmres": restarted GMRES on (I - J^T) w = g; any nonsingular I - J.
  kGmres,
  // "cg": conjugate gradient; requires I - J symmetric positive definite
  // (energy maps f = z - s grad E at a minimum of E). A non-positive
  // curvature ends the sample in kLinearAlgebraFailure.
  kConjugateGradient,
  // "minres": MINRES; requires I - J symmetric, may be indefinite (energy
  // maps at saddle points).
  kMinres,
  // "neumann": the truncated Neumann series w = sum_{i=0..k} (J^T)^i g, i.e.
  // k = neumann_terms fixed-point steps; a fixed-cost approximation that
  // stops early once the tolerance is met.
  kNeumann,
  // "dense": assembles J_b^T from n VJPs and solves exactly by LU. For small
  // states (n <= dense_max_state_size); the reference for the others.
  kDense
};
const char* ToString(AdjointSolverType type);
bool StringToAdjointSolverType(const std::string& text, AdjointSolverType* type);
// Every value, in declaration order (for tests and docs).
std::vector<AdjointSolverType> AllAdjointSolverTypes();

struct BackwardOptions {
  BackwardMode mode = BackwardMode::kIft;

  // -- kIft: the adjoint linear solve --
  AdjointSolverType solver = AdjointSolverType::kFixedPoint;
  // Adjoint iterations per sample (each one VJP, Broyden/Anderson safeguard
  // steps excepted). Used by every solver except kNeumann (neumann_terms)
  // and kDense (always n VJPs).
  int max_iterations = 40;
  // Converged when ||g + J^T w - w||_2 <= tolerance * ||g||_2 per sample.
  double tolerance = 1e-6;
  // kGmres: Krylov vectors kept per sample before a restart (memory
  // (gmres_restart + 1) * n float64 values per sample).
  int gmres_restart = 20;
  // kAnderson / kBroyden: history columns (other forward-solver parameters
  // keep the ForwardSolverOptions defaults; the summary lists them).
  int anderson_memory = 5;
  int broyden_memory = 10;
  // kFixedPoint / kAnderson / kBroyden: a sample ends STAGNATED when its
  // relative adjoint residual has not fallen by 0.1% within this many
  // iterations (0 disables; not judged in a fixed budget, tolerance 0).
  int stagnation_window = 10;
  // kNeumann: terms of the series after g (k VJPs). With tolerance 0 every
  // sample gets exactly this many terms (a truncated series), even when its
  // residual reaches 0 in the state's precision before.
  int neumann_terms = 10;
  // kDense: largest state size it accepts (it builds an n x n matrix per
  // sample); beyond it the solve throws stillpoint::Error.
  int dense_max_state_size = 1024;
  // Start each adjoint solve from the previous solution of the same implicit
  // call site instead of from g (kIft only, ignored by kDense). The call site
  // keeps the previous solution in an AdjointWarmStart object
  // (ImplicitOptions::adjoint_warm_start); a solution of another shape or
  // dtype is not used.
  bool warm_start = false;

  // -- kPhantom: k damped steps z <- (1 - tau) z + tau f(z) from z* --
  int phantom_steps = 5;
  double phantom_tau = 0.5;  // in (0, 1]

  // -- kUnrolled: k plain steps z <- f(z) from z0 --
  int unrolled_steps = 30;

  // False, with a message naming the field and its value, if any option is
  // out of range.
  bool IsValid(std::string* error) const;
  // The options as "key: value" lines, for logs.
  std::string ToString() const;
};

// What a backward pass did, reported like the forward SolverSummary.
struct AdjointSummary {
  BackwardMode mode = BackwardMode::kIft;
  AdjointSolverType solver = AdjointSolverType::kFixedPoint;  // meaningful for kIft
  // Worst over samples (kConverged when every sample met the tolerance).
  // The inexact modes (kJfb, kPhantom, kUnrolled) solve no equation: they
  // report kInexact, their recorded steps as iterations, empty residual
  // vectors (no residual is computed; reports print "n/a") and a message
  // that says so. A fixed-budget solve (tolerance 0) ends kInexact too.
  TerminationType termination_type = TerminationType::kFailure;
  std::string message;
  // The relative tolerance the solve had to meet (BackwardOptions::tolerance
  // for kIft); 0 when there was none (a fixed budget, or an inexact mode).
  double tolerance = 0.0;

  int64_t batch_size = 0;
  int64_t state_size = 0;

  // -- per sample (size batch_size), describing the returned w --
  std::vector<int> sample_iterations;  // VJPs spent on the sample's solve
  // ||g + J^T w - w||_2 and the same divided by ||g||_2 (0 when g = 0).
  std::vector<double> sample_abs_residual;
  std::vector<double> sample_rel_residual;
  std::vector<TerminationType> sample_termination;

  // Max relative residual over the samples still iterating: entry 0 at the
  // start, entry k after iteration k (Krylov solvers report their estimate).
  std::vector<double> rel_residual_trace;

  int iterations = 0;           // max over samples
  int64_t vjp_evaluations = 0;  // batched VJP calls (each on all B rows)
  int64_t history_bytes = 0;    // solver-owned buffers (Krylov bases, LU, history)
  bool warm_started = false;    // started from a previous solution
  double wall_time_seconds = 0.0;
  std::vector<OptionUsage> option_usage;

  // True when every sample converged.
  bool IsUsable() const;
  // Whether residuals were measured (false for the inexact modes).
  bool HasResiduals() const { return !sample_rel_residual.empty(); }
  // Max over samples; only meaningful when HasResiduals().
  double MaxRelResidual() const;
  int64_t CountSamples(TerminationType type) const;
  // One line: "ift/gmres: CONVERGED, 4/4 converged, 9 iterations, 10 VJPs,
  // max rel residual 3.1e-09 (tolerance 1e-06), 0.4 ms"; the residual is
  // "n/a" when none was measured, and a tolerance not met is marked
  // "(tolerance 1e-05 NOT MET)".
  std::string BriefReport() const;
  // The brief line, message, per-status counts, effort, options given vs
  // used, the residual trace and (for up to 16 samples) one line per sample.
  std::string FullReport() const;
};

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

}  // namespace stillpoint
