// Options of the forward (fixed-point) solvers, and the enums the solvers
// share with the rest of stillpoint.
//
// Every enum has exactly one ToString and one StringTo<Enum> function; the
// YAML loader and the reports use them and nothing else. StringTo* accept the
// ToString spelling in any letter case and return false (leaving *value
// untouched) for anything else.
//
// Stopping rules (per sample b, judged on every evaluated iterate z_b):
//   abs_b = ||f(z_b) - z_b||_2
//   rel_b = ||f(z_b) - z_b||_2 / (||f(z_b)||_2 + relative_epsilon)
// A sample converges when its residual meets the tolerance of stop_mode. A
// tolerance of exactly 0 is never met: the solve then runs a fixed budget of
// max_iterations iterations (see ForwardSolverOptions::FixedBudget()).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "framework/option_fields.h"
#include "solvers/forward_solver_list.h"

namespace stillpoint {

// ---- enums ----

// The forward solvers: one enumerator per line of
// solvers/forward_solver_list.h, in its order (see there what each does).
enum class ForwardSolverType {
#define SP_FORWARD_SOLVER_ENUMERATOR(value, name, factory) value,
  SP_FORWARD_SOLVERS(SP_FORWARD_SOLVER_ENUMERATOR)
#undef SP_FORWARD_SOLVER_ENUMERATOR
};
const char* ToString(ForwardSolverType type);
bool StringToForwardSolverType(const std::string& text, ForwardSolverType* type);
// Every value, in declaration order (for tests, docs and benchmarks).
std::vector<ForwardSolverType> AllForwardSolverTypes();

enum class StopMode {
  kAbsolute,  // "absolute": abs_b <= absolute_tolerance
  kRelative,  // "relative": rel_b <= relative_tolerance
  kEither     // "either":   either of the two
};
const char* ToString(StopMode mode);
bool StringToStopMode(const std::string& text, StopMode* mode);

// Why a sample (or a whole solve) ended. Declared from best to worst: the
// termination of a batch is the worst over its samples (kConverged only when
// every sample converged). Spelled "CONVERGED", "INEXACT", "MAX_ITERATIONS", ...
enum class TerminationType {
  kConverged,             // met the tolerance
  // A backward pass that is an approximation by design and had no tolerance
  // to meet: the inexact modes (jfb, phantom, unrolled; they compute no
  // residual) and an iterative adjoint solve with tolerance 0 (a fixed
  // budget, e.g. a truncated Neumann series; its residual is reported).
  // Never set by the forward solvers.
  kInexact,
  kUserStop,              // an iteration callback asked to stop
  kMaxIterations,         // ran out of iterations above the tolerance
  kStagnated,             // no progress within stagnation_window iterations
  kDiverged,              // residual grew past divergence_factor x the initial one
  kLinearAlgebraFailure,  // an inner linear solve failed (GMRES, Ceres' linear solver)
  kNonFinite,             // the map or the iterate produced NaN / Inf
  kFailure                // the map returned false, or another unrecoverable error
};
const char* ToString(TerminationType type);
bool StringToTerminationType(const std::string& text, TerminationType* type);

enum class AndersonType {
  kTypeII,  // "type_ii": gamma = argmin ||g_k - dG gamma||^2 (the "bad" Broyden-like form)
  kTypeI    // "type_i":  gamma solves dZ^T dG gamma = dZ^T g_k (the "good" form)
};
const char* ToString(AndersonType type);
bool StringToAndersonType(const std::string& text, AndersonType* type);

enum class BroydenVariant {
  kGood,  // "good": rank-one update of the inverse Jacobian with s^T H (Sherman-Morrison)
  kBad    // "bad":  rank-one update of the inverse Jacobian with y^T
};
const char* ToString(BroydenVariant variant);
bool StringToBroydenVariant(const std::string& text, BroydenVariant* variant);

enum class ForcingTermType {
  kConstant,        // "constant": eta_k = newton_forcing
  kEisenstatWalker  // "eisenstat_walker": eta_k = gamma (|F_k| / |F_{k-1}|)^2, safeguarded
};
const char* ToString(ForcingTermType type);
bool StringToForcingTermType(const std::string& text, ForcingTermType* type);

enum class CeresLineSearchDirection {
  kLbfgs,       // "lbfgs"
  kNonlinearCg  // "nonlinear_cg" (Polak-Ribiere)
};
const char* ToString(CeresLineSearchDirection direction);
bool StringToCeresLineSearchDirection(const std::string& text, CeresLineSearchDirection* direction);

enum class CeresTrustRegionStrategy {
  kLevenbergMarquardt,  // "levenberg_marquardt"
  kDogleg               // "dogleg"
};
const char* ToString(CeresTrustRegionStrategy strategy);
bool StringToCeresTrustRegionStrategy(const std::string& text, CeresTrustRegionStrategy* strategy);

// ---- iteration callbacks (as in Ceres) ----

enum class CallbackReturnType {
  kContinue,  // go on iterating
  kStop       // end the solve: samples still running get TerminationType::kUserStop
};

// What a callback sees after every iteration of a solve.
struct IterationSummary {
  int iteration = 0;              // iterations completed so far (0 = after Init)
  int active_samples = 0;         // samples still iterating after this iteration
  int converged_samples = 0;      // samples converged so far
  double max_abs_residual = 0.0;  // max over the samples evaluated this iteration
  double max_rel_residual = 0.0;
  int64_t function_evaluations = 0;  // per-sample map evaluations so far
  double elapsed_seconds = 0.0;      // since Init started
};

using IterationCallback = std::function<CallbackReturnType(const IterationSummary&)>;

// ---- options ----

// The largest iteration budget of any solver option (max_iterations,
// stagnation_window, gmres_max_iterations): the bound a command's flag states.
inline constexpr int kMaxSolverIterations = 1 << 20;

struct ForwardSolverOptions {
  ForwardSolverType type = ForwardSolverType::kAnderson;

