#include "solvers/implicit.h"

#include <chrono>
#include <cmath>
#include <numeric>
#include <sstream>
#include <utility>

#include "framework/check.h"
#include "framework/ops.h"
#include "solvers/fixed_point_solver.h"

namespace stillpoint {
namespace {

// Gives the solver `value` as the output of its map or VJP: *out is rebound
// to it (no copy; BatchedMap and BatchedVjp allow that) when it has out's
// dtype and size, else it is copied into *out, converting.
void HandOver(const Tensor& value, Tensor* out) {
  if (value.dtype() == out->dtype() && value.numel() == out->numel()) {
    *out = value.Reshape(out->shape());
  } else {
    out->CopyFrom(value);
  }
}

// The shape of the rows of `count` samples: z0's shape with extent `count`
// on axis 0.
Shape RowsShape(const Shape& full, int64_t count) {
  std::vector<int64_t> dims = full.dims();
  dims[0] = count;
  return Shape(dims);
}

std::vector<int64_t> AllSamples(int64_t batch) {
  std::vector<int64_t> ids(batch);
  std::iota(ids.begin(), ids.end(), 0);
  return ids;
}

// Evaluates the cell and checks its contract.
Var EvaluateCell(const CellFn& f, const Var& z, const std::vector<int64_t>& ids) {
  Var y = f(z, ids);
  SP_CHECK(y.defined(), "SolveImplicit: the cell returned an undefined Var for input ", z.shape());
  SP_CHECK(y.shape() == z.shape() && y.dtype() == z.dtype(), "SolveImplicit: the cell maps ",
           z.shape(), " (", ToString(z.dtype()), ") to ", y.shape(), " (", ToString(y.dtype()),
           "); a fixed-point cell must keep shape and dtype");
  return y;
}

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

// A recorded cell evaluation f_z = f(z_leaf) over the whole batch, made by
// the forward solve's map (see SolveImplicit).
struct RecordedEvaluation {
  Var z_leaf;
  Var f_z;

