// What the backward modes of SolveImplicit share: the cell's contract, the
// forward solve with the tape off, and the pass-through node of the modes
// that solve no adjoint equation.
#include <algorithm>
#include <utility>

#include "framework/check.h"
#include "framework/ops.h"
#include "solvers/fixed_point_solver.h"
#include "solvers/implicit_solve/modes.h"
#include "solvers/solve_scope.h"

namespace stillpoint::implicit {
namespace {

// The shape of the rows of `count` samples: z0's shape with extent `count`
// on axis 0.
Shape RowsShape(const Shape& full, int64_t count) {
  std::vector<int64_t> dims = full.dims();
  dims[0] = count;
  return Shape(dims);
}

// Keeps `count` forward iterates spread over however many iterations the
// solve runs, which is not known in advance (a tolerance stop may end it
// after a few). Every stride-th iterate is copied; when 2 * count are held,
// every other one is dropped and the stride doubles, so memory stays at most
// 2 * count + 1 states. Take() returns `count` of them evenly spaced, ending
// with the latest.
class IterateThinning {
 public:
  explicit IterateThinning(int count) : count_(count) {}

  void Offer(int iteration, const Tensor& state) {
    if (count_ <= 0) return;
    if (iteration % stride_ != 0) {
      newest_ = state.Clone();  // so the solve's last iterate is never missed
      return;
    }
    newest_ = Tensor();
    kept_.push_back(state.Clone());
    if (static_cast<int>(kept_.size()) < 2 * count_) return;
    std::vector<Tensor> halved;
    for (size_t i = 1; i < kept_.size(); i += 2) halved.push_back(std::move(kept_[i]));
    kept_ = std::move(halved);
    stride_ *= 2;
  }

  std::vector<Tensor> Take() {
    if (newest_.defined()) kept_.push_back(std::move(newest_));
    const int64_t held = static_cast<int64_t>(kept_.size());
    if (held <= count_) return std::move(kept_);
    std::vector<Tensor> chosen;
    for (int64_t j = 1; j <= count_; ++j) chosen.push_back(std::move(kept_[j * held / count_ - 1]));
    return chosen;
  }

 private:
  int count_;
  int stride_ = 1;
  std::vector<Tensor> kept_;
  Tensor newest_;  // the latest state offered off the stride, if newer than kept_
};

}  // namespace

void HandOver(const Tensor& value, Tensor* out) {
  if (value.dtype() == out->dtype() && value.numel() == out->numel()) {
    *out = value.Reshape(out->shape());
  } else {
    out->CopyFrom(value);
  }
}

Var EvaluateCell(const CellFn& f, const Var& z, const std::vector<int64_t>& ids) {
  Var y = f(z, ids);
  SP_CHECK(y.defined(), "SolveImplicit: the cell returned an undefined Var for input ", z.shape());
  SP_CHECK(y.shape() == z.shape() && y.dtype() == z.dtype(), "SolveImplicit: the cell maps ",
           z.shape(), " (", ToString(z.dtype()), ") to ", y.shape(), " (", ToString(y.dtype()),
           "); a fixed-point cell must keep shape and dtype");
  return y;
}

bool RecordedEvaluation::RecordedAt(const Tensor& z) const {
  return z_leaf.defined() && BitwiseEqual(z_leaf.value(), z);
}

Tensor SolveForward(const ModeInputs& in,
                    bool record_at_solution,
                    ImplicitResult* result,
                    RecordedEvaluation* last_recorded) {
  const CellFn& f = in.f;
  const CellEnergyFn& energy = in.energy;
  const ImplicitOptions& options = in.options;
  const Shape& shape = in.shape;
  const int64_t batch = in.batch;
  const int64_t n = in.n;
  const DType dtype = in.z0.dtype();

  FixedPointProblem problem;
  problem.batch_size = batch;
  problem.state_size = n;
  Tensor latest;  // latest evaluated state per sample (sampled_iterates only)
  if (options.sampled_iterates > 0) latest = in.z0.Reshape(Shape{batch, n}).Clone();
  // With a fixed budget the solver's last step evaluates f at what is almost
  // always its result, so that evaluation is recorded (tape on, into
  // *last_recorded) and reused when z* turns out to be bitwise its input:
  // the same value, one cell evaluation fewer per training step.
  bool record_next_map =
      record_at_solution && options.forward.FixedBudget() && options.forward.max_iterations == 0;
  problem.map = [&](const Tensor& z, const std::vector<int64_t>& ids, Tensor* out) {
    const int64_t k = static_cast<int64_t>(ids.size());
    if (record_next_map && k == batch) {
      record_next_map = false;
      GradModeGuard tape_on(true);
      last_recorded->z_leaf = Var(z.Reshape(shape).Clone(), true);
      last_recorded->f_z = EvaluateCell(f, last_recorded->z_leaf, ids);
      out->CopyFrom(last_recorded->f_z.value());  // the recorded value stays the graph's own
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
  if (record_at_solution && forward.FixedBudget() && forward.max_iterations > 0) {
    const int last_step = forward.max_iterations;
    forward.callbacks.push_back([&record_next_map, last_step](const IterationSummary& iteration) {
      record_next_map = iteration.iteration + 1 == last_step;
      return CallbackReturnType::kContinue;
    });
  }
  IterateThinning thinning(options.sampled_iterates);
  if (options.sampled_iterates > 0) {
    forward.callbacks.push_back([&](const IterationSummary& iteration) {
      if (iteration.iteration > 0) thinning.Offer(iteration.iteration, latest);
      return CallbackReturnType::kContinue;
    });
  }

  Tensor z_solution = in.z0.Reshape(Shape{batch, n}).Clone();
  {
    NoGrad tape_off;
    ForwardSolveScope solve;  // lets a nested solve in the map warm-start (solve_scope.h)
    last_recorded->solve_scope = ForwardSolveScope::Current();
    result->forward = SolveFixedPoint(forward, problem, &z_solution);
  }
  for (Tensor& iterate : thinning.Take()) result->sampled_iterates.push_back(iterate.Reshape(shape));
  return z_solution.Reshape(shape);
}

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

}  // namespace stillpoint::implicit
