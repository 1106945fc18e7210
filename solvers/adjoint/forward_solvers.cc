// fixed_point, anderson and broyden adjoint solvers: the forward fixed-point
// solvers (solvers/fixed_point_solver.h) run on the normalised adjoint map
// u -> g_b / ||g_b|| + J^T u.
//
// They work on tensors of the state's dtype, not on float64 RowMatrix copies:
// in a fixed budget every map call is a whole-batch VJP that runs in place on
// the forward solver's own buffers, so [B, n] float64 copies would only add
// conversions and, each call, fresh pages. Where the float64 path computes in
// float64 (the scaling by ||g_b||), each value is still computed in float64
// and rounded once to the state's dtype, so the results are bitwise those of
// the float64 rows.
#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "framework/check.h"
#include "framework/parallel_loops.h"
#include "solvers/adjoint/methods.h"
#include "solvers/fixed_point_solver.h"

namespace stillpoint::adjoint {
namespace {

// out = a + b (same shape and dtype), spread over threads.
void AddInto(const Tensor& a, const Tensor& b, Tensor* out) {
  DispatchDType(out->dtype(), [&](auto zero) {
    using T = decltype(zero);
    ParallelBinaryLoop(a.data<T>(), b.data<T>(), out->data<T>(), out->numel(),
                       [](T x, T y) { return x + y; });
  });
}

// ||g_b|| for every row b of g, bitwise as SampleState computes it from a
// float64 RowMatrix holding g. Eigen's vectorised sum groups the terms its own
// way (a fixed-order sum such as FixedPointSolver::SquaredNorms would change
// the last bits of about one norm in ten, and so of every result), so Eigen
// sums float64 rows here too: the tensor's own rows if it is float64, else
// each row converted into a float64 scratch row (from the tensor pool). Where
// a row starts in memory does not matter: Eigen's sum of squares starts its
// SIMD lanes at the first element.
std::vector<double> RowNorms(const Tensor& g) {
  const int64_t batch = g.dim(0);
  const int64_t n = g.dim(1);
  const auto norm = [n](const double* row) {
    return Eigen::Map<const Eigen::RowVectorXd>(row, n).norm();
  };
  std::vector<double> norms(batch);
  if (g.dtype() == DType::kFloat64) {
    for (int64_t b = 0; b < batch; ++b) norms[b] = norm(g.data<double>() + b * n);
    return norms;
  }
  Tensor row64(Shape{n}, DType::kFloat64);
  for (int64_t b = 0; b < batch; ++b) {
    const float* row = g.data<float>() + b * n;
    std::copy(row, row + n, row64.data<double>());  // converts to float64
    norms[b] = norm(row64.data<double>());
  }
  return norms;
}

// 1 / ||g_b||, or 0 for g_b = 0 (whose adjoint solution is 0).
std::vector<double> InverseNorms(const std::vector<double>& norms) {
  std::vector<double> inverse(norms.size());
  for (size_t b = 0; b < norms.size(); ++b) inverse[b] = norms[b] > 0 ? 1.0 / norms[b] : 0.0;
  return inverse;
}

// out_b = in_b * scale[b] for every row b, each product computed in float64
// and rounded once to out's dtype. in and out are [B, n], of any dtypes.
void ScaleRows(const Tensor& in, const std::vector<double>& scale, Tensor* out) {
  const int64_t n = in.dim(1);
  DispatchDType(in.dtype(), [&](auto in_zero) {
    DispatchDType(out->dtype(), [&](auto out_zero) {
      using In = decltype(in_zero);
      using Out = decltype(out_zero);
      const In* x = in.data<In>();
      Out* y = out->data<Out>();
      ParallelOverSamples(in.dim(0), [&](int64_t b) {
        const double s = scale[b];
        for (int64_t i = b * n; i < (b + 1) * n; ++i) {
          y[i] = static_cast<Out>(static_cast<double>(x[i]) * s);
        }
      });
    });
  });
}

template <typename T>
bool AllFinite(const T* x, int64_t n) {
  return std::all_of(x, x + n, [](T v) { return std::isfinite(v); });
}

// For a fixed budget of plain iterations: every sample whose returned iterate
// in *u is the last map input takes the map value there, its K-th iterate, as
// its solution and counts that iteration (a sample whose residual grew keeps
// its best earlier iterate; so does one whose map value is not finite).
void TakeLastIterates(const Tensor& last_input,
                      const Tensor& last_output,
                      Tensor* u,
                      std::vector<int>* iterations) {
  const int64_t n = u->dim(1);
  DispatchDType(u->dtype(), [&](auto zero) {
    using T = decltype(zero);
    for (int64_t b = 0; b < u->dim(0); ++b) {
      T* returned = u->data<T>() + b * n;
      const T* input = last_input.data<T>() + b * n;
      const T* value = last_output.data<T>() + b * n;
      if (std::equal(returned, returned + n, input) && AllFinite(value, n)) {
        std::copy(value, value + n, returned);
        ++(*iterations)[b];
      }
    }
  });
}

// The normalised adjoint map u -> g_b / ||g_b|| + J^T u on tensors of the
// state's dtype, as the FixedPointProblem map of SolveWithFixedPointSolver.
// Buffers that only calls on some samples need are made at the first such
// call.
class NormalisedAdjointMap {
 public:
  NormalisedAdjointMap(const BatchedVjp& vjp,
                       const Tensor& g,
                       const std::vector<double>& inverse_norm)
      : vjp_(vjp),
        g_(g),
        inverse_norm_(inverse_norm),
        unit_gradient_(g.shape(), g.dtype()),
        jt_u_(g.shape(), g.dtype()) {
    ScaleRows(g, inverse_norm, &unit_gradient_);
  }