  // Whether it was recorded at exactly z (every entry bitwise equal).
  bool RecordedAt(const Tensor& z) const {
    return z_leaf.defined() && BitwiseEqual(z_leaf.value(), z);
  }
};

// Fills a backward summary for a mode that solves no adjoint equation.
void ReportInexact(BackwardMode mode,
                   int steps,
                   int64_t batch,
                   int64_t n,
                   const std::string& message,
                   AdjointSummary* summary) {
  *summary = AdjointSummary();
  summary->mode = mode;
  summary->termination_type = TerminationType::kInexact;
  summary->message = message;
  summary->batch_size = batch;
  summary->state_size = n;
  summary->sample_iterations.assign(batch, steps);
  summary->sample_termination.assign(batch, TerminationType::kInexact);
  summary->iterations = steps;
}

// Wraps `last` (the recorded steps of kPhantom / kUnrolled) in an "implicit"
// node that passes the gradient through and reports the backward pass.
Var PassThroughNode(const Var& last,
                    BackwardMode mode,
                    int steps,
                    int64_t batch,
                    int64_t n,
                    std::string message,
                    std::shared_ptr<AdjointSummary> summary) {
  return RecordOp("implicit", last.value(), {last},
                  [=](const VarList& inputs, const Var& self, const Var& g) {
                    ReportInexact(mode, steps, batch, n, message, summary.get());
                    return VarList{g};
                  });
}

// The ift node's gradients for its explicit inputs under create_graph, on
// the tape: with f re-evaluated at z* = self (so that second derivatives
// reach z*'s own dependence on the inputs) and the adjoint w = g + J^T w as
// an implicit node of its own: the map h(w) = g + J_f(z*)^T w, solved
// already (w_value) and recorded once at w by SolveImplicit with no further
// iterations, so that differentiating it solves (I - J_h^T) x = c with the
// same backward options (J_h^T x = J_f x, by autodiff through h).
VarList SecondOrderGradients(const CellFn& f,
                             const Var& self,
                             const Var& g,
                             const Tensor& w_value,
                             const BackwardOptions& backward,
                             const std::vector<int64_t>& all_ids,
                             const VarList& explicit_inputs) {
  const Var f_self = EvaluateCell(f, self, all_ids);
  const int64_t batch = w_value.dim(0);
  CellFn adjoint_map = [f_self, self, g, batch](const Var& w,
                                                const std::vector<int64_t>& ids) -> Var {
    SP_CHECK(static_cast<int64_t>(ids.size()) == batch,
             "SolveImplicit: the second-order adjoint map is evaluated on whole batches only");
    // Stop at z*: going on would differentiate this very node again.
    const VarList jt_w = grad({f_self}, {self}, {w},
                              {.retain_graph = true, .create_graph = true, .stop_at_inputs = true});
    return jt_w[0].defined() ? add(g, jt_w[0]) : add(g, mul_scalar(w, 0.0));
  };
  ImplicitOptions adjoint_options;
  // The adjoint is solved: record h at w_value, no iterations.
  adjoint_options.forward.type = ForwardSolverType::kPicard;
  adjoint_options.forward.max_iterations = 0;
  adjoint_options.forward.stop_mode = StopMode::kRelative;
  adjoint_options.forward.relative_tolerance = 0.0;
  adjoint_options.forward.fallback_chain.clear();
  adjoint_options.backward = backward;
  adjoint_options.backward.warm_start = false;
  VarList adjoint_inputs = explicit_inputs;
  adjoint_inputs.push_back(self);
  if (g.requires_grad()) adjoint_inputs.push_back(g);
  const Var w =
      SolveImplicit(adjoint_map, w_value, adjoint_options, nullptr, adjoint_inputs).z_star;
  // Partial derivatives, z* held fixed: an explicit input computed from
  // another (a context entry from a weight) must not pass its share on to it
  // as well, as the engine pushes each input's gradient on through its own
  // history, and the sweep must not go on through z* into this very node
  // (z*'s dependence reaches the inputs through the adjoint node instead).
  VarList targets = explicit_inputs;
  targets.push_back(self);
  VarList grads = grad({f_self}, targets, {w},
                       {.retain_graph = true, .create_graph = true, .stop_at_inputs = true});
  grads.pop_back();
  return grads;
}

}  // namespace

bool ImplicitOptions::IsValid(std::string* error) const {
  std::string inner;
  if (!forward.IsValid(&inner)) {
    if (error != nullptr) *error = "ImplicitOptions.forward: " + inner;
    return false;
  }
  if (!backward.IsValid(&inner)) {
    if (error != nullptr) *error = "ImplicitOptions.backward: " + inner;
    return false;
  }
  if (backward.warm_start && !adjoint_warm_start) {
    if (error != nullptr) {
      *error =
          "ImplicitOptions: backward.warm_start is set but adjoint_warm_start is null; give the "
          "call site an AdjointWarmStart to keep its previous adjoint solution in";
    }
    return false;
  }
  if (sampled_iterates < 0) {
    if (error != nullptr) {
      *error = "ImplicitOptions: sampled_iterates = " + std::to_string(sampled_iterates) +
               " must be >= 0";
    }
    return false;
  }
  return true;
}

ImplicitResult SolveImplicit(const CellFn& f,
                             const Tensor& z0,
                             const ImplicitOptions& options,
                             const CellEnergyFn& energy,
                             const VarList& explicit_inputs) {
  std::string error;
  SP_CHECK(options.IsValid(&error), "SolveImplicit: ", error);
  SP_CHECK(static_cast<bool>(f), "SolveImplicit: the cell is empty");
  SP_CHECK(z0.defined() && z0.rank() >= 1 && z0.dim(0) >= 1,
           "SolveImplicit: z0 must be [B, ...] with B >= 1, got ",
           z0.defined() ? z0.shape().ToString() : std::string("an empty tensor"));
  const Shape shape = z0.shape();
  const int64_t batch = shape.dim(0);
  const int64_t n = z0.numel() / batch;
  const DType dtype = z0.dtype();
  const std::vector<int64_t> all_ids = AllSamples(batch);
  const BackwardOptions& backward = options.backward;
  const bool recording = GradModeEnabled();
  // Reject a dense adjoint that cannot run before spending a forward solve.
  SP_CHECK(backward.mode != BackwardMode::kIft || backward.solver != AdjointSolverType::kDense ||
               n <= backward.dense_max_state_size,
           "SolveImplicit: the dense adjoint solver builds an n x n matrix per sample; the state "
           "size n = ",
           n, " exceeds backward.dense_max_state_size = ", backward.dense_max_state_size);

  ImplicitResult result;

  // ---- kUnrolled: k plain recorded steps from z0, no solver ----
  if (backward.mode == BackwardMode::kUnrolled) {
    const auto start = std::chrono::steady_clock::now();
    Var z(z0);
    for (int k = 0; k < backward.unrolled_steps; ++k) z = EvaluateCell(f, z, all_ids);
    Tensor fz;
    {
      NoGrad no_grad;
      fz = EvaluateCell(f, Var(z.value()), all_ids).value();
    }
    SolverSummary& summary = result.forward;
    summary.solver_type = ForwardSolverType::kPicard;
    summary.batch_size = batch;
    summary.state_size = n;
    summary.iterations = backward.unrolled_steps;
    summary.map_calls = backward.unrolled_steps + 1;
    summary.function_evaluations = batch * summary.map_calls;
    JudgeUnrolled(options.forward, z.value(), fz, backward.unrolled_steps, &summary);
    summary.message = "unrolled backward mode: " + std::to_string(backward.unrolled_steps) +
                      " plain steps z <- f(z) from z0 recorded on the tape; no solver ran "
                      "(residual of the last step).";
    summary.wall_time_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!recording || !z.requires_grad()) {
      result.z_star = Var(z.value());
      return result;
    }
    result.backward = std::make_shared<AdjointSummary>();
    result.z_star =
        PassThroughNode(z, BackwardMode::kUnrolled, backward.unrolled_steps, batch, n,
                        "unrolled: backprop through " + std::to_string(backward.unrolled_steps) +
                            " recorded steps; no adjoint equation solved.",
                        result.backward);
    return result;
  }

