// Inexact Newton-Krylov on F(z) = f(z) - z, per sample.
//
// Each iteration solves J_F(z_k) p = -F(z_k), J_F = J_f - I, approximately
// by restarted GMRES (matrix-free: one Jacobian-vector product of f per
// inner iteration, from problem.jvp or by forward differences, see
// ForwardSolverOptions::jvp_finite_difference_step), to the inexact-Newton
// tolerance ||J_F p + F|| <= eta_k ||F||. eta_k is newton_forcing
// (kConstant) or Eisenstat-Walker's choice 2, 0.9 (|F_k| / |F_{k-1}|)^2,
// safeguarded and capped at newton_forcing. The step is then globalised by
// an Armijo backtracking line search on ||F||^2.
//
// Outcomes beyond the base rules: a line search that cannot decrease ||F||
// ends the sample in kStagnated (kLinearAlgebraFailure if GMRES had not
// reached its tolerance either, kNonFinite if the trials were NaN); a NaN
// Jacobian-vector product ends it in kNonFinite. Samples run their GMRES
// iterations in lockstep, one batched JVP call per inner iteration.
//
// Memory per sample: (gmres_restart + 1) n for the Krylov basis plus 5 n of
// workspace, and O(restart^2) doubles; allocated by Init. For small and
// medium states (each inner iteration costs one map evaluation).
#pragma once

#include <vector>

#include "framework/tensor.h"
#include "solvers/fixed_point_solver.h"

namespace stillpoint {

class NewtonKrylovSolver : public FixedPointSolver {
 public:
  explicit NewtonKrylovSolver(const ForwardSolverOptions& options);

 protected:
  int64_t InitSolver() override;
  void StepSolver() override;
  void FinishSolver(SolverSummary* summary) override;
  bool UsesJvp() const override { return true; }

 private:
  enum class Phase : char { kArnoldi, kRestart, kDone };

  // Starts a GMRES cycle of `sample` from residual r (in jvp_out_ row, or
  // -F when x = 0).
  template <typename T>
  void StartCycle(int64_t sample, bool from_zero);
  // One Arnoldi step with w = J_F V_j in jvp_out_; decides what comes next.
  template <typename T>
  void ArnoldiStep(int64_t sample);
  // x += V y for the current cycle.
  template <typename T>
  void UpdateSolution(int64_t sample);

  int restart_ = 0;
  Tensor basis_;                         // [B, restart + 1, n]
  Tensor base_z_;                        // [B, n] z_k
  Tensor base_f_;                        // [B, n] f(z_k)
  Tensor solution_;                      // [B, n] GMRES iterate x (the Newton direction)
  Tensor jvp_in_;                        // [B, n]
  Tensor jvp_out_;                       // [B, n]
  std::vector<double> hessenberg_;       // [B][(restart + 1) * restart], column-major
  std::vector<double> cosines_, sines_;  // [B][restart]
  std::vector<double> rhs_;              // [B][restart + 1]
  std::vector<int> inner_;               // Arnoldi steps in the current cycle
  std::vector<int> total_inner_;         // in this Newton step
  std::vector<double> residual_norm_;    // ||F(z_k)||
  std::vector<double> previous_norm_;    // ||F(z_{k-1})||, 0 before the first step
  std::vector<double> eta_;
  std::vector<char> gmres_converged_;
  std::vector<char> non_finite_;
  std::vector<Phase> phase_;
  std::vector<char> outcome_;
  std::vector<int64_t> list_, next_, ok_;
  int64_t inner_iterations_ = 0;
  int64_t gmres_failures_ = 0;
};

}  // namespace stillpoint
