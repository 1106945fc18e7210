// Per-sample bookkeeping of the adjoint solvers that work on float64 rows,
// the one loop they all run (judge each sample, trace, iterate) and the
// final true-residual check (internal to the adjoint solvers).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "solvers/adjoint.h"
#include "solvers/adjoint/operator.h"

namespace stillpoint::adjoint {

struct SampleState {
  std::vector<double> g_norm;     // ||g_b||
  std::vector<double> threshold;  // tolerance * ||g_b||
  std::vector<int> iterations;
  std::vector<TerminationType> termination;  // provisional until Finalize
  std::vector<char> active;

  SampleState(const RowMatrix& g, double tolerance);

  bool AnyActive() const;
  void End(int64_t b, TerminationType type);
  double Relative(int64_t b, double residual) const {
    return g_norm[b] > 0 ? residual / g_norm[b] : residual;
  }
  // Whether a residual meets the tolerance (0 never does, as in the forward
  // solvers: tolerance 0 asks for a fixed budget).
  // An exact solution (residual 0) always counts.
  bool Meets(int64_t b, double residual) const {
    if (residual == 0.0) return true;
    return threshold[b] > 0.0 && residual <= threshold[b];
  }
};

// Appends to the summary's trace the largest relative residual over the
// samples still active (nothing when none is).
void TraceActive(const SampleState& samples,
                 const std::vector<double>& residual,
                 AdjointSummary* summary);

// How RunSampleLoop judges the samples.
struct SampleLoopRules {
  // Iterations a sample may take; one that has taken them ends
  // kMaxIterations.
  int max_iterations = 0;
  // Judge the budget before measuring: for a solver whose measurement costs
  // a VJP that the sample would not use (Neumann), a sample that has spent
  // its budget ends before the measurement. Otherwise it is judged after,
  // so a last step that met the tolerance counts as converged.
  bool budget_before_measure = false;
  // Whether sample b may end kConverged by meeting the tolerance; null: every
  // sample may.
  std::function<bool(int64_t b)> may_converge;
};

// The loop of the iterative float64 solvers. Until no sample is active:
//   measure()  refreshes residual[b] (||g_b - (I - J_b^T) w_b||, or the
//              solver's estimate of it) of the active samples (may be null
//              when `step` keeps residual up to date);
//   judge      ends each active sample: kNonFinite for a non-finite
//              residual, kConverged when it meets the tolerance, kMaxIterations
//              when it has spent rules.max_iterations;
//   trace      records the worst relative residual of those still active;
//   step()     advances the active samples by one iteration (a restart cycle
//              for GMRES), counting samples->iterations.
void RunSampleLoop(const SampleLoopRules& rules,
                   SampleState* samples,
                   const std::vector<double>& residual,
                   AdjointSummary* summary,
                   const std::function<void()>& measure,
                   const std::function<void()>& step);

// Computes the true residual of every sample (one VJP unless `residual`
// already holds g - (I - J^T) w), replaces non-finite solutions by g and
// fills the per-sample part of the summary.
void Finalize(AdjointOperator* op,
              const RowMatrix& g,
              const RowMatrix* residual,
              SampleState* samples,
              RowMatrix* w,
              AdjointSummary* summary);

}  // namespace stillpoint::adjoint
