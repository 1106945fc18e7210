#include "solvers/picard.h"

#include <algorithm>

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
    // Rows spread over the threads (a W2 adjoint step moves a whole [8, 16384]
    // state).
    ParallelFor(0, static_cast<int64_t>(samples.size()), MinRowsPerTask(),
                [&](int64_t lo, int64_t hi) {
                  for (int64_t i = lo; i < hi; ++i) {
                    T* zb = z + samples[i] * n;
                    const T* fb = f + samples[i] * n;
                    if (tau == 1.0) {
                      std::copy(fb, fb + n, zb);
                    } else {
                      for (int64_t j = 0; j < n; ++j) zb[j] = keep * zb[j] + t * fb[j];
                    }
                  }
                });
  });
  EvaluateRows(samples, state(), &map_value());
}

std::unique_ptr<FixedPointSolver> CreatePicardSolver(const ForwardSolverOptions& options) {
  return std::make_unique<PicardSolver>(options);
}

}  // namespace stillpoint