  // -- stopping (all solvers) --
  // Iterations (solver steps, each taking one or more map evaluations)
  // before a sample ends in kMaxIterations. The map is evaluated at z0 by
  // Init as well, so Picard and Anderson make max_iterations + 1 evaluations
  // per sample when no sample stops early.
  int max_iterations = 40;
  StopMode stop_mode = StopMode::kRelative;
  // Stop when ||f(z) - z||_2 <= absolute_tolerance (state units).
  double absolute_tolerance = 1e-6;
  // Stop when ||f(z) - z||_2 / (||f(z)||_2 + relative_epsilon) <= relative_tolerance.
  double relative_tolerance = 1e-4;
  double relative_epsilon = 1e-9;
  // A sample stagnates when its best residual has not dropped by the factor
  // (1 - stagnation_min_improvement) within stagnation_window iterations.
  // The residual monitored is abs for kAbsolute and kEither, rel for
  // kRelative. 0 disables the check.
  int stagnation_window = 10;
  double stagnation_min_improvement = 1e-3;
  // Protective break: a sample diverges when abs > divergence_factor * abs at
  // z0. 0 disables the check.
  double divergence_factor = 1e4;

  // -- Picard: z <- (1 - tau) z + tau f(z) --
  double picard_damping = 1.0;  // tau in (0, 1]

  // -- Anderson --
  // History columns kept per sample (memory O(anderson_memory * n) per
  // sample, allocated once by Init).
  int anderson_memory = 5;
  // Tikhonov regularisation of the small least-squares problem, relative to
  // its scale: lambda * (trace(H) / m) is added to the diagonal of H, so the
  // same lambda acts alike at every residual size.
  double anderson_lambda = 1e-4;
  // Mixing: z_{k+1} = z_k + beta g_k - (dZ + beta dG) gamma; beta = 1 mixes
  // in the whole map value.
  double anderson_beta = 1.0;
  AndersonType anderson_type = AndersonType::kTypeII;
  // Safeguard: an accelerated step whose abs residual exceeds this factor
  // times the current one is rejected, replaced by the plain mixing step
  // z_k + beta g_k (one extra evaluation) and the history is restarted.
  // Non-finite steps are always rejected this way. 0 disables the factor test.
  double anderson_safeguard_factor = 10.0;

