// BackwardMode::kIft and kJfb: the solver runs with the tape off, one
// evaluation f_star = f(z_leaf) at z* is recorded, and an "implicit" node
// with the single input f_star (plus, for second order, the explicit inputs)
// gets the gradient g = dL/dz*. kIft solves the adjoint equation
// w = g + J^T w there (solvers/adjoint.h); kJfb passes w = g on.
#include <algorithm>
#include <utility>

#include "framework/check.h"
#include "framework/ops.h"
#include "solvers/adjoint/methods.h"
#include "solvers/implicit_solve/modes.h"
#include "solvers/solve_scope.h"

namespace stillpoint::implicit {
namespace {

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

// ImplicitOptions::nested_adjoint_warm_start: the node's last adjoint
// solution that met the tolerance, and the outer adjoint solve
// (AdjointSolveScope id) it was solved in.
struct NestedAdjointStart {
  uint64_t outer_solve = 0;
  Tensor solution;
};

// The ift node's adjoint solve for g_rows [B, n] into *w: from the call
// site's previous solution (backward.warm_start), else from the node's
// previous solution in the same outer adjoint solve (nested, when given and
// there is one; through SolveAdjointFromStart, which judges a start that
// misses the tolerance against g), else from g.
AdjointSummary SolveNodeAdjoint(const BackwardOptions& backward,
                                const BatchedVjp& vjp,
                                const Tensor& g_rows,
                                AdjointWarmStart* warm,
                                NestedAdjointStart* nested,
                                Tensor* w) {
  // Read before this solve opens its own scope.
  const uint64_t outer = AdjointSolveScope::Current();
  AdjointSolveScope scope;
  auto fits = [&](const Tensor& start) {
    return start.defined() && start.shape() == g_rows.shape() && start.dtype() == g_rows.dtype();
  };
  bool nested_start = false;
  if (backward.warm_start && warm && fits(warm->solution)) {
    *w = warm->solution.Clone();
  } else if (nested && outer != 0 && nested->outer_solve == outer && fits(nested->solution)) {
    *w = std::move(nested->solution);  // replaced below
    nested_start = true;
  }
  // backward was checked with the options by SolveImplicit.
  AdjointSummary summary =
      nested_start ? adjoint::SolveFromStartWithCheckedOptions(backward, vjp, g_rows, w)
                   : adjoint::SolveWithCheckedOptions(backward, vjp, g_rows, w);
  if (nested) {
    if (outer != 0 && summary.termination_type == TerminationType::kConverged) {
      nested->outer_solve = outer;
      nested->solution = w->Clone();
    } else {
      nested->outer_solve = 0;
      nested->solution = Tensor();
    }
  }
  return summary;
}

// The forward solve and the one recorded evaluation f_star = f(z_leaf) at
// z*. Returns false, with result->z_star a constant, when there is nothing
// to differentiate (tape off, or f_star does not require grad).
bool SolveAndRecordAtSolution(const ModeInputs& in,
                              ImplicitResult* result,
                              Var* z_leaf,
                              Var* f_star) {
  RecordedEvaluation last_recorded;
  const Tensor z_star_value =
      SolveForward(in, /*record_at_solution=*/in.recording, result, &last_recorded);
  if (!in.recording) {
    result->z_star = Var(z_star_value);
    return false;
  }
  if (last_recorded.RecordedAt(z_star_value)) {
    *z_leaf = last_recorded.z_leaf;
    *f_star = last_recorded.f_z;
  } else {
    // The solver's last recorded evaluation is not at z*: let its graph go
    // before recording the one at z*, so that two recorded evaluations of f
    // (with all they keep for the backward pass) are never held at once.
    last_recorded.z_leaf = Var();
    last_recorded.f_z = Var();
    // Part of the same solve: a nested solve in f starts from its solution
    // at the solver's last evaluation.
    ForwardSolveScope same_solve(last_recorded.solve_scope);
    *z_leaf = Var(z_star_value, true);
    *f_star = EvaluateCell(in.f, *z_leaf, in.all_ids);
  }
  if (!f_star->requires_grad()) {
    result->z_star = Var(f_star->value());
    return false;
  }
  return true;
}

}  // namespace

ImplicitResult SolveJfb(const ModeInputs& in) {
  ImplicitResult result;
  Var z_leaf;
  Var f_star;
  if (!SolveAndRecordAtSolution(in, &result, &z_leaf, &f_star)) return result;
  auto summary = std::make_shared<AdjointSummary>();
  result.backward = summary;
  const int64_t batch = in.batch;
  const int64_t n = in.n;
  result.z_star = RecordOp(
      "implicit", f_star.value(), {f_star},
      [summary, batch, n](const VarList& inputs, const Var& self, const Var& g) -> VarList {
        ReportInexact(BackwardMode::kJfb, 0, batch, n,
                      "Jacobian-free backward: w = g; no adjoint equation "
                      "solved.",
                      summary.get());
        return VarList{g};
      });
  return result;
}

ImplicitResult SolveIft(const ModeInputs& in) {
  ImplicitResult result;
  Var z_leaf;
  Var f_star;
  if (!SolveAndRecordAtSolution(in, &result, &z_leaf, &f_star)) return result;
  auto summary = std::make_shared<AdjointSummary>();
  result.backward = summary;
  // The node's inputs: f_star (the first-order path: the engine pushes the
  // adjoint through f's recorded graph) and, for second order, the explicit
  // inputs themselves.
  VarList node_inputs = {f_star};
  VarList second_order_inputs;
  for (const Var& x : in.explicit_inputs) {
    if (x.defined() && x.requires_grad()) second_order_inputs.push_back(x);
  }
  node_inputs.insert(node_inputs.end(), second_order_inputs.begin(), second_order_inputs.end());
  result.z_star = RecordOp(
      "implicit", f_star.value(), node_inputs,
      [z_leaf, f = in.f, backward = in.options.backward, summary, warm = in.warm_start,
       nested = in.options.nested_adjoint_warm_start ? std::make_shared<NestedAdjointStart>()
                                                     : nullptr,
       observer = in.options.adjoint_observer,
       batch = in.batch, n = in.n, shape = in.shape, all_ids = in.all_ids,
       second_order_inputs](const VarList& inputs, const Var& self, const Var& g) -> VarList {
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
        *summary = SolveNodeAdjoint(backward, vjp, g_rows, warm.get(), nested.get(), &w);
        if (observer) observer(*summary);
        if (backward.warm_start && warm) warm->solution = w.Clone();
        VarList grads(inputs.size());
        if (GradModeEnabled() && !second_order_inputs.empty()) {
          // create_graph: every gradient on the tape as a function of g, z*
          // and the explicit inputs (see SolveImplicit in implicit_solve.h).
          const VarList explicit_grads = SecondOrderGradients(
              f, self, g, w.Reshape(shape), backward, all_ids, second_order_inputs);
          std::copy(explicit_grads.begin(), explicit_grads.end(), grads.begin() + 1);
        } else {
          grads[0] = Var(w.Reshape(shape));
        }
        return grads;
      });
  return result;
}

}  // namespace stillpoint::implicit