  // ---- the forward solve, tape off ----
  FixedPointProblem problem;
  problem.batch_size = batch;
  problem.state_size = n;
  Tensor latest;  // latest evaluated state per sample (sampled_iterates only)
  if (options.sampled_iterates > 0) latest = z0.Reshape(Shape{batch, n}).Clone();
  // kIft and kJfb record one evaluation at z*. With a fixed budget the
  // solver's last step evaluates f at what is almost always its result, so
  // that evaluation is recorded (tape on, into `last_recorded`) and reused
  // when z* turns out to be bitwise its input: the same value, one cell
  // evaluation fewer per training step.
  const bool records_at_solution =
      recording && (backward.mode == BackwardMode::kIft || backward.mode == BackwardMode::kJfb);
  RecordedEvaluation last_recorded;
  bool record_next_map =
      records_at_solution && options.forward.FixedBudget() && options.forward.max_iterations == 0;
  problem.map = [&](const Tensor& z, const std::vector<int64_t>& ids, Tensor* out) {
    const int64_t k = static_cast<int64_t>(ids.size());
    if (record_next_map && k == batch) {
      record_next_map = false;
      GradModeGuard tape_on(true);
      last_recorded.z_leaf = Var(z.Reshape(shape).Clone(), true);
      last_recorded.f_z = EvaluateCell(f, last_recorded.z_leaf, ids);
      out->CopyFrom(last_recorded.f_z.value());  // the recorded value stays the graph's own
    } else {
      Var y = EvaluateCell(f, Var(z.Reshape(RowsShape(shape, k))), ids);
      HandOver(y.value(), out);
    }
    if (latest.defined()) {
      for (int64_t i = 0; i < k; ++i) {
        latest.SliceRows(ids[i], ids[i] + 1).CopyFrom(z.SliceRows(i, i + 1));
      }
    }
    return true;
  };
  if (options.autodiff_jvp) {
    problem.jvp = [&](const Tensor& z, const Tensor& v, const std::vector<int64_t>& ids,
                      Tensor* out) {
      // J v = d/du <J^T u, v>: J^T u is linear in u, so differentiating it
      // once more (at u = 0) gives J v exactly.
      GradModeGuard tape_on(true);
      const Shape rows = RowsShape(shape, static_cast<int64_t>(ids.size()));
      Var z_leaf(z.Reshape(rows), true);
      Var y = EvaluateCell(f, z_leaf, ids);
      Var u(Tensor::Zeros(rows, dtype), true);
      VarList jt_u = grad({y}, {z_leaf}, {u}, {.retain_graph = true, .create_graph = true});
      if (!jt_u[0].defined()) {
        out->Fill(0.0);
        return true;
      }
      VarList jv = grad({jt_u[0]}, {u}, {Var(v.Reshape(rows))});
      if (jv[0].defined()) {
        out->CopyFrom(jv[0].value());
      } else {
        out->Fill(0.0);
      }
      return true;
    };
  }
  if (energy) {
    problem.energy = [&](const Tensor& z, const std::vector<int64_t>& ids, Tensor* values,
                         Tensor* gradient) {
      GradModeGuard tape_on(true);
      const int64_t k = static_cast<int64_t>(ids.size());
      Var z_leaf(z.Reshape(RowsShape(shape, k)), true);
      Var e = energy(z_leaf, ids);
      SP_CHECK(e.defined() && e.numel() == k,
               "SolveImplicit: the energy must return one value per sample ([", k, "]), got ",
               e.defined() ? e.shape().ToString() : "undefined");
      values->CopyFrom(e.value());
      VarList dz = grad({sum(e)}, {z_leaf});
      if (dz[0].defined()) {
        gradient->CopyFrom(dz[0].value());
      } else {
        gradient->Fill(0.0);
      }
      return true;
    };
  }

