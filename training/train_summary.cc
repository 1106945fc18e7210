#include "training/train_summary.h"

#include <iomanip>
#include <sstream>

namespace stillpoint {

std::string TrainSummary::BriefReport() const {
  std::ostringstream out;
  out << std::fixed << std::setprecision(4) << "steps " << steps << ", train loss "
      << final_train_loss;
  if (final_eval.examples > 0) {
    out << ", test loss " << final_eval.loss;
    if (language_model) out << " nats/char (" << test_bpc << " bpc)";
    out << ", test accuracy " << std::setprecision(2) << 100.0 * final_eval.accuracy << "%";
  } else {
    out << ", no evaluation ran";
  }
  out << ", " << std::setprecision(1) << 1000.0 * seconds_per_step << " ms/step, peak RSS "
      << peak_rss_mb << " MiB";
  if (forward.iterations_max > 0) {
    out << ", forward iterations " << forward.iterations_mean << " (max " << forward.iterations_max
        << ")";
  }
  if (skipped_steps > 0) out << ", " << skipped_steps << " skipped steps";
  if (equilibrium.applies) out << ", equilibrium " << VerdictCell(equilibrium.verdict);
  if (stopped_early) out << " [stopped: " << stop_reason << "]";
  if (stop_signal != 0) out << " [" << stop_reason << "]";
  return out.str();
}

}  // namespace stillpoint