  bool operator()(const Tensor& u, const std::vector<int64_t>& ids, Tensor* out) {
    if (IsWholeBatch(ids, g_.dim(0))) {
      EvaluateWholeBatch(u, out);
    } else {
      EvaluateSomeSamples(u, ids, out);
    }
    return true;
  }

  int64_t vjp_calls() const { return vjp_calls_; }
  // The input and value of the last call on the whole batch: views of the
  // forward solver's current-iterate and map-value buffers, which it keeps
  // up to date for every sample, also through calls on some samples only
  // (it gathers their rows from the one and scatters the results into the
  // other). At the end they hold each sample's last iterate and its map
  // value. Empty if no call was on the whole batch.
  const Tensor& last_input() const { return last_input_; }
  const Tensor& last_output() const { return last_output_; }

 private:
  // Every sample at once (each iteration of a fixed budget): the VJP reads u
  // as it is, and its result plus the unit gradient is written into out in
  // one pass.
  void EvaluateWholeBatch(const Tensor& u, Tensor* out) {
    const Tensor jt_u = CallVjp(vjp_, u, jt_u_);
    ++vjp_calls_;
    AddInto(jt_u, unit_gradient_, out);
    last_input_ = u;
    last_output_ = *out;
  }

  // The samples `ids` only (u and out hold their rows, compacted). The VJP
  // takes the whole batch: the other rows are zero, which adds nothing to the
  // rows asked for since samples are independent. As in the float64 path the sum
  // g_b / ||g_b|| + J^T u is formed in float64 from the unrounded quotient.
  void EvaluateSomeSamples(const Tensor& u, const std::vector<int64_t>& ids, Tensor* out) {
    if (!batch_in_.defined()) {
      batch_in_ = Tensor(g_.shape(), g_.dtype());
      batch_out_ = Tensor(g_.shape(), g_.dtype());
    }
    const int64_t n = g_.dim(1);
    const Tensor& unit_gradient = UnitGradientInFloat64();
    batch_in_.Fill(0.0);
    DispatchDType(g_.dtype(), [&](auto zero) {
      using T = decltype(zero);
      for (size_t i = 0; i < ids.size(); ++i) {
        const T* row = u.data<T>() + i * n;
        std::copy(row, row + n, batch_in_.data<T>() + ids[i] * n);
      }
      const Tensor jt_u = CallVjp(vjp_, batch_in_, batch_out_);
      ++vjp_calls_;
      for (size_t i = 0; i < ids.size(); ++i) {
        const double* unit = unit_gradient.data<double>() + ids[i] * n;
        const T* jt_u_row = jt_u.data<T>() + ids[i] * n;
        T* result = out->data<T>() + i * n;
        for (int64_t j = 0; j < n; ++j) {
          result[j] = static_cast<T>(unit[j] + static_cast<double>(jt_u_row[j]));
        }
      }
    });
  }

  // g_b / ||g_b|| in float64: unit_gradient_ itself for float64 states, else
  // made at the first call. (Multiplying on the fly would let the compiler
  // fuse the product into the sum and round differently.)
  const Tensor& UnitGradientInFloat64() {
    if (unit_gradient_.dtype() == DType::kFloat64) return unit_gradient_;
    if (!unit_gradient64_.defined()) {
      unit_gradient64_ = Tensor(g_.shape(), DType::kFloat64);
      ScaleRows(g_, inverse_norm_, &unit_gradient64_);
    }
    return unit_gradient64_;
  }

