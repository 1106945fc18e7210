// The dense adjoint solve: J_b^T assembled column by column from n batched
// VJPs (J^T e_i for every sample at once), then I - J_b^T solved exactly by
// partial-pivoting LU per sample. The reference for the iterative methods.
#include <Eigen/Dense>
#include <limits>
#include <string>
#include <vector>

#include "framework/check.h"
#include "solvers/adjoint/methods.h"

namespace stillpoint::adjoint {

void SolveDense(Float64Solve* solve) {
  const BackwardOptions& options = solve->options;
  const RowMatrix& g = solve->g;
  RowMatrix* w = solve->w;
  SampleState* samples = solve->samples;
  AdjointSummary* summary = solve->summary;
  const int64_t batch = g.rows();
  const int64_t n = g.cols();
  SP_CHECK(n <= options.dense_max_state_size, "SolveAdjoint: the dense adjoint solver builds an ",
           n, " x ", n, " matrix per sample; the state size ", n,
           " exceeds dense_max_state_size = ", options.dense_max_state_size,
           " (use gmres or another iterative adjoint solver)");
  // The solve is exact: it takes no start, and a failed sample keeps g.
  *w = g;
  std::vector<Eigen::MatrixXd> system(batch, Eigen::MatrixXd(n, n));
  RowMatrix unit = RowMatrix::Zero(batch, n);
  RowMatrix column(batch, n);
  for (int64_t i = 0; i < n; ++i) {
    if (i > 0) unit.col(i - 1).setZero();
    unit.col(i).setOnes();
    // Row b of the result is J_b^T e_i, column i of J_b^T.
    solve->op->ApplyTransposedJacobian(unit, &column);
    for (int64_t b = 0; b < batch; ++b) {
      system[b].col(i) = -column.row(b).transpose();
      system[b](i, i) += 1.0;
    }
  }
  summary->history_bytes = batch * n * n * 8;
  ParallelOverSamples(batch, [&](int64_t b) {
    samples->iterations[b] = static_cast<int>(n);
    if (!system[b].allFinite()) {
      samples->End(b, TerminationType::kNonFinite);
      return;
    }
    const Eigen::PartialPivLU<Eigen::MatrixXd> lu(system[b]);
    if (!(lu.rcond() > std::numeric_limits<double>::epsilon())) {
      w->row(b) = g.row(b);
      samples->End(b, TerminationType::kLinearAlgebraFailure);
      return;
    }
    const Eigen::VectorXd rhs = g.row(b).transpose();
    w->row(b) = lu.solve(rhs).transpose();
    samples->End(b, TerminationType::kConverged);
  });
  summary->message = "dense LU of I - J^T assembled from " + std::to_string(n) + " VJPs.";
  if (options.warm_start) {
    summary->option_usage.push_back(
        {"warm_start", "true", "false", "the dense solve is exact and needs no start"});
  }
}

}  // namespace stillpoint::adjoint
