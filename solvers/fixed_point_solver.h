// The steppable forward solver: finds z_b = f(z_b) for every sample of a
// batched FixedPointProblem (solvers/problem.h).
//
//   auto solver = FixedPointSolver::Create(options);   // one switch over options.type
//   SolverSummary summary;
//   solver->Solve(problem, &z, &summary);              // z: in z0 [B, n], out z* [B, n]
//
// or, to drive single iterations (tests, custom schedules):
//
//   solver->Init(problem, z0);          // evaluates f(z0), judges every sample
//   while (solver->Step()) { ... }      // one iteration of every active sample
//   solver->Finish(&z, &summary);
//
// Per-sample contract. Samples are independent. Each is judged on every
// evaluated iterate (at z0, then after each iteration) and leaves the active
// set as soon as it converges or ends otherwise (solver_summary.h); the map is only
// called on active rows. The state returned for a sample is its converging
// iterate if it converged, else its best (lowest monitored residual) finite
// iterate, else z0; the residuals in the summary are those of the returned
// state. Numerical trouble never throws: it is a TerminationType. Misuse
// (invalid options, wrong shapes or dtypes) throws stillpoint::Error.
//
// The base class owns all stopping and per-sample bookkeeping; a solver only
// says how to make the next iterate (StepSolver).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "framework/tensor.h"
#include "solvers/forward_options.h"
#include "solvers/problem.h"
#include "solvers/solver_summary.h"

namespace stillpoint {

class FixedPointSolver {
 public:
  // Creates the solver that options.type names (one switch over
  // solvers/forward_solver_list.h); throws
  // stillpoint::Error with IsValid's message if the options are invalid.
  static std::unique_ptr<FixedPointSolver> Create(const ForwardSolverOptions& options);

  virtual ~FixedPointSolver();
  FixedPointSolver(const FixedPointSolver&) = delete;
  FixedPointSolver& operator=(const FixedPointSolver&) = delete;

  ForwardSolverType type() const { return options_.type; }
  const ForwardSolverOptions& options() const { return options_; }

  // Starts a solve from z0 ([batch_size, state_size], float32 or float64; the
  // solver computes in that dtype). z0 is copied and never written to or
  // referenced afterwards. Allocates every buffer the solve needs, evaluates
  // f(z0), judges each sample there (a warm start at the solution converges
  // with 0 iterations) and calls the callbacks with iteration 0.
  void Init(const FixedPointProblem& problem, const Tensor& z0);

  // One iteration of every active sample, then judging and callbacks.
  // Returns true while some sample is still active. Does nothing (returns
  // false) when none is.
  bool Step();

  // Ends the solve: samples still active (the caller stopped stepping early)
  // end in kUserStop. Writes the returned state of every sample into *z: into
  // z's own storage if it is defined with shape [B, n] and the solve's
  // dtype, else *z becomes a fresh tensor. Fills *summary completely.
  void Finish(Tensor* z, SolverSummary* summary);

  // Init(problem, *z) + Step() until done + Finish(z, summary), then the
  // fallback chain of options().fallback_chain for the samples that need it.
  // *z must be defined: it is z0 on entry and z* on return (written in place).
  void Solve(const FixedPointProblem& problem, Tensor* z, SolverSummary* summary);

  // -- state of the solve in progress (between Init and Finish) --
  bool initialized() const { return initialized_; }
  int iteration() const { return iteration_; }
  // Samples still iterating, increasing.
  const std::vector<int64_t>& active_samples() const { return active_; }
  // Current iterates and their map values, [B, n]; views of solver storage,
  // valid until the next Init.
  const Tensor& current_state() const { return state_; }
  const Tensor& current_map_value() const { return map_value_; }
  // The state each sample would return if the solve ended now, [B, n].
  const Tensor& returned_state() const { return best_state_; }
  // Termination of finished samples (meaningless while a sample is active).
  TerminationType sample_termination(int64_t sample) const { return termination_[sample]; }
  bool sample_active(int64_t sample) const { return is_active_[sample] != 0; }

 protected:
  explicit FixedPointSolver(const ForwardSolverOptions& options);

  // -- what a solver implements --
  // Called by Init after state() and map_value() hold z0 and f(z0) and the
  // samples have been judged there: allocate the history for problem()
  // (batch_size x state_size, dtype()) and return the bytes it holds.
  virtual int64_t InitSolver() = 0;
  // Advance every sample of active_samples() by one iteration: write its new
  // iterate into its row of state() and f(new iterate) into its row of
  // map_value() (EvaluateRows does the latter). A sample that cannot go on
  // is ended with TerminateSample. The base then judges the rows.
  virtual void StepSolver() = 0;
  // Adds solver-specific notes (option usage, message) to a summary.
  virtual void FinishSolver(SolverSummary* summary) {}
  // Whether the solver calls EvaluateJvpRows (reserves its work buffers).
  virtual bool UsesJvp() const { return false; }
  // Throws stillpoint::Error if the solver cannot work on this problem
  // (called first thing by Init).
  virtual void ValidateProblem(const FixedPointProblem& problem) const {}

