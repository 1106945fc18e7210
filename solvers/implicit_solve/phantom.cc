// BackwardMode::kPhantom: after the solve, k damped steps
// z <- (1 - tau) z + tau f(z) from z* (detached) are recorded; the value is
// their result and backward is plain backprop through them.
#include <sstream>

#include "framework/ops.h"
#include "solvers/implicit_solve/modes.h"

namespace stillpoint::implicit {

ImplicitResult SolvePhantom(const ModeInputs& in) {
  const BackwardOptions& backward = in.options.backward;
  ImplicitResult result;
  RecordedEvaluation unused;
  const Tensor z_star_value = SolveForward(in, /*record_at_solution=*/false, &result, &unused);
  if (!in.recording) {
    result.z_star = Var(z_star_value);
    return result;
  }
  const double tau = backward.phantom_tau;
  Var z(z_star_value);
  for (int k = 0; k < backward.phantom_steps; ++k) {
    Var fz = EvaluateCell(in.f, z, in.all_ids);
    z = tau == 1.0 ? fz : add(mul_scalar(z, 1.0 - tau), mul_scalar(fz, tau));
  }
  if (!z.requires_grad()) {
    result.z_star = Var(z.value());
    return result;
  }
  result.backward = std::make_shared<AdjointSummary>();
  std::ostringstream message;
  message << "phantom gradient: backprop through " << backward.phantom_steps
          << " damped steps (tau " << tau << ") from z*; no adjoint equation solved.";
  result.z_star = PassThroughNode(z, BackwardMode::kPhantom, backward.phantom_steps, in.batch, in.n,
                                  message.str(), result.backward);
  return result;
}

}  // namespace stillpoint::implicit
