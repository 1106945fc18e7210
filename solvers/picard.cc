#include "solvers/picard.h"

#include "framework/parallel.h"

namespace stillpoint {

PicardSolver::PicardSolver(const ForwardSolverOptions& options) : FixedPointSolver(options) {}

int64_t PicardSolver::InitSolver() { return 0; }

void PicardSolver::StepSolver() {
  const int64_t n = state_size();
  const double tau = options().picard_damping;
  const std::vector<int64_t>& samples = active_samples();
  DispatchDType(dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* z = state().template data<T>();
    const T* f = map_value().template data<T>();
    const T t = static_cast<T>(tau);
    const T keep = static_cast<T>(1.0 - tau);
    for (int64_t b : samples) {
      T* zb = z + b * n;
      const T* fb = f + b * n;
      if (tau == 1.0) {
        for (int64_t i = 0; i < n; ++i) zb[i] = fb[i];
      } else {
        for (int64_t i = 0; i < n; ++i) zb[i] = keep * zb[i] + t * fb[i];
      }
    }
  });
  EvaluateRows(samples, state(), &map_value());
}

}  // namespace stillpoint
