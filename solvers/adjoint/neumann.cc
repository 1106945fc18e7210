// The truncated Neumann series w = sum_{i=0..k} (J^T)^i g, as k fixed-point
// steps w <- g + J^T w on float64 rows (k = neumann_terms), stopping a sample
// early once it meets the tolerance.
#include <cmath>
#include <string>
#include <vector>

#include "solvers/adjoint/methods.h"

namespace stillpoint::adjoint {

void SolveNeumann(Float64Solve* solve) {
  const BackwardOptions& options = solve->options;
  const RowMatrix& g = solve->g;
  RowMatrix* w = solve->w;
  SampleState* samples = solve->samples;
  const int64_t batch = g.rows();
  RowMatrix jt_w(g.rows(), g.cols());
  std::vector<double> residual(batch, 0.0);
  SampleLoopRules rules;
  rules.max_iterations = options.neumann_terms;
  // The residual of a term costs the VJP that makes the next one: a sample
  // that has all its terms is not measured again.
  rules.budget_before_measure = true;
  // With tolerance 0 the truncated series of neumann_terms terms is what was
  // asked for: a residual that reaches exactly 0 in the VJP's precision (a
  // float32 map has its own fixed point) does not end it, unless g_b = 0,
  // whose solution w_b = 0 is exact.
  rules.may_converge = [&](int64_t b) {
    return options.tolerance > 0.0 || samples->g_norm[b] == 0.0;
  };
  const auto measure = [&] {
    solve->op->ApplyTransposedJacobian(*w, &jt_w);
    for (int64_t b = 0; b < batch; ++b) {
      if (samples->active[b]) residual[b] = (g.row(b) + jt_w.row(b) - w->row(b)).norm();
    }
  };
  const auto step = [&] {
    for (int64_t b = 0; b < batch; ++b) {
      if (!samples->active[b]) continue;
      w->row(b) = g.row(b) + jt_w.row(b);
      ++samples->iterations[b];
    }
  };
  RunSampleLoop(rules, samples, residual, solve->summary, measure, step);
  solve->summary->history_bytes = batch * g.cols() * 8;
  solve->summary->message =
      "truncated Neumann series, " + std::to_string(options.neumann_terms) + " terms requested.";
}

}  // namespace stillpoint::adjoint
