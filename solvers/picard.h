// Damped fixed-point (Picard) iteration:
//
//   z_{k+1} = (1 - tau) z_k + tau f(z_k),   tau = options.picard_damping in (0, 1].
//
// One map evaluation per iteration, no history (memory: the base buffers
// only). Converges linearly at rate |1 - tau + tau lambda| for a contraction;
// damping (tau < 1) can tame maps whose Jacobian has eigenvalues near -1.
#pragma once

#include "solvers/fixed_point_solver.h"

namespace stillpoint {

class PicardSolver : public FixedPointSolver {
 public:
  explicit PicardSolver(const ForwardSolverOptions& options);

 protected:
  int64_t InitSolver() override;
  void StepSolver() override;
};

}  // namespace stillpoint
