#include "training/solver_stats.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <memory>
#include <vector>

#include "solvers/solver_summary.h"

namespace stillpoint {
namespace {

// The tolerance of the relative residual the statistics report: known when
// the solve was judged by it alone (stop mode relative), else 0.
double RelativeTolerance(const ForwardSolverOptions& forward) {
  return forward.stop_mode == StopMode::kRelative ? forward.relative_tolerance : 0.0;
}

template <typename Summary>
SolverStats StatsOf(const Summary& summary,
                    const std::vector<int>& iterations,
                    const std::vector<TerminationType>& terminations,
                    double tolerance) {
  SolverStats stats;
  if (iterations.empty()) return stats;
  double total = 0;
  for (int it : iterations) {
    total += it;
    stats.iterations_max = std::max<double>(stats.iterations_max, it);
  }
  stats.iterations_mean = total / static_cast<double>(iterations.size());
  // No residual measured (an inexact backward mode) is NaN, never 0.
  stats.residual_max = summary.sample_rel_residual.empty()
                           ? std::numeric_limits<double>::quiet_NaN()
                           : summary.MaxRelResidual();
  stats.tolerance = tolerance;
  for (TerminationType t : terminations) {
    if (t == TerminationType::kConverged) {
      ++stats.converged;
    } else if (t == TerminationType::kInexact) {
      ++stats.inexact;
    } else {
      ++stats.not_converged;
    }
    ++stats.status_counts[ToString(t)];
  }
  stats.brief = summary.BriefReport();
  return stats;
}

}  // namespace

void SolverStats::Merge(const SolverStats& other) {
  const int64_t mine = converged + not_converged + inexact;
  const int64_t theirs = other.converged + other.not_converged + other.inexact;
  if (theirs == 0) return;
  if (mine == 0) {
    const std::string own_brief = brief;
    *this = other;
    if (!own_brief.empty()) brief = own_brief;
    return;
  }
  iterations_mean = (iterations_mean * static_cast<double>(mine) +
                     other.iterations_mean * static_cast<double>(theirs)) /
                    static_cast<double>(mine + theirs);
  iterations_max = std::max(iterations_max, other.iterations_max);
  if (other.HasResidual()) {
    residual_max = HasResidual() ? std::max(residual_max, other.residual_max) : other.residual_max;
  }
  tolerance = std::max(tolerance, other.tolerance);
  converged += other.converged;
  not_converged += other.not_converged;
  inexact += other.inexact;
  for (const auto& [status, count] : other.status_counts) status_counts[status] += count;
  if (brief.empty()) brief = other.brief;
}

SolverStats ForwardStats(const SequenceModel& model) {
  const Implicit* layer = model.implicit();
  if (!layer || model.depth_override() > 0) return {};
  const SolverSummary& s = layer->forward_summary();
  return StatsOf(s, s.sample_iterations, s.sample_termination,
                 RelativeTolerance(layer->options().forward));
}

SolverStats BackwardStats(const SequenceModel& model) {
  const Implicit* layer = model.implicit();
  if (!layer || model.depth_override() > 0 || !layer->backward_summary()) return {};
  const AdjointSummary& s = *layer->backward_summary();
  return StatsOf(s, s.sample_iterations, s.sample_termination, s.tolerance);
}

std::string ResidualCell(const SolverStats& stats) {
  if (stats.converged + stats.not_converged + stats.inexact == 0) return "-";
  if (!stats.HasResidual()) return "n/a";
  char buffer[96];
  if (stats.tolerance <= 0) {
    std::snprintf(buffer, sizeof(buffer), "%.2e", stats.residual_max);
  } else if (stats.ToleranceMissed()) {
    std::snprintf(buffer, sizeof(buffer), "%.2e > %.0e NOT MET", stats.residual_max,
                  stats.tolerance);
  } else {
    std::snprintf(buffer, sizeof(buffer), "%.2e <= %.0e", stats.residual_max, stats.tolerance);
  }
  return buffer;
}

std::string StatusCell(const SolverStats& stats) {
  if (stats.status_counts.empty()) return "-";
  // In the order of TerminationType (best first), not alphabetically.
  std::string out;
  for (int t = 0; t <= static_cast<int>(TerminationType::kFailure); ++t) {
    const auto it = stats.status_counts.find(ToString(static_cast<TerminationType>(t)));
    if (it == stats.status_counts.end()) continue;
    if (!out.empty()) out += ", ";
    out += it->first + " " + std::to_string(it->second);
  }
  return out;
}

namespace {

// The solver statistics of several solves as one: mean of the means, worst
// maxima and residuals (NaN when no part measured one), counts added, the
// brief of the worst.
SolverStats Combine(const std::vector<SolverStats>& parts) {
  SolverStats all;
  if (parts.empty()) return all;
  all.residual_max = std::numeric_limits<double>::quiet_NaN();
  for (const SolverStats& p : parts) {
    all.iterations_mean += p.iterations_mean / static_cast<double>(parts.size());
    all.iterations_max = std::max(all.iterations_max, p.iterations_max);
    if (p.HasResidual() && (!all.HasResidual() || p.residual_max >= all.residual_max)) {
      all.residual_max = p.residual_max;
      all.brief = p.brief;
    } else if (all.brief.empty()) {
      all.brief = p.brief;
    }
    all.tolerance = std::max(all.tolerance, p.tolerance);
    all.converged += p.converged;
    all.not_converged += p.not_converged;
    all.inexact += p.inexact;
    for (const auto& [status, count] : p.status_counts) all.status_counts[status] += count;
  }
  return all;
}

}  // namespace

SolverStats AttentionForwardStats(const SequenceModel& model) {
  std::vector<SolverStats> parts;
  auto add = [&parts](const SolverSummary& s, const ForwardSolverOptions& options) {
    if (s.sample_iterations.empty()) return;
    parts.push_back(
        StatsOf(s, s.sample_iterations, s.sample_termination, RelativeTolerance(options)));
  };
  for (const auto& [name, attention] : FindEnergyAttentions(model)) {
    add(attention->implicit().forward_summary(), attention->implicit().options().forward);
  }
  for (const auto& [name, hopfield] : model.HopfieldReadouts()) {
    const EnergySolveReport& report = hopfield->last_solve();
    if (report.mode == EnergySolveMode::kFixedPoint) {
      add(report.implicit.forward, hopfield->options().solve.implicit.forward);
    }
  }
  return Combine(parts);
}

SolverStats AttentionBackwardStats(const SequenceModel& model) {
  std::vector<SolverStats> parts;
  auto add = [&parts](const std::shared_ptr<const AdjointSummary>& s) {
    if (s && !s->sample_iterations.empty()) {
      parts.push_back(StatsOf(*s, s->sample_iterations, s->sample_termination, s->tolerance));
    }
  };
  for (const auto& [name, attention] : FindEnergyAttentions(model)) {
    add(attention->implicit().backward_summary());
  }
  for (const auto& [name, hopfield] : model.HopfieldReadouts()) {
    add(hopfield->last_solve().implicit.backward);
  }
  return Combine(parts);
}

}  // namespace stillpoint
