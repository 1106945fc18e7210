// The fallback chain (ForwardSolverOptions::fallback_chain), applied per
// sample after a solve.
//
// A sample is handed to the next solver of the chain when it ended in
// kDiverged, kNonFinite, kLinearAlgebraFailure or kFailure, or in
// kMaxIterations / kStagnated with its monitored residual (rel for
// StopMode::kRelative, else abs) above fallback_residual_threshold. The next
// solver starts from the sample's returned state (its best finite iterate,
// or z0), with the same options (type replaced, no further chain), on a
// sub-problem of just those samples (the map still sees the original sample
// ids). Per sample, the fallback's result replaces the previous one when it
// converged or has a lower monitored residual; the sample's termination,
// residuals and solver in the summary are those of the state kept. The
// chain stops early when no sample needs it. Links that cannot run on the
// problem (ceres_lbfgs without an energy, ceres_trust_region above
// ceres_max_state_size) are skipped and said so in the message.
//
// Effort counters, iterations and wall time add up over the chain; the
// residual traces are those of the primary solve; history_bytes is the
// largest of the solves.
#pragma once

#include "framework/tensor.h"
#include "solvers/forward_options.h"
#include "solvers/problem.h"
#include "solvers/solver_summary.h"

namespace stillpoint {

// z: [B, n], the primary solve's returned states (updated in place);
// summary: the primary solve's summary (updated).
void RunFallbackChain(const ForwardSolverOptions& options,
                      const FixedPointProblem& problem,
                      Tensor* z,
                      SolverSummary* summary);

}  // namespace stillpoint
