#include "solvers/adjoint/sample_loop.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace stillpoint::adjoint {

SampleState::SampleState(const RowMatrix& g, double tolerance) {
  const int64_t batch = g.rows();
  g_norm.resize(batch);
  threshold.resize(batch);
  iterations.assign(batch, 0);
  termination.assign(batch, TerminationType::kMaxIterations);
  active.assign(batch, 1);
  for (int64_t b = 0; b < batch; ++b) {
    g_norm[b] = g.row(b).norm();
    threshold[b] = tolerance * g_norm[b];
  }
}

bool SampleState::AnyActive() const {
  return std::any_of(active.begin(), active.end(), [](char a) { return a != 0; });
}

void SampleState::End(int64_t b, TerminationType type) {
  active[b] = 0;
  termination[b] = type;
}

void TraceActive(const SampleState& samples,
                 const std::vector<double>& residual,
                 AdjointSummary* summary) {
  double worst = 0.0;
  bool any = false;
  for (size_t b = 0; b < residual.size(); ++b) {
    if (!samples.active[b]) continue;
    any = true;
    worst = std::max(worst, samples.Relative(b, residual[b]));
  }
  if (any) summary->rel_residual_trace.push_back(worst);
}

void RunSampleLoop(const SampleLoopRules& rules,
                   SampleState* samples,
                   const std::vector<double>& residual,
                   AdjointSummary* summary,
                   const std::function<void()>& measure,
                   const std::function<void()>& step) {
  const int64_t batch = static_cast<int64_t>(samples->active.size());
  const auto budget_spent = [&](int64_t b) {
    return samples->iterations[b] >= rules.max_iterations;
  };
  while (true) {
    if (rules.budget_before_measure) {
      for (int64_t b = 0; b < batch; ++b) {
        if (samples->active[b] && budget_spent(b)) {
          samples->End(b, TerminationType::kMaxIterations);
        }
      }
      if (!samples->AnyActive()) break;
    }
    if (measure) measure();
    for (int64_t b = 0; b < batch; ++b) {
      if (!samples->active[b]) continue;
      const bool may_converge = !rules.may_converge || rules.may_converge(b);
      if (!std::isfinite(residual[b])) {
        samples->End(b, TerminationType::kNonFinite);
      } else if (may_converge && samples->Meets(b, residual[b])) {
        samples->End(b, TerminationType::kConverged);
      } else if (budget_spent(b)) {
        samples->End(b, TerminationType::kMaxIterations);
      }
    }
    if (!samples->AnyActive()) break;
    TraceActive(*samples, residual, summary);
    step();
  }
}

void Finalize(AdjointOperator* op,
              const RowMatrix& g,
              const RowMatrix* residual,
              SampleState* samples,
              RowMatrix* w,
              AdjointSummary* summary) {
  const int64_t batch = g.rows();
  RowMatrix r(g.rows(), g.cols());
  if (residual != nullptr) {
    r = *residual;
  } else {
    op->Apply(*w, &r);
    r = g - r;
  }
  std::vector<char> replaced(batch, 0);
  bool any_replaced = false;
  for (int64_t b = 0; b < batch; ++b) {
    if (!w->row(b).allFinite() || !r.row(b).allFinite()) {
      w->row(b) = g.row(b);
      replaced[b] = 1;
      any_replaced = true;
    }
  }
  if (any_replaced) {
    op->Apply(*w, &r);
    r = g - r;
  }
  summary->sample_abs_residual.resize(batch);
  summary->sample_rel_residual.resize(batch);
  summary->sample_termination.resize(batch);
  int64_t estimate_disagreed = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const double abs_residual = r.row(b).norm();
    summary->sample_abs_residual[b] = abs_residual;
    summary->sample_rel_residual[b] = samples->Relative(b, abs_residual);
    TerminationType type = samples->termination[b];
    if (replaced[b]) {
      type = TerminationType::kNonFinite;
    } else if (samples->Meets(b, abs_residual) &&
               (samples->threshold[b] > 0.0 || samples->g_norm[b] == 0.0)) {
      // At tolerance 0 (a fixed budget) a residual of exactly 0 in the
      // VJP's precision does not turn a spent budget into a convergence;
      // the solver's own verdict stands.
      type = TerminationType::kConverged;
    } else if (type == TerminationType::kConverged && samples->threshold[b] > 0.0) {
      // A recurrence (CG, MINRES) estimated convergence that the true
      // residual does not confirm (rounding). At tolerance 0 only an exact
      // method (dense LU) says CONVERGED, and its word stands: its residual
      // is rounding, not a missed tolerance.
      type = TerminationType::kMaxIterations;
      ++estimate_disagreed;
    }
    summary->sample_termination[b] = type;
  }
  summary->sample_iterations = samples->iterations;
  if (estimate_disagreed > 0) {
    summary->message += " " + std::to_string(estimate_disagreed) +
                        " sample(s) met the tolerance by the solver's residual estimate but not "
                        "by the true residual.";
  }
  if (any_replaced) {
    summary->message +=
        " Non-finite adjoint solutions were replaced by g (the Jacobian-free "
        "gradient) for " +
        std::to_string(std::count(replaced.begin(), replaced.end(), 1)) + " sample(s).";
  }
}

}  // namespace stillpoint::adjoint
