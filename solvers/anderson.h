// Anderson acceleration (Walker & Ni's form), per sample, on g(z) = f(z) - z.
//
// With the last m_k <= m differences dZ = [z_{i+1} - z_i], dG = [g_{i+1} - g_i]
// (columns, n x m_k):
//
//   type II: gamma = argmin ||g_k - dG gamma||^2, i.e. (dG^T dG + reg I) gamma = dG^T g_k
//   type I:  (dZ^T dG + reg I) gamma = dZ^T g_k
//   z_{k+1} = z_k + beta g_k - (dZ + beta dG) gamma
//
// reg = lambda * trace(dG^T dG) / m_k (type I: lambda ||dZ||_F ||dG||_F / m_k),
// so the Tikhonov term scales with the history. The m_k x m_k system is
// formed and solved in float64 with a column-pivoting QR of fixed maximum
// size (no heap use; a rank-deficient history gives the basic solution, never
// a failure). Inner products are kept in an incrementally updated Gram
// matrix: O(m n) work per iteration and sample, besides the map.
//
// Safeguard: a step whose residual comes out non-finite, or larger than
// anderson_safeguard_factor times the current one, is replaced by the plain
// mixing step z_k + beta g_k (one more evaluation) and the history restarts.
//
// Memory: 2 m n values per sample for dZ and dG, plus 2 n for the previous
// iterate and residual, all allocated by Init; Step allocates nothing.
#pragma once

#include <vector>

#include "framework/tensor.h"
#include "solvers/fixed_point_solver.h"

namespace stillpoint {

class AndersonSolver : public FixedPointSolver {
 public:
  // Largest anderson_memory supported (the small solve uses fixed-size storage).
  static constexpr int kMaxMemory = 64;

  explicit AndersonSolver(const ForwardSolverOptions& options);

 protected:
  int64_t InitSolver() override;
  void StepSolver() override;
  void FinishSolver(SolverSummary* summary) override;

 private:
  // Updates the history of one sample with its current iterate and computes
  // its next iterate into state(); returns whether the step is accelerated
  // (m_k > 0).
  template <typename T>
  bool ProposeStep(int64_t sample);
  template <typename T>
  void PlainStep(int64_t sample);
  void RestartHistory(int64_t sample);

  int memory_ = 0;
  Tensor dz_;                    // [B, m, n] dZ (type II: dZ + beta dG)
  Tensor dg_;                    // [B, m, n]
  Tensor prev_z_;                // [B, n] z_k of the last step
  Tensor prev_g_;                // [B, n] g_k of the last step
  std::vector<double> gram_gg_;  // [B][m][m] dG^T dG
  std::vector<double> gram_zg_;  // [B][m][m] dZ^T dG (type I)
  std::vector<double> norm_zz_;  // [B][m] |dZ_i|^2 (type I)
  std::vector<int> count_;       // columns in use per sample
  std::vector<int> head_;        // next column to overwrite
  std::vector<char> has_prev_;
  std::vector<char> accelerated_;
  std::vector<char> rejected_flag_;
  std::vector<double> previous_abs_;  // ||g_k|| before the step
  std::vector<int64_t> rejected_;     // samples whose step the safeguard replaced
  int max_columns_used_ = 0;
  int64_t linear_algebra_restarts_ = 0;
};

}  // namespace stillpoint
