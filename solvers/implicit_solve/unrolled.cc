// BackwardMode::kUnrolled: no solver; k plain steps z <- f(z) from z0 are
// recorded on the tape, and backward differentiates through all of them.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include "solvers/implicit_solve/modes.h"

namespace stillpoint::implicit {
namespace {

// Per-sample residuals of z -> f(z) judged by the forward stopping rule, for
// the summary of kUnrolled (where no solver judges them).
void JudgeUnrolled(const ForwardSolverOptions& options,
                   const Tensor& z,
                   const Tensor& fz,
                   int steps,
                   SolverSummary* summary) {
  const int64_t batch = summary->batch_size;
  const int64_t n = summary->state_size;
  const std::vector<double> zv = z.ToVector();
  const std::vector<double> fv = fz.ToVector();
  summary->sample_iterations.assign(batch, steps);
  summary->sample_abs_residual.resize(batch);
  summary->sample_rel_residual.resize(batch);
  summary->sample_termination.resize(batch);
  summary->sample_solver.assign(batch, ForwardSolverType::kPicard);
  summary->termination_type = TerminationType::kConverged;
  for (int64_t b = 0; b < batch; ++b) {
    double diff = 0.0, norm = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const double d = fv[b * n + i] - zv[b * n + i];
      diff += d * d;
      norm += fv[b * n + i] * fv[b * n + i];
    }
    const double abs_residual = std::sqrt(diff);
    const double rel_residual = abs_residual / (std::sqrt(norm) + options.relative_epsilon);
    summary->sample_abs_residual[b] = abs_residual;
    summary->sample_rel_residual[b] = rel_residual;
    const bool abs_ok =
        options.absolute_tolerance > 0 && abs_residual <= options.absolute_tolerance;
    const bool rel_ok =
        options.relative_tolerance > 0 && rel_residual <= options.relative_tolerance;
    bool ok = false;
    switch (options.stop_mode) {
      case StopMode::kAbsolute:
        ok = abs_ok;
        break;
      case StopMode::kRelative:
        ok = rel_ok;
        break;
      case StopMode::kEither:
        ok = abs_ok || rel_ok;
        break;
    }
    if (!std::isfinite(abs_residual)) {
      summary->sample_termination[b] = TerminationType::kNonFinite;
    } else {
      summary->sample_termination[b] =
          ok ? TerminationType::kConverged : TerminationType::kMaxIterations;
    }
    summary->termination_type = std::max(summary->termination_type, summary->sample_termination[b]);
  }
}

}  // namespace

ImplicitResult SolveUnrolled(const ModeInputs& in) {
  const BackwardOptions& backward = in.options.backward;
  ImplicitResult result;
  const auto start = std::chrono::steady_clock::now();
  Var z(in.z0);
  for (int k = 0; k < backward.unrolled_steps; ++k) z = EvaluateCell(in.f, z, in.all_ids);
  Tensor fz;
  {
    NoGrad no_grad;
    fz = EvaluateCell(in.f, Var(z.value()), in.all_ids).value();
  }
  SolverSummary& summary = result.forward;
  summary.solver_type = ForwardSolverType::kPicard;
  summary.batch_size = in.batch;
  summary.state_size = in.n;
  summary.iterations = backward.unrolled_steps;
  summary.map_calls = backward.unrolled_steps + 1;
  summary.function_evaluations = in.batch * summary.map_calls;
  JudgeUnrolled(in.options.forward, z.value(), fz, backward.unrolled_steps, &summary);
  summary.message = "unrolled backward mode: " + std::to_string(backward.unrolled_steps) +
                    " plain steps z <- f(z) from z0 recorded on the tape; no solver ran "
                    "(residual of the last step).";
  summary.wall_time_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!in.recording || !z.requires_grad()) {
    result.z_star = Var(z.value());
    return result;
  }
  result.backward = std::make_shared<AdjointSummary>();
  result.z_star =
      PassThroughNode(z, BackwardMode::kUnrolled, backward.unrolled_steps, in.batch, in.n,
                      "unrolled: backprop through " + std::to_string(backward.unrolled_steps) +
                          " recorded steps; no adjoint equation solved.",
                      result.backward);
  return result;
}

}  // namespace stillpoint::implicit