  // -- helpers for solvers --
  // sum_i a_i b_i accumulated in float64 (four partial sums, so the loop
  // pipelines; the order is fixed, so results do not depend on threads).
  template <typename T>
  static double Dot(const T* a, const T* b, int64_t n) {
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
      s0 += static_cast<double>(a[i]) * static_cast<double>(b[i]);
      s1 += static_cast<double>(a[i + 1]) * static_cast<double>(b[i + 1]);
      s2 += static_cast<double>(a[i + 2]) * static_cast<double>(b[i + 2]);
      s3 += static_cast<double>(a[i + 3]) * static_cast<double>(b[i + 3]);
    }
    for (; i < n; ++i) s0 += static_cast<double>(a[i]) * static_cast<double>(b[i]);
    return (s0 + s1) + (s2 + s3);
  }
  // a . c and b . c accumulated in float64 with SIMD lanes, reading c once.
  // The order depends only on n, so results do not depend on threads.
  template <typename T>
  static void Dot2(const T* c, const T* a, const T* b, int64_t n, double* ac, double* bc);
  // sum_i (f_i - z_i)^2 and sum_i f_i^2, accumulated in float64 like Dot2.
  template <typename T>
  static void SquaredNorms(const T* z, const T* f, int64_t n, double* residual_sq, double* map_sq);

  const FixedPointProblem& problem() const { return problem_; }
  DType dtype() const { return state_.dtype(); }
  int64_t batch_size() const { return problem_.batch_size; }
  int64_t state_size() const { return problem_.state_size; }
  // The fewest rows a ParallelFor task over whole states should get: an
  // elementwise chunk's worth of entries, so small states stay inline.
  int64_t MinRowsPerTask() const;
  Tensor& state() { return state_; }
  Tensor& map_value() { return map_value_; }
  // Residuals of the current iterate as judged at the end of the last step
  // (LineSearch overwrites them with those of its trials).
  double sample_abs_residual(int64_t sample) const { return abs_residual_[sample]; }
  double sample_rel_residual(int64_t sample) const { return rel_residual_[sample]; }
  double sample_map_norm(int64_t sample) const { return map_norm_[sample]; }

  // Evaluates f at the rows `samples` (increasing, a subset of 0..B-1) of z
  // ([B, n]) into the same rows of *out ([B, n]); other rows are untouched.
  // No allocation after Init. On failure of the map every sample in the
  // call ends in kFailure and false is returned.
  bool EvaluateRows(const std::vector<int64_t>& samples, const Tensor& z, Tensor* out);
  // J_f(z) v for the rows `samples`, from problem().jvp if given, else by a
  // forward difference that uses fz = f(z) ([B, n], already known):
  // (f(z + h v) - fz) / h, h = jvp_finite_difference_step (1 + |z|) / |v|.
  // Only for solvers whose UsesJvp() is true. On failure as EvaluateRows.
  bool EvaluateJvpRows(const std::vector<int64_t>& samples,
                       const Tensor& z,
                       const Tensor& fz,
                       const Tensor& v,
                       Tensor* out);
  // Backtracking (Armijo) line search, per sample: for every sample in
  // `samples` tries z = base_z + t d for t = 1, line_search_shrink, ... (at
  // most line_search_max_backtracks shrinks) until
  //   ||F(z)||^2 <= (1 - 2 armijo_c t) base_residual^2,
  // where base_residual is the sample's current abs residual (that of
  // base_z). The last trial is left in state() / map_value(). Per sample,
  // (*outcome)[b] is 0 when accepted, 1 when every trial was finite but
  // none decreased enough, 2 when some trial was non-finite and none was
  // accepted. base_z and direction are [B, n]; no allocation after Init.
  void LineSearch(const std::vector<int64_t>& samples,
                  const Tensor& base_z,
                  const Tensor& direction,
                  std::vector<char>* outcome);

  // Ends a sample (it leaves the active set after this step's judging). The
  // base still judges its row this step unless type is kFailure, and a row
  // that meets the tolerance is reported kConverged.
  void TerminateSample(int64_t sample, TerminationType type);
  // For solvers that count iterations themselves (Ceres): the steps the
  // sample has taken in total.
  void SetSampleIterations(int64_t sample, int iterations) {
    sample_iterations_[sample] = iterations;
  }
  void AddRestarts(int64_t count) { restarts_ += count; }
  void AddRejectedSteps(int64_t count) { rejected_steps_ += count; }
  void AddEnergyEvaluations(int64_t rows) { energy_evaluations_ += rows; }
  void AddOptionUsage(OptionUsage usage) { solver_option_usage_.push_back(std::move(usage)); }
  void AppendMessage(const std::string& text);
  // Why this solver's STAGNATED samples stopped, when it is not the base's
  // stagnation window (e.g. Ceres ending a solve by its own rules): the
  // summary message names this instead of the window.
  void SetStagnationNote(const std::string& note) { stagnation_note_ = note; }
  int64_t function_evaluations() const { return function_evaluations_; }
  double ElapsedSeconds() const;
  // Whether residuals meet the tolerance of the stop mode (never in a
  // fixed-budget solve).
  bool MeetsTolerance(double abs_residual, double rel_residual) const;
  // sqrt(machine epsilon) of dtype(), or the option if set.
  double FiniteDifferenceStep() const;