  const BatchedVjp& vjp_;
  Tensor g_;  // shares the caller's storage
  const std::vector<double>& inverse_norm_;
  Tensor unit_gradient_;         // g_b / ||g_b|| in the state's dtype
  Tensor unit_gradient64_;       // the same in float64 (float32 states, partial calls)
  Tensor jt_u_;                  // [B, n], the VJP's output for whole-batch calls
  Tensor batch_in_, batch_out_;  // [B, n], for partial calls
  Tensor last_input_, last_output_;
  int64_t vjp_calls_ = 0;
};

// A fixed budget of plain iterations (tolerance 0: the DEQ literature's
// adjoint).
bool IsPlainBudget(const BackwardOptions& options) {
  return options.solver == AdjointSolverType::kFixedPoint && options.tolerance == 0.0 &&
         options.max_iterations >= 1;
}

// The options of the forward solver `type` that solve the normalised adjoint
// equation to options.tolerance. Anderson and Broyden take their history
// size from the backward options; every other forward option keeps its
// default (the summary lists them).
ForwardSolverOptions ForwardOptionsFor(const BackwardOptions& options, ForwardSolverType type) {
  ForwardSolverOptions forward;
  forward.type = type;
  if (type == ForwardSolverType::kPicard) forward.picard_damping = 1.0;
  if (type == ForwardSolverType::kAnderson) forward.anderson_memory = options.anderson_memory;
  if (type == ForwardSolverType::kBroyden) forward.broyden_memory = options.broyden_memory;
  forward.max_iterations = options.max_iterations;
  forward.stagnation_window = options.stagnation_window;
  forward.stop_mode = StopMode::kAbsolute;
  forward.absolute_tolerance = options.tolerance;
  // A plain budget makes exactly max_iterations VJPs, as K iterations
  // u_{k+1} = g + J^T u_k do: the solver takes K - 1 judged steps, and the
  // map value it computed to judge its last iterate is the K-th iterate.
  // (Otherwise a last VJP would only measure the returned iterate's
  // residual.)
  if (IsPlainBudget(options)) forward.max_iterations = options.max_iterations - 1;
  return forward;
}

}  // namespace

// Runs a forward fixed-point solver on the normalised adjoint map
// u -> g_b / ||g_b|| + J^T u, from u0 = w0 / ||g_b|| (w0 = *w if defined,
// else g), and writes w = ||g_b|| u into *w. With ||g_b|| scaled to 1, the
// forward absolute residual ||f(u) - u|| is exactly the relative adjoint
// residual, so the forward absolute stopping rule implements the adjoint
// tolerance.
void SolveWithFixedPointSolver(const BackwardOptions& options,
                               ForwardSolverType forward_type,
                               const BatchedVjp& vjp,
                               const Tensor& g,
                               Tensor* w,
                               AdjointSummary* summary) {
  const int64_t batch = g.dim(0);
  const std::vector<double> g_norm = RowNorms(g);
  const std::vector<double> inverse_norm = InverseNorms(g_norm);
  const ForwardSolverOptions forward = ForwardOptionsFor(options, forward_type);
  const bool plain_budget = IsPlainBudget(options);

  NormalisedAdjointMap map(vjp, g, inverse_norm);
  FixedPointProblem problem;
  problem.batch_size = batch;
  problem.state_size = g.dim(1);
  problem.map = [&map](const Tensor& u, const std::vector<int64_t>& ids, Tensor* out) {
    return map(u, ids, out);
  };

  Tensor u(g.shape(), g.dtype());
  ScaleRows(w->defined() ? *w : g, inverse_norm, &u);
  SolverSummary forward_summary = SolveFixedPoint(forward, problem, &u);
  if (plain_budget && map.last_input().defined()) {
    TakeLastIterates(map.last_input(), map.last_output(), &u, &forward_summary.sample_iterations);
  }
  if (!w->defined()) *w = Tensor(g.shape(), g.dtype());
  ScaleRows(u, g_norm, w);

  summary->sample_iterations = forward_summary.sample_iterations;
  summary->sample_termination = forward_summary.sample_termination;
  summary->sample_rel_residual = forward_summary.sample_abs_residual;
  summary->sample_abs_residual.resize(batch);
  for (int64_t b = 0; b < batch; ++b) {
    summary->sample_abs_residual[b] = forward_summary.sample_abs_residual[b] * g_norm[b];
  }
  summary->rel_residual_trace = forward_summary.abs_residual_trace;
  summary->vjp_evaluations = map.vjp_calls();
  summary->history_bytes = forward_summary.history_bytes;
  summary->option_usage = forward_summary.option_usage;
  if (plain_budget) {
    summary->message = "plain fixed-point iteration on the adjoint equation, a fixed budget of " +
                       std::to_string(options.max_iterations) + " iterations (" +
                       std::to_string(map.vjp_calls()) +
                       " VJPs); the residuals are those of the last iterate before the final "
                       "one, which the final VJP produced (measuring the final one would cost "
                       "one VJP more)";
    return;
  }
  summary->message = "the " + std::string(ToString(forward.type)) +
                     " forward solver on the adjoint equation: " + forward_summary.message;
}

}  // namespace stillpoint::adjoint
