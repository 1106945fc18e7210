#include "solvers/fallback.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>
#include <vector>

#include "solvers/fixed_point_solver.h"

namespace stillpoint {
namespace {

bool NeedsFallback(const ForwardSolverOptions& options,
                   const SolverSummary& summary,
                   int64_t sample) {
  const double monitored = options.stop_mode == StopMode::kRelative
                               ? summary.sample_rel_residual[sample]
                               : summary.sample_abs_residual[sample];
  switch (summary.sample_termination[sample]) {
    case TerminationType::kDiverged:
    case TerminationType::kNonFinite:
    case TerminationType::kLinearAlgebraFailure:
    case TerminationType::kFailure:
      return true;
    case TerminationType::kMaxIterations:
    case TerminationType::kStagnated:
      return !(monitored <= options.fallback_residual_threshold);
    case TerminationType::kConverged:
    case TerminationType::kInexact:  // never set by the forward solvers
    case TerminationType::kUserStop:
      return false;
  }
  return false;
}

// The problem restricted to `ids` (local sample i is global sample ids[i]).
FixedPointProblem SubProblem(const FixedPointProblem& problem, const std::vector<int64_t>& ids) {
  FixedPointProblem sub;
  sub.batch_size = static_cast<int64_t>(ids.size());
  sub.state_size = problem.state_size;
  auto to_global = [ids](const std::vector<int64_t>& local) {
    std::vector<int64_t> global(local.size());
    for (size_t i = 0; i < local.size(); ++i) global[i] = ids[local[i]];
    return global;
  };
  const BatchedMap map = problem.map;
  sub.map = [map, to_global](const Tensor& z, const std::vector<int64_t>& local, Tensor* out) {
    return map(z, to_global(local), out);
  };
  if (problem.jvp) {
    const BatchedJvp jvp = problem.jvp;
    sub.jvp = [jvp, to_global](const Tensor& z, const Tensor& v, const std::vector<int64_t>& local,
                               Tensor* out) { return jvp(z, v, to_global(local), out); };
  }
  if (problem.energy) {
    const BatchedEnergy energy = problem.energy;
    sub.energy = [energy, to_global](const Tensor& z, const std::vector<int64_t>& local, Tensor* e,
                                     Tensor* g) { return energy(z, to_global(local), e, g); };
  }
  return sub;
}

double Monitored(const ForwardSolverOptions& options, const SolverSummary& s, int64_t sample) {
  return options.stop_mode == StopMode::kRelative ? s.sample_rel_residual[sample]
                                                  : s.sample_abs_residual[sample];
}

}  // namespace

void RunFallbackChain(const ForwardSolverOptions& options,
                      const FixedPointProblem& problem,
                      Tensor* z,
                      SolverSummary* summary) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t batch = summary->batch_size;
  const int64_t n = summary->state_size;
  ForwardSolverType previous = options.type;
  std::ostringstream notes;
  for (ForwardSolverType next : options.fallback_chain) {
    std::vector<int64_t> ids;
    for (int64_t b = 0; b < batch; ++b) {
      if (NeedsFallback(options, *summary, b)) ids.push_back(b);
    }
    if (ids.empty()) break;
    if (next == ForwardSolverType::kCeresLbfgs && !problem.energy) {
      notes << " Fallback " << ToString(next) << " skipped: the problem has no energy.";
      continue;
    }
    if (next == ForwardSolverType::kCeresTrustRegion && n > options.ceres_max_state_size) {
      notes << " Fallback " << ToString(next) << " skipped: state_size " << n
            << " > ceres_max_state_size.";
      continue;
    }
    const int64_t k = static_cast<int64_t>(ids.size());
    Tensor sub_z(Shape{k, n}, z->dtype());
    for (int64_t i = 0; i < k; ++i)
      sub_z.SliceRows(i, i + 1).CopyFrom(z->SliceRows(ids[i], ids[i] + 1));

    ForwardSolverOptions sub_options = options;
    sub_options.type = next;
    sub_options.fallback_chain.clear();
    SolverSummary sub;
    FixedPointSolver::Create(sub_options)->Solve(SubProblem(problem, ids), &sub_z, &sub);

    FallbackRecord record;
    record.from = previous;
    record.to = next;
    record.samples_tried = k;
    for (int64_t i = 0; i < k; ++i) {
      const int64_t b = ids[i];
      summary->sample_iterations[b] += sub.sample_iterations[i];
      const bool converged = sub.sample_termination[i] == TerminationType::kConverged;
      if (converged) ++record.samples_recovered;
      if (converged || Monitored(options, sub, i) < Monitored(options, *summary, b)) {
        z->SliceRows(b, b + 1).CopyFrom(sub_z.SliceRows(i, i + 1));
        summary->sample_abs_residual[b] = sub.sample_abs_residual[i];
        summary->sample_rel_residual[b] = sub.sample_rel_residual[i];
        summary->sample_termination[b] = sub.sample_termination[i];
        summary->sample_solver[b] = next;
      }
    }
    summary->map_calls += sub.map_calls;
    summary->function_evaluations += sub.function_evaluations;
    summary->jvp_evaluations += sub.jvp_evaluations;
    summary->energy_evaluations += sub.energy_evaluations;
    summary->restarts += sub.restarts;
    summary->rejected_steps += sub.rejected_steps;
    summary->history_bytes = std::max(summary->history_bytes, sub.history_bytes);
    summary->fallbacks.push_back(record);
    notes << " Fallback " << ToString(previous) << " -> " << ToString(next) << ": "
          << record.samples_recovered << "/" << k << " sample(s) recovered.";
    previous = next;
  }
  summary->termination_type = TerminationType::kConverged;
  for (TerminationType t : summary->sample_termination) {
    summary->termination_type = std::max(summary->termination_type, t);
  }
  if (!summary->fallbacks.empty()) {
    // The primary's message counted its own outcomes; say where things stand now.
    notes << " Status after fallbacks: " << summary->CountSamples(TerminationType::kConverged)
          << "/" << batch << " samples converged";
    for (TerminationType t :
         {TerminationType::kUserStop, TerminationType::kMaxIterations, TerminationType::kStagnated,
          TerminationType::kDiverged, TerminationType::kLinearAlgebraFailure,
          TerminationType::kNonFinite, TerminationType::kFailure}) {
      const int64_t count = summary->CountSamples(t);
      if (count > 0) notes << ", " << count << " " << ToString(t);
    }
    notes << ".";
  }
  summary->message += notes.str();
  summary->wall_time_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace stillpoint