  // -- Broyden (limited memory, on F(z) = f(z) - z with H_0 = -alpha I) --
  int broyden_memory = 10;  // rank-one updates kept; the oldest is dropped when full
  // alpha of the initial inverse Jacobian H_0 = -alpha I (state units per
  // residual unit): the first step is z + alpha F(z). 1 makes it a plain
  // fixed-point step. 0 chooses per sample from z0:
  // alpha = min(1, 0.5 max(||z0||, 1) / ||F(z0)||), so the first step moves
  // at most half of max(||z0||, 1). A stiff map (J_F with eigenvalues far
  // below -1) needs alpha near the inverse of their size, or the first
  // steps overshoot (and a line search cannot shorten them enough).
  double broyden_initial_scale = 1.0;
  BroydenVariant broyden_variant = BroydenVariant::kGood;
  // Armijo backtracking on ||F||^2 along the Broyden direction (extra
  // evaluations per rejected trial). Also used by Newton-Krylov.
  bool broyden_line_search = false;

  // -- line search (Broyden with broyden_line_search, Newton-Krylov) --
  // Accept step length t when ||F(z + t p)||^2 <= (1 - 2 armijo_c t) ||F(z)||^2.
  double armijo_c = 1e-4;
  int line_search_max_backtracks = 8;  // t = 1, 1/2, ..., 2^-max
  double line_search_shrink = 0.5;

  // -- Newton-Krylov --
  int gmres_restart = 20;         // Krylov vectors kept per sample (memory O(restart * n))
  int gmres_max_iterations = 40;  // inner GMRES iterations per Newton step
  ForcingTermType forcing_type = ForcingTermType::kEisenstatWalker;
  // Inner tolerance ||J p + F|| <= eta ||F||: eta for kConstant, the cap for
  // Eisenstat-Walker.
  double newton_forcing = 0.1;
  // Finite-difference Jacobian-vector products, used when the problem has no
  // jvp: J v ~ (f(z + h v) - f(z)) / h with h = step (1 + ||z||) / ||v||.
  // 0 picks sqrt(machine epsilon) of the state's dtype.
  double jvp_finite_difference_step = 0.0;

  // -- Ceres backends --
  CeresLineSearchDirection ceres_line_search_direction = CeresLineSearchDirection::kLbfgs;
  CeresTrustRegionStrategy ceres_trust_region_strategy =
      CeresTrustRegionStrategy::kLevenbergMarquardt;
  // The trust-region backend assembles a dense n x n Jacobian per sample; it
  // refuses (throws) states larger than this.
  int ceres_max_state_size = 1024;

  // -- fallback chain --
  // Solvers tried in order, per sample, after the primary one ends in
  // kDiverged, kNonFinite, kLinearAlgebraFailure, kFailure, or in
  // kMaxIterations / kStagnated with its monitored residual above
  // fallback_residual_threshold. Each starts from the sample's best finite
  // iterate (or z0). Applied by Solve() and SolveFixedPoint(), not by Step().
  std::vector<ForwardSolverType> fallback_chain;
  double fallback_residual_threshold = 1e-3;

  // -- callbacks (not configuration: never read from or written to files) --
  // Called in order after Init and after every Step(); the first kStop ends
  // the solve.
  std::vector<IterationCallback> callbacks;

  // True when the tolerance(s) of stop_mode are 0: no sample can converge,
  // and the stagnation and divergence checks are off, so every sample runs
  // exactly max_iterations iterations unless it turns non-finite, the map
  // fails or a callback stops the solve. The result is honestly reported as
  // kMaxIterations. (This is how a fixed budget such as "Anderson for
  // exactly 16 iterations" is asked for.)
  bool FixedBudget() const;

  // False, with a message naming the field and its value, if any option is
  // out of range (the ranges of Fields()), the fallback chain repeats a
  // solver, or a callback is empty.
  bool IsValid(std::string* error) const;

  // The options as "key: value" lines (callbacks omitted).
  std::string ToString() const;

  // Every configurable field, declared once: its name, range and meaning
  // (framework/option_fields.h). The config keys model.solver.forward.* and
  // model.attention_solver.forward.* are made from it.
  static const OptionFields<ForwardSolverOptions>& Fields();
};

}  // namespace stillpoint
