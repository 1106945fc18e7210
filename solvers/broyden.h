// Limited-memory Broyden's method on F(z) = f(z) - z, per sample.
//
// An approximate inverse Jacobian H ~ J_F^-1 is kept as
// H = -alpha I + sum_i u_i v_i^T, alpha = broyden_initial_scale (H_0 = -I
// makes the first step a plain fixed-point step; 0 picks alpha per sample,
// see ForwardSolverOptions). Each iteration:
//
//   s = z_k - z_{k-1},  y = F_k - F_{k-1}
//   good:  H += (s - H y) (H^T s)^T / (s^T H y)      (Broyden's first method)
//   bad:   H += (s - H y) y^T / (y^T y)              (Broyden's second method)
//   p = -H F_k,  z_{k+1} = z_k + t p
//
// with t = 1, or t from an Armijo backtracking on ||F||^2 when
// broyden_line_search is on. At most broyden_memory pairs are kept (the
// oldest is overwritten). An update whose denominator vanishes is skipped.
// When the line search finds no acceptable t the memory is reset
// (H = -alpha I) and the step z_k + alpha F_k is taken. Memory: 2 m n values per sample
// (u, v) plus 4 n of workspace, allocated by Init.
#pragma once

#include <vector>

#include "framework/tensor.h"
#include "solvers/fixed_point_solver.h"

namespace stillpoint {

class BroydenSolver : public FixedPointSolver {
 public:
  explicit BroydenSolver(const ForwardSolverOptions& options);

 protected:
  int64_t InitSolver() override;
  void StepSolver() override;
  void FinishSolver(SolverSummary* summary) override;

 private:
  // Updates H with the last step of `sample` and writes its direction
  // p = -H F_k; saves z_k and F_k.
  template <typename T>
  void UpdateAndDirection(int64_t sample);

  int memory_ = 0;
  Tensor u_;           // [B, m, n]
  Tensor v_;           // [B, m, n]
  Tensor previous_z_;  // [B, n] z_k (base of the line search)
  Tensor previous_f_;  // [B, n] F_k = f(z_k) - z_k
  Tensor direction_;   // [B, n] p, also H y during the update
  Tensor scratch_;     // [B, n] the new v during the update
  std::vector<double> alpha_;     // per sample, of H_0 = -alpha I
  bool automatic_scale_ = false;  // broyden_initial_scale 0
  std::vector<int> count_;
  std::vector<int> head_;
  std::vector<char> has_previous_;
  std::vector<char> skipped_;
  std::vector<char> outcome_;
  std::vector<int64_t> reset_;
  int max_pairs_used_ = 0;
  int64_t skipped_updates_ = 0;
  int64_t resets_ = 0;
};

}  // namespace stillpoint
