#include "solvers/solve_tally.h"

#include <limits>

namespace stillpoint {

bool IsFailedTermination(TerminationType type) {
  return type == TerminationType::kNonFinite || type == TerminationType::kDiverged ||
         type == TerminationType::kFailure;
}

void SolveTally::Add(const std::vector<TerminationType>& sample_terminations) {
  if (sample_terminations.empty()) return;
  ++solves;
  bool unconverged = false, failed = false;
  for (TerminationType t : sample_terminations) {
    ++samples;
    ++status_counts[ToString(t)];
    if (t == TerminationType::kConverged) {
      ++converged_samples;
    } else if (t == TerminationType::kInexact) {
      ++inexact_samples;
    } else {
      unconverged = true;
      failed = failed || IsFailedTermination(t);
    }
  }
  unconverged_solves += unconverged;
  failed_solves += failed;
}

void SolveTally::Merge(const SolveTally& other) {
  solves += other.solves;
  unconverged_solves += other.unconverged_solves;
  failed_solves += other.failed_solves;
  samples += other.samples;
  converged_samples += other.converged_samples;
  inexact_samples += other.inexact_samples;
  for (const auto& [status, count] : other.status_counts) status_counts[status] += count;
}

double SolveTally::ConvergedFraction() const {
  const int64_t judged = samples - inexact_samples;
  if (judged <= 0) return std::numeric_limits<double>::quiet_NaN();
  return static_cast<double>(converged_samples) / static_cast<double>(judged);
}

ImplicitOptions TallyingAdjoints(const ImplicitOptions& options,
                                 const std::shared_ptr<ImplicitTally>& tally) {
  ImplicitOptions out = options;
  out.adjoint_observer = [tally, own = options.adjoint_observer](const AdjointSummary& summary) {
    tally->backward.Add(summary.sample_termination);
    if (own) own(summary);
  };
  return out;
}

}  // namespace stillpoint
