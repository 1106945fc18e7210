// Ceres Solver backends, one Ceres solve per sample (sequential: the map is
// not required to be thread-safe).
//
// CeresLbfgsSolver: ceres::GradientProblemSolver (L-BFGS or nonlinear CG,
// with Ceres' line searches) minimising the per-sample energy E of
// problem.energy, whose stationary points are the fixed points (f = z - s
// grad E). Requires problem.energy (Init throws without it).
//
// CeresTrustRegionSolver: a Ceres trust-region solve (Levenberg-Marquardt
// or dogleg, dense QR) of the n equations F(z) = f(z) - z = 0, with the
// dense Jacobian J_f - I assembled column by column from problem.jvp (or
// forward differences). For small states: n <= ceres_max_state_size, else
// Init throws.
//
// Both judge convergence with stillpoint's own rule (ForwardSolverOptions
// stop mode and tolerances) from a Ceres iteration callback, which stops
// Ceres as soon as the rule holds; Ceres' own function/gradient/parameter
// tolerances are set to 0. iterations per sample = Ceres iterations (at most
// max_iterations). A Step() runs Ceres to completion for every active
// sample; user callbacks are called after every Ceres iteration (with that
// sample's numbers) and can stop the solve. A sample that does not meet the
// tolerance ends in kMaxIterations (Ceres NO_CONVERGENCE), kStagnated
// (Ceres stopped on its own), kLinearAlgebraFailure (trust-region FAILURE),
// kNonFinite (the map, energy or Jacobian gave NaN / Inf) or kUserStop.
// Ceres' BriefReport of the last sample solved is appended to the summary
// message. Ceres' glog warnings are muted while it runs (errors still show).
#pragma once

#include <string>
#include <vector>

#include "framework/tensor.h"
#include "solvers/fixed_point_solver.h"

namespace stillpoint {

// Shared plumbing: evaluating f, F and E at Ceres' float64 parameters.
class CeresSolverBase : public FixedPointSolver {
 public:
  explicit CeresSolverBase(const ForwardSolverOptions& options);

  // -- for the Ceres adapters (not for users) --
  // f at params for `sample`, written into fz (n doubles); false if the
  // map failed. Caches the last point.
  bool EvaluateMapAt(int64_t sample, const double* params, double* fz);
  // J_F = J_f - I at params as a dense row-major n x n matrix.
  bool EvaluateJacobianAt(int64_t sample, const double* params, const double* fz, double* jacobian);
  // E and grad E at params.
  bool EvaluateEnergyAt(int64_t sample, const double* params, double* energy, double* gradient);
  // The Ceres iteration callback's decision for `sample` at params: true to
  // stop (converged per stillpoint's rule or a user callback said stop).
  bool ShouldStop(int64_t sample, int ceres_iteration, const double* params);
  void NoteNonFinite() { saw_non_finite_ = true; }

 protected:
  int64_t InitSolver() override;
  void StepSolver() override;
  void FinishSolver(SolverSummary* summary) override;
  bool UsesJvp() const override { return true; }

  // Runs Ceres on one sample from params (in/out). Returns Ceres' brief
  // report; sets *ceres_iterations, *outcome (the termination if
  // stillpoint's rule did not stop Ceres) and *reason (Ceres' termination
  // type and its own message, e.g. "FAILURE: Line search failed: ...").
  virtual std::string RunCeres(int64_t sample,
                               std::vector<double>* params,
                               int* ceres_iterations,
                               TerminationType* outcome,
                               std::string* reason) = 0;

  const char* backend_name_ = "ceres";
  // Why Ceres may stop early for this backend (appended to the message).
  std::string stall_hint_;

 private:
  template <typename T>
  void WriteRow(const double* values, int64_t sample, Tensor* t) const;
  template <typename T>
  void ReadRow(const Tensor& t, int64_t sample, double* values) const;

  Tensor point_;            // [B, n] evaluation point (state dtype)
  Tensor value_;            // [B, n] f at point_
  Tensor unit_;             // [B, n] unit vectors for Jacobian columns
  Tensor column_;           // [B, n] J_f e_j
  Tensor energy_;           // [1]
  Tensor energy_gradient_;  // [1, n]
  std::vector<int64_t> ids_;
  std::vector<double> cache_z_, cache_f_;
  int64_t cache_sample_ = -1;
  bool cache_valid_ = false;
  bool saw_non_finite_ = false;
  bool user_stopped_ = false;
  bool converged_ = false;
  std::string last_report_;
  // Samples Ceres ended on its own before the stopping rule held (reported
  // as STAGNATED), and the first one's Ceres report, for the message.
  int64_t stalled_samples_ = 0;
  int64_t first_stalled_sample_ = -1;
  std::string first_stall_report_;
  std::string first_stall_reason_;
};

class CeresLbfgsSolver : public CeresSolverBase {
 public:
  explicit CeresLbfgsSolver(const ForwardSolverOptions& options);

 protected:
  void ValidateProblem(const FixedPointProblem& problem) const override;
  std::string RunCeres(int64_t sample,
                       std::vector<double>* params,
                       int* ceres_iterations,
                       TerminationType* outcome,
                       std::string* reason) override;
};

class CeresTrustRegionSolver : public CeresSolverBase {
 public:
  explicit CeresTrustRegionSolver(const ForwardSolverOptions& options);

 protected:
  void ValidateProblem(const FixedPointProblem& problem) const override;
  std::string RunCeres(int64_t sample,
                       std::vector<double>* params,
                       int* ceres_iterations,
                       TerminationType* outcome,
                       std::string* reason) override;
};

}  // namespace stillpoint