  ForwardSolverOptions forward = options.forward;
  if (records_at_solution && forward.FixedBudget() && forward.max_iterations > 0) {
    const int last_step = forward.max_iterations;
    forward.callbacks.push_back([&record_next_map, last_step](const IterationSummary& iteration) {
      record_next_map = iteration.iteration + 1 == last_step;
      return CallbackReturnType::kContinue;
    });
  }
  if (options.sampled_iterates > 0) {
    const int stride = std::max(1, forward.max_iterations / options.sampled_iterates);
    forward.callbacks.push_back([&, stride](const IterationSummary& iteration) {
      if (iteration.iteration > 0 && iteration.iteration % stride == 0 &&
          static_cast<int>(result.sampled_iterates.size()) < options.sampled_iterates) {
        result.sampled_iterates.push_back(latest.Clone().Reshape(shape));
      }
      return CallbackReturnType::kContinue;
    });
  }

  Tensor z_solution = z0.Reshape(Shape{batch, n}).Clone();
  {
    NoGrad tape_off;
    result.forward = SolveFixedPoint(forward, problem, &z_solution);
  }
  const Tensor z_star_value = z_solution.Reshape(shape);
  if (!recording) {
    result.z_star = Var(z_star_value);
    return result;
  }

  // ---- kPhantom: k damped recorded steps from z* ----
  if (backward.mode == BackwardMode::kPhantom) {
    const double tau = backward.phantom_tau;
    Var z(z_star_value);
    for (int k = 0; k < backward.phantom_steps; ++k) {
      Var fz = EvaluateCell(f, z, all_ids);
      z = tau == 1.0 ? fz : add(mul_scalar(z, 1.0 - tau), mul_scalar(fz, tau));
    }
    if (!z.requires_grad()) {
      result.z_star = Var(z.value());
      return result;
    }
    result.backward = std::make_shared<AdjointSummary>();
    std::ostringstream message;
    message << "phantom gradient: backprop through " << backward.phantom_steps
            << " damped steps (tau " << tau << ") from z*; no adjoint equation solved.";
    result.z_star = PassThroughNode(z, BackwardMode::kPhantom, backward.phantom_steps, batch, n,
                                    message.str(), result.backward);
    return result;
  }