 private:
  // Judges the rows of `samples` after Init / a step: residuals, best
  // iterate, convergence and the other stopping rules, traces.
  void JudgeSamples(const std::vector<int64_t>& samples);
  void ComputeResiduals(int64_t sample);
  void EndSample(int64_t sample, TerminationType type);
  void RunCallbacks();
  double Monitored(int64_t sample) const;
  int64_t BaseBytes() const;
  // problem_.map on compact rows, with counting and output checks.
  bool CallMap(const std::vector<int64_t>& samples, const Tensor& z, Tensor* out);

  ForwardSolverOptions options_;
  FixedPointProblem problem_;
  bool initialized_ = false;
  bool stopped_by_callback_ = false;
  int iteration_ = 0;
  std::chrono::steady_clock::time_point start_time_;

  Tensor state_;       // [B, n] current iterate per sample
  Tensor map_value_;   // [B, n] f(current iterate)
  Tensor best_state_;  // [B, n] returned state per sample
  Tensor gather_in_;   // [B, n] compacted rows for partial map calls
  Tensor gather_aux_;  // [B, n] second input of jvp calls (UsesJvp only)
  Tensor gather_out_;  // [B, n]
  // Views of the first k rows of the gather buffers, k = 0..B, made by Init
  // (Tensor::SliceRows allocates, and the inner loop must not).
  std::vector<Tensor> gather_in_rows_, gather_aux_rows_, gather_out_rows_;
  std::vector<int64_t> active_;        // increasing
  std::vector<int64_t> step_samples_;  // active at the start of the step
  std::vector<double> fd_step_;        // per-sample finite-difference step of the last jvp
  // Line search state.
  std::vector<double> search_step_;
  std::vector<double> search_base_;
  std::vector<int> search_backtracks_;
  std::vector<char> search_non_finite_;
  std::vector<int64_t> search_pending_, search_next_;
  int64_t converged_count_ = 0;
  std::vector<char> is_active_;
  std::vector<char> failed_this_step_;

  // Per sample.
  std::vector<double> abs_residual_, rel_residual_, map_norm_;  // current iterate
  std::vector<double> best_abs_, best_rel_, best_monitored_;    // returned state
  std::vector<int64_t> improved_;  // samples whose state becomes the returned one (capacity B)
  std::vector<double> initial_abs_;
  std::vector<double> stagnation_reference_;
  std::vector<int> stagnation_since_;
  // The monitored residual of the previous judged iterate, and how many
  // judged iterates in a row it has risen (for kDiverged by growth).
  std::vector<double> previous_monitored_;
  std::vector<int> consecutive_rises_;
  int64_t diverged_by_growth_ = 0;
  std::vector<int> sample_iterations_;
  std::vector<TerminationType> termination_;
  std::vector<TerminationType> pending_termination_;  // set by TerminateSample
  std::vector<char> has_pending_;

  std::vector<double> abs_trace_, rel_trace_;
  int64_t map_calls_ = 0;
  int64_t function_evaluations_ = 0;
  int64_t jvp_evaluations_ = 0;
  int64_t energy_evaluations_ = 0;
  int64_t restarts_ = 0;
  int64_t rejected_steps_ = 0;
  int64_t history_bytes_ = 0;
  std::vector<OptionUsage> solver_option_usage_;
  std::string solver_message_;
  std::string stagnation_note_;

  friend class FixedPointSolverTestPeer;
};

// The factory of each solver, one per line of solvers/forward_solver_list.h,
// each defined in its solver's .cc (e.g. CreatePicardSolver in picard.cc).
// FixedPointSolver::Create calls the one options.type names; calling one
// directly builds that solver whatever options.type says.
#define SP_DECLARE_FORWARD_SOLVER_FACTORY(value, name, factory) \
  std::unique_ptr<FixedPointSolver> factory(const ForwardSolverOptions& options);
SP_FORWARD_SOLVERS(SP_DECLARE_FORWARD_SOLVER_FACTORY)
#undef SP_DECLARE_FORWARD_SOLVER_FACTORY

// Create(options)->Solve(problem, z, &summary); returns the summary.
SolverSummary SolveFixedPoint(const ForwardSolverOptions& options,
                              const FixedPointProblem& problem,
                              Tensor* z);

}  // namespace stillpoint
