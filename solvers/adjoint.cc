// SolveAdjoint: checks its inputs, runs the method options.solver names
// (solvers/adjoint/method_list.h, methods.h) and turns the per-sample outcome into the summary.
#include <algorithm>
#include <chrono>
#include <limits>
#include <sstream>
#include <string>

#include "framework/check.h"
#include "solvers/adjoint.h"
#include "solvers/adjoint/methods.h"

namespace stillpoint {
namespace {

using adjoint::AdjointOperator;
using adjoint::Float64Solve;
using adjoint::RowMatrix;
using adjoint::SampleState;

// A float64 method (GMRES, CG, MINRES, Neumann, dense) on float64 copies of
// g and w (the start: *w if defined, else g); writes the solution into *w.
void SolveOnFloat64Rows(void (*method)(Float64Solve*),
                        const BackwardOptions& options,
                        const BatchedVjp& vjp,
                        const Tensor& g,
                        Tensor* w,
                        AdjointSummary* summary) {
  const int64_t batch = g.dim(0);
  const int64_t n = g.dim(1);
  RowMatrix g_matrix(batch, n);
  adjoint::TensorToMatrix(g, &g_matrix);
  RowMatrix w_matrix(batch, n);
  if (w->defined()) {
    adjoint::TensorToMatrix(*w, &w_matrix);
  } else {
    w_matrix = g_matrix;
  }

  SampleState samples(g_matrix, options.tolerance);
  AdjointOperator op(vjp, batch, n, g.dtype());
  RowMatrix residual(batch, n);
  Float64Solve solve{options, &op, g_matrix, &w_matrix, &samples, summary, &residual};
  method(&solve);
  adjoint::Finalize(&op, g_matrix, solve.has_final_residual ? &residual : nullptr, &samples,
                    &w_matrix, summary);
  summary->vjp_evaluations = op.calls();
  if (!w->defined()) *w = Tensor(g.shape(), g.dtype());
  adjoint::MatrixToTensor(w_matrix, w);
}

// max_b |J^T g_b| / |g_b| over the samples with g_b != 0: the relative
// residual of the start w = g (one VJP).
double LargestRelativeRowNorm(const BatchedVjp& vjp, const Tensor& g) {
  const int64_t batch = g.dim(0);
  RowMatrix g_matrix(batch, g.dim(1));
  adjoint::TensorToMatrix(g, &g_matrix);
  RowMatrix jtg(batch, g.dim(1));
  AdjointOperator(vjp, batch, g.dim(1), g.dtype()).ApplyTransposedJacobian(g_matrix, &jtg);
  double largest = 0.0;
  for (int64_t b = 0; b < batch; ++b) {
    const double g_norm = g_matrix.row(b).norm();
    if (g_norm > 0.0) largest = std::max(largest, jtg.row(b).norm() / g_norm);
  }
  return largest;
}

// A sample whose g is zero has the solution w = 0 exactly, and a start
// elsewhere can only approach it: its tolerance, relative to |g| = 0, is
// never met, and the sample would spend its budget and end MAX_ITERATIONS
// (the inner adjoints of a nested solve see such rows: samples the outer
// solve has no cotangent for). Such rows of the start are set to 0 (on a
// copy: the start may be shared with the caller's warm-start state).
void StartZeroRowsAtZero(const Tensor& g, Tensor* w) {
  const int64_t batch = g.dim(0);
  const int64_t n = g.dim(1);
  bool copied = false;
  for (int64_t b = 0; b < batch; ++b) {
    bool zero = true;
    for (int64_t i = 0; i < n && zero; ++i) zero = g.at(b * n + i) == 0.0;
    if (!zero) continue;
    if (!copied) {
      *w = w->Clone();
      copied = true;
    }
    w->SliceRows(b, b + 1).Fill(0.0);
  }
}

// Runs the method options.solver names: one case per line of
// solvers/adjoint/method_list.h. The forward solvers work on the state's
// tensors, the others on float64 copies (see SolveWithFixedPointSolver).
void RunMethod(const BackwardOptions& options,
               const BatchedVjp& vjp,
               const Tensor& g,
               Tensor* w,
               AdjointSummary* summary) {
  switch (options.solver) {
#define SP_RUN_ON_FORWARD_SOLVER(value, name, forward)                                           \
  case AdjointSolverType::value:                                                                 \
    adjoint::SolveWithFixedPointSolver(options, ForwardSolverType::forward, vjp, g, w, summary); \
    return;
#define SP_RUN_ON_FLOAT64_ROWS(value, name, method)                    \
  case AdjointSolverType::value:                                       \
    SolveOnFloat64Rows(&adjoint::method, options, vjp, g, w, summary); \
    return;
    SP_ADJOINT_SOLVERS(SP_RUN_ON_FORWARD_SOLVER, SP_RUN_ON_FLOAT64_ROWS)
#undef SP_RUN_ON_FORWARD_SOLVER
#undef SP_RUN_ON_FLOAT64_ROWS
  }
  SP_CHECK(false, "SolveAdjoint: unknown adjoint solver ", static_cast<int>(options.solver));
}

}  // namespace

AdjointSummary SolveAdjoint(const BackwardOptions& options,
                            const BatchedVjp& vjp,
                            const Tensor& g,
                            Tensor* w) {
  std::string error;
  SP_CHECK(options.IsValid(&error), "SolveAdjoint: ", error);
  return adjoint::SolveWithCheckedOptions(options, vjp, g, w);
}

AdjointSummary SolveAdjointFromStart(const BackwardOptions& options,
                                     const BatchedVjp& vjp,
                                     const Tensor& g,
                                     Tensor* w) {
  std::string error;
  SP_CHECK(options.IsValid(&error), "SolveAdjointFromStart: ", error);
  SP_CHECK(w != nullptr && w->defined(), "SolveAdjointFromStart: no start given");
  return adjoint::SolveFromStartWithCheckedOptions(options, vjp, g, w);
}

AdjointSummary adjoint::SolveFromStartWithCheckedOptions(const BackwardOptions& options,
                                                         const BatchedVjp& vjp,
                                                         const Tensor& g,
                                                         Tensor* w) {
  AdjointSummary summary = SolveWithCheckedOptions(options, vjp, g, w);
  if (summary.termination_type == TerminationType::kConverged) return summary;
  // Would g have been the better start? Its residual is J^T g (one VJP);
  // the given start's is the first entry of the trace. Only a start worse
  // than g is worth a second solve: from a smaller residual the same
  // iterations end at least as close on the contractions the iterative
  // solvers converge on.
  const double start_residual = summary.rel_residual_trace.empty()
                                    ? std::numeric_limits<double>::infinity()
                                    : summary.rel_residual_trace.front();
  const double g_residual = LargestRelativeRowNorm(vjp, g);
  std::ostringstream note;
  note << " The solve from the given start missed the tolerance (its first relative residual "
       << start_residual << ", g's " << g_residual << "); ";
  if (!(g_residual < start_residual)) {
    summary.vjp_evaluations += 1;
    summary.message += note.str() + "kept it, as g was no better a start.";
    return summary;
  }
  Tensor from_g;
  AdjointSummary again = SolveWithCheckedOptions(options, vjp, g, &from_g);
  const int64_t vjps = summary.vjp_evaluations + 1 + again.vjp_evaluations;
  const double wall = summary.wall_time_seconds + again.wall_time_seconds;
  const bool from_g_better =
      again.HasResiduals() &&
      (!summary.HasResiduals() || again.MaxRelResidual() < summary.MaxRelResidual());
  if (from_g_better) {
    summary = std::move(again);
    *w = std::move(from_g);
  }
  summary.vjp_evaluations = vjps;
  summary.wall_time_seconds = wall;
  summary.message += note.str() + "solved again from g, kept the " +
                     (from_g_better ? "solution from g." : "solution from the given start.");
  return summary;
}

AdjointSummary adjoint::SolveWithCheckedOptions(const BackwardOptions& options,
                                                const BatchedVjp& vjp,
                                                const Tensor& g,
                                                Tensor* w) {
  const auto start = std::chrono::steady_clock::now();
  SP_CHECK(static_cast<bool>(vjp), "SolveAdjoint: the VJP callback is empty");
  SP_CHECK(g.defined() && g.rank() == 2, "SolveAdjoint: g must be [B, n], got ",
           g.defined() ? g.shape().ToString() : std::string("an empty tensor"));
  SP_CHECK(w != nullptr, "SolveAdjoint: w is null");
  const int64_t batch = g.dim(0);
  const int64_t n = g.dim(1);
  const bool warm = w->defined();
  if (warm) {
    SP_CHECK(w->shape() == g.shape() && w->dtype() == g.dtype(),
             "SolveAdjoint: initial guess of shape ", w->shape(), " (", ToString(w->dtype()),
             ") for g of shape ", g.shape(), " (", ToString(g.dtype()), ")");
  }

  if (warm) StartZeroRowsAtZero(g, w);

  AdjointSummary summary;
  summary.mode = BackwardMode::kIft;
  summary.solver = options.solver;
  summary.batch_size = batch;
  summary.state_size = n;
  summary.warm_started = warm && options.solver != AdjointSolverType::kDense;

  RunMethod(options, vjp, g, w, &summary);

  summary.tolerance = options.tolerance;
  if (options.tolerance == 0.0 && options.solver != AdjointSolverType::kDense) {
    int64_t budget_spent = 0;
    for (TerminationType& t : summary.sample_termination) {
      if (t != TerminationType::kMaxIterations) continue;
      t = TerminationType::kInexact;
      ++budget_spent;
    }
    if (budget_spent > 0) {
      summary.message += " Tolerance 0 asks for a fixed budget: " + std::to_string(budget_spent) +
                         " sample(s) used it and end INEXACT (no tolerance to meet).";
    }
  }
  summary.iterations = 0;
  for (int it : summary.sample_iterations) summary.iterations = std::max(summary.iterations, it);
  summary.termination_type = TerminationType::kConverged;
  for (TerminationType t : summary.sample_termination) {
    summary.termination_type = std::max(summary.termination_type, t);
  }
  summary.wall_time_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

}  // namespace stillpoint