  // ---- kIft / kJfb: one recorded evaluation at z*, one implicit node ----
  Var z_leaf;
  Var f_star;
  if (last_recorded.RecordedAt(z_star_value)) {
    z_leaf = last_recorded.z_leaf;
    f_star = last_recorded.f_z;
  } else {
    z_leaf = Var(z_star_value, true);
    f_star = EvaluateCell(f, z_leaf, all_ids);
  }
  if (!f_star.requires_grad()) {
    result.z_star = Var(f_star.value());
    return result;
  }
  auto summary = std::make_shared<AdjointSummary>();
  result.backward = summary;
  auto warm = options.adjoint_warm_start;
  // The node's inputs: f_star (the first-order path: the engine pushes the
  // adjoint through f's recorded graph) and, for second order, the explicit
  // inputs themselves.
  VarList node_inputs = {f_star};
  VarList second_order_inputs;
  if (backward.mode == BackwardMode::kIft) {
    for (const Var& x : explicit_inputs) {
      if (x.defined() && x.requires_grad()) second_order_inputs.push_back(x);
    }
  }
  node_inputs.insert(node_inputs.end(), second_order_inputs.begin(), second_order_inputs.end());
  result.z_star = RecordOp(
      "implicit", f_star.value(), node_inputs,
      [z_leaf, f, backward, summary, warm, batch, n, shape, all_ids,
       second_order_inputs](const VarList& inputs, const Var& self, const Var& g) -> VarList {
        if (backward.mode == BackwardMode::kJfb) {
          ReportInexact(BackwardMode::kJfb, 0, batch, n,
                        "Jacobian-free backward: w = g; no adjoint equation solved.",
                        summary.get());
          return VarList{g};
        }
        const Var& f_star_input = inputs[0];
        BatchedVjp vjp = [&](const Tensor& v, Tensor* out) {
          VarList jt_v =
              grad({f_star_input}, {z_leaf}, {Var(v.Reshape(shape))}, {.retain_graph = true});
          if (jt_v[0].defined()) {
            HandOver(jt_v[0].value(), out);
          } else {
            out->Fill(0.0);
          }
        };
        // Under create_graph g is on the tape; the solve uses its value.
        const Tensor g_rows = g.value().Reshape(Shape{batch, n});
        Tensor w;
        if (backward.warm_start && warm && warm->solution.defined() &&
            warm->solution.shape() == g_rows.shape() && warm->solution.dtype() == g_rows.dtype()) {
          w = warm->solution.Clone();
        }
        *summary = SolveAdjoint(backward, vjp, g_rows, &w);
        if (backward.warm_start && warm) warm->solution = w.Clone();
        VarList grads(inputs.size());
        if (GradModeEnabled() && !second_order_inputs.empty()) {
          // create_graph: every gradient on the tape as a function of g, z*
          // and the explicit inputs (see SolveImplicit in implicit.h).
          const VarList explicit_grads =
              SecondOrderGradients(f, self, g, w.Reshape(shape), backward, all_ids,
                                   second_order_inputs);
          std::copy(explicit_grads.begin(), explicit_grads.end(), grads.begin() + 1);
        } else {
          grads[0] = Var(w.Reshape(shape));
        }
        return grads;
      });
  return result;
}

}  // namespace stillpoint
