#include "solvers/adjoint.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "framework/check.h"
#include "framework/parallel.h"
#include "framework/parallel_loops.h"
#include "solvers/enum_names.h"
#include "solvers/fixed_point_solver.h"
#include "solvers/report_format.h"

namespace stillpoint {
namespace {

using report::FormatBytes;
using report::FormatDouble;
using report::FormatTime;

// Samples are rows; the Krylov solvers keep their vectors in float64 whatever
// the state's dtype (orthogonality is lost quickly in float32).
using RowMatrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

void TensorToMatrix(const Tensor& tensor, RowMatrix* matrix) {
  DispatchDType(tensor.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* data = tensor.data<T>();
    double* out = matrix->data();
    const int64_t n = tensor.numel();
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<double>(data[i]);
  });
}

void MatrixToTensor(const RowMatrix& matrix, Tensor* tensor) {
  DispatchDType(tensor->dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* data = tensor->data<T>();
    const double* in = matrix.data();
    const int64_t n = tensor->numel();
    for (int64_t i = 0; i < n; ++i) data[i] = static_cast<T>(in[i]);
  });
}

// Whether ids are 0, 1, ..., batch - 1.
bool IsWholeBatch(const std::vector<int64_t>& ids, int64_t batch) {
  if (static_cast<int64_t>(ids.size()) != batch) return false;
  for (int64_t i = 0; i < batch; ++i) {
    if (ids[i] != i) return false;
  }
  return true;
}

// out = a + b (same shape and dtype), spread over threads.
void AddInto(const Tensor& a, const Tensor& b, Tensor* out) {
  DispatchDType(out->dtype(), [&](auto zero) {
    using T = decltype(zero);
    internal::BinaryLoop(a.data<T>(), b.data<T>(), out->data<T>(), out->numel(),
                         [](T x, T y) { return x + y; });
  });
}

// Calls the VJP with *out as its preallocated output and returns the tensor
// that holds the result: *out, or the tensor the VJP rebound its output to
// (BatchedVjp). *out itself keeps its own storage, so it is never shared with
// whatever the VJP returned.
Tensor CallVjp(const BatchedVjp& vjp, const Tensor& v, const Tensor& out) {
  Tensor result = out;
  vjp(v, &result);
  SP_CHECK(result.shape() == out.shape() && result.dtype() == out.dtype(),
           "SolveAdjoint: the VJP gave a ", ToString(result.dtype()), " tensor of shape ",
           result.shape(), " but ", ToString(out.dtype()), " ", out.shape(), " was expected");
  return result;
}

// The operator of (*) on float64 rows: ApplyTransposedJacobian gives J^T v,
// Apply gives (I - J^T) v. Owns the dtype-converted buffers handed to the
// VJP, so applying it allocates nothing after construction.
class AdjointOperator {
 public:
  AdjointOperator(const BatchedVjp& vjp, int64_t batch_size, int64_t state_size, DType dtype)
      : vjp_(vjp),
        input_(Shape{batch_size, state_size}, dtype),
        output_(Shape{batch_size, state_size}, dtype) {}

  void ApplyTransposedJacobian(const RowMatrix& v, RowMatrix* out) {
    MatrixToTensor(v, &input_);
    const Tensor jt_v = CallVjp(vjp_, input_, output_);
    ++calls_;
    TensorToMatrix(jt_v, out);
  }

  void Apply(const RowMatrix& v, RowMatrix* out) {
    ApplyTransposedJacobian(v, out);
    *out = v - *out;
  }

  int64_t calls() const { return calls_; }

 private:
  const BatchedVjp& vjp_;
  Tensor input_;
  Tensor output_;
  int64_t calls_ = 0;
};

// Per-sample bookkeeping shared by the solvers implemented here.
struct SampleState {
  std::vector<double> g_norm;     // ||g_b||
  std::vector<double> threshold;  // tolerance * ||g_b||
  std::vector<int> iterations;
  std::vector<TerminationType> termination;  // provisional until Finalize
  std::vector<char> active;

  SampleState(const RowMatrix& g, double tolerance) {
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

  bool AnyActive() const {
    return std::any_of(active.begin(), active.end(), [](char a) { return a != 0; });
  }
  void End(int64_t b, TerminationType type) {
    active[b] = 0;
    termination[b] = type;
  }
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

void ParallelOverSamples(int64_t batch, const std::function<void(int64_t)>& fn) {
  ParallelFor(0, batch, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) fn(b);
  });
}

// ---------------------------------------------------------------- finalize

// Computes the true residual of every sample (one VJP unless `residual`
// already holds g - (I - J^T) w), replaces non-finite solutions by g and
// fills the per-sample part of the summary.
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
    } else if (type == TerminationType::kConverged) {
      // A recurrence (CG, MINRES) estimated convergence that the true
      // residual does not confirm (rounding).
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

// ------------------------------------------- forward solvers on the adjoint
//
// fixed_point, anderson and broyden work on tensors of the state's dtype, not
// on float64 RowMatrix copies: in a fixed budget every map call is a
// whole-batch VJP that runs in place on the forward solver's own buffers, so
// [B, n] float64 copies would only add conversions and, each call, fresh
// pages. Where the float64 path computes in float64 (the scaling by ||g_b||),
// each value is still computed in float64 and rounded once to the state's
// dtype, so the results are bitwise those of the float64 rows.

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

bool UsesForwardSolver(AdjointSolverType type) {
  return type == AdjointSolverType::kFixedPoint || type == AdjointSolverType::kAnderson ||
         type == AdjointSolverType::kBroyden;
}

// A fixed budget of plain iterations (tolerance 0: the DEQ literature's
// adjoint).
bool IsPlainBudget(const BackwardOptions& options) {
  return options.solver == AdjointSolverType::kFixedPoint && options.tolerance == 0.0 &&
         options.max_iterations >= 1;
}

// The forward solver options that solve the normalised adjoint equation to
// options.tolerance.
ForwardSolverOptions ForwardOptionsFor(const BackwardOptions& options) {
  ForwardSolverOptions forward;
  switch (options.solver) {
    case AdjointSolverType::kFixedPoint:
      forward.type = ForwardSolverType::kPicard;
      forward.picard_damping = 1.0;
      break;
    case AdjointSolverType::kAnderson:
      forward.type = ForwardSolverType::kAnderson;
      forward.anderson_memory = options.anderson_memory;
      break;
    case AdjointSolverType::kBroyden:
      forward.type = ForwardSolverType::kBroyden;
      forward.broyden_memory = options.broyden_memory;
      break;
    default:
      SP_CHECK(false, "SolveAdjoint: ", ToString(options.solver), " is not a fixed-point solver");
  }
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

// Runs a forward fixed-point solver on the normalised adjoint map
// u -> g_b / ||g_b|| + J^T u, from u0 = w0 / ||g_b|| (w0 = *w if defined,
// else g), and writes w = ||g_b|| u into *w. With ||g_b|| scaled to 1, the
// forward absolute residual ||f(u) - u|| is exactly the relative adjoint
// residual, so the forward absolute stopping rule implements the adjoint
// tolerance.
void SolveWithFixedPointSolver(const BackwardOptions& options,
                               const BatchedVjp& vjp,
                               const Tensor& g,
                               Tensor* w,
                               AdjointSummary* summary) {
  const int64_t batch = g.dim(0);
  const std::vector<double> g_norm = RowNorms(g);
  const std::vector<double> inverse_norm = InverseNorms(g_norm);
  const ForwardSolverOptions forward = ForwardOptionsFor(options);
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

// ------------------------------------------------------------------ Neumann

void SolveNeumann(const BackwardOptions& options,
                  AdjointOperator* op,
                  const RowMatrix& g,
                  RowMatrix* w,
                  SampleState* samples,
                  AdjointSummary* summary) {
  const int64_t batch = g.rows();
  RowMatrix jt_w(g.rows(), g.cols());
  std::vector<double> residual(batch, 0.0);
  for (int term = 0; term < options.neumann_terms && samples->AnyActive(); ++term) {
    op->ApplyTransposedJacobian(*w, &jt_w);
    for (int64_t b = 0; b < batch; ++b) {
      if (!samples->active[b]) continue;
      const double r = (g.row(b) + jt_w.row(b) - w->row(b)).norm();
      residual[b] = r;
      // With tolerance 0 the truncated series of neumann_terms terms is what
      // was asked for: a residual that reaches exactly 0 in the VJP's
      // precision (a float32 map has its own fixed point) does not end it,
      // unless g_b = 0, whose solution w_b = 0 is exact.
      const bool may_stop = options.tolerance > 0.0 || samples->g_norm[b] == 0.0;
      if (!std::isfinite(r)) {
        samples->End(b, TerminationType::kNonFinite);
      } else if (may_stop && samples->Meets(b, r)) {
        samples->End(b, TerminationType::kConverged);
      }
    }
    TraceActive(*samples, residual, summary);
    for (int64_t b = 0; b < batch; ++b) {
      if (!samples->active[b]) continue;
      w->row(b) = g.row(b) + jt_w.row(b);
      ++samples->iterations[b];
    }
  }
}

// -------------------------------------------------------------------- GMRES

// Restarted GMRES(m) on (I - J^T) w = g, all samples at once: every
// iteration is one batched VJP, and each sample runs its own Arnoldi process
// (modified Gram-Schmidt, one reorthogonalisation pass) and Givens QR.
void SolveGmres(const BackwardOptions& options,
                AdjointOperator* op,
                const RowMatrix& g,
                RowMatrix* x,
                SampleState* samples,
                RowMatrix* final_residual,
                AdjointSummary* summary) {
  const int64_t batch = g.rows();
  const int64_t n = g.cols();
  const int m = static_cast<int>(std::min<int64_t>(options.gmres_restart, n));
  std::vector<RowMatrix> basis(m + 1, RowMatrix::Zero(batch, n));
  std::vector<Eigen::MatrixXd> hessenberg(batch, Eigen::MatrixXd::Zero(m + 1, m));
  std::vector<Eigen::VectorXd> cosines(batch, Eigen::VectorXd::Zero(m));
  std::vector<Eigen::VectorXd> sines(batch, Eigen::VectorXd::Zero(m));
  std::vector<Eigen::VectorXd> rhs(batch, Eigen::VectorXd::Zero(m + 1));
  std::vector<int> dimension(batch, 0);
  std::vector<char> in_cycle(batch, 0);
  std::vector<double> residual(batch, 0.0);
  RowMatrix product(batch, n);
  RowMatrix& r = *final_residual;
  summary->history_bytes =
      static_cast<int64_t>((m + 3) * batch * n + batch * (m + 1) * (m + 3)) * 8;

  while (true) {
    op->Apply(*x, &product);
    r = g - product;
    for (int64_t b = 0; b < batch; ++b) {
      if (!samples->active[b]) continue;
      residual[b] = r.row(b).norm();
      if (!std::isfinite(residual[b])) {
        samples->End(b, TerminationType::kNonFinite);
      } else if (samples->Meets(b, residual[b])) {
        samples->End(b, TerminationType::kConverged);
      } else if (samples->iterations[b] >= options.max_iterations) {
        samples->End(b, TerminationType::kMaxIterations);
      }
    }
    if (!samples->AnyActive()) break;
    TraceActive(*samples, residual, summary);

    for (int64_t b = 0; b < batch; ++b) {
      dimension[b] = 0;
      in_cycle[b] = samples->active[b];
      if (in_cycle[b]) {
        basis[0].row(b) = r.row(b) / residual[b];
        rhs[b].setZero();
        rhs[b](0) = residual[b];
        hessenberg[b].setZero();
      }
    }
    for (int j = 0; j < m; ++j) {
      if (std::none_of(in_cycle.begin(), in_cycle.end(), [](char c) { return c != 0; })) break;
      for (int64_t b = 0; b < batch; ++b) {
        if (!in_cycle[b]) basis[j].row(b).setZero();
      }
      op->Apply(basis[j], &product);
      ParallelOverSamples(batch, [&](int64_t b) {
        if (!in_cycle[b]) return;
        Eigen::MatrixXd& h = hessenberg[b];
        Eigen::Ref<Eigen::RowVectorXd> v = product.row(b);
        if (!v.allFinite()) {
          in_cycle[b] = 0;
          samples->End(b, TerminationType::kNonFinite);
          return;
        }
        for (int pass = 0; pass < 2; ++pass) {
          for (int i = 0; i <= j; ++i) {
            const double coefficient = basis[i].row(b).dot(v);
            v -= coefficient * basis[i].row(b);
            h(i, j) += coefficient;
          }
        }
        const double next_norm = v.norm();
        h(j + 1, j) = next_norm;
        for (int i = 0; i < j; ++i) {
          const double top = cosines[b](i) * h(i, j) + sines[b](i) * h(i + 1, j);
          h(i + 1, j) = -sines[b](i) * h(i, j) + cosines[b](i) * h(i + 1, j);
          h(i, j) = top;
        }
        const double radius = std::hypot(h(j, j), h(j + 1, j));
        if (!(radius > 0.0)) {
          // (I - J^T) is singular on the Krylov space: no update from column j.
          in_cycle[b] = 0;
          samples->End(b, TerminationType::kLinearAlgebraFailure);
          return;
        }
        cosines[b](j) = h(j, j) / radius;
        sines[b](j) = h(j + 1, j) / radius;
        h(j, j) = radius;
        h(j + 1, j) = 0.0;
        rhs[b](j + 1) = -sines[b](j) * rhs[b](j);
        rhs[b](j) = cosines[b](j) * rhs[b](j);
        dimension[b] = j + 1;
        ++samples->iterations[b];
        residual[b] = std::abs(rhs[b](j + 1));
        const bool breakdown = next_norm <= 1e-14 * radius;
        if (breakdown || samples->Meets(b, residual[b]) ||
            samples->iterations[b] >= options.max_iterations) {
          in_cycle[b] = 0;  // the restart check judges the true residual
        } else {
          basis[j + 1].row(b) = v / next_norm;
        }
      });
      TraceActive(*samples, residual, summary);
    }
    ParallelOverSamples(batch, [&](int64_t b) {
      const int k = dimension[b];
      if (k == 0) return;
      const Eigen::VectorXd y =
          hessenberg[b].topLeftCorner(k, k).triangularView<Eigen::Upper>().solve(rhs[b].head(k));
      for (int i = 0; i < k; ++i) x->row(b) += y(i) * basis[i].row(b);
    });
  }
}

// ----------------------------------------------------------------------- CG

void SolveConjugateGradient(const BackwardOptions& options,
                            AdjointOperator* op,
                            const RowMatrix& g,
                            RowMatrix* x,
                            SampleState* samples,
                            AdjointSummary* summary) {
  const int64_t batch = g.rows();
  const int64_t n = g.cols();
  RowMatrix r(batch, n);
  RowMatrix direction(batch, n);
  RowMatrix product(batch, n);
  summary->history_bytes = 3 * batch * n * 8;
  op->Apply(*x, &product);
  r = g - product;
  direction = r;
  std::vector<double> rr(batch);
  std::vector<double> residual(batch);
  for (int64_t b = 0; b < batch; ++b) {
    rr[b] = r.row(b).squaredNorm();
    residual[b] = std::sqrt(rr[b]);
  }
  while (true) {
    for (int64_t b = 0; b < batch; ++b) {
      if (!samples->active[b]) continue;
      if (!std::isfinite(residual[b])) {
        samples->End(b, TerminationType::kNonFinite);
      } else if (samples->Meets(b, residual[b])) {
        samples->End(b, TerminationType::kConverged);
      } else if (samples->iterations[b] >= options.max_iterations) {
        samples->End(b, TerminationType::kMaxIterations);
      }
    }
    if (!samples->AnyActive()) break;
    TraceActive(*samples, residual, summary);
    for (int64_t b = 0; b < batch; ++b) {
      if (!samples->active[b]) direction.row(b).setZero();
    }
    op->Apply(direction, &product);
    ParallelOverSamples(batch, [&](int64_t b) {
      if (!samples->active[b]) return;
      const double curvature = direction.row(b).dot(product.row(b));
      if (!std::isfinite(curvature)) {
        samples->End(b, TerminationType::kNonFinite);
        return;
      }
      if (!(curvature > 0.0)) {
        // I - J^T is not positive definite along this direction: CG does not
        // apply (use minres or gmres).
        samples->End(b, TerminationType::kLinearAlgebraFailure);
        return;
      }
      const double alpha = rr[b] / curvature;
      x->row(b) += alpha * direction.row(b);
      r.row(b) -= alpha * product.row(b);
      const double rr_next = r.row(b).squaredNorm();
      direction.row(b) = r.row(b) + (rr_next / rr[b]) * direction.row(b);
      rr[b] = rr_next;
      residual[b] = std::sqrt(rr_next);
      ++samples->iterations[b];
    });
  }
}

// ------------------------------------------------------------------- MINRES

// MINRES (Paige and Saunders) without preconditioning: symmetric Lanczos on
// I - J^T, with the tridiagonal least-squares problem updated by Givens
// rotations. The residual estimate is |prod of sines| * ||r0||.
void SolveMinres(const BackwardOptions& options,
                 AdjointOperator* op,
                 const RowMatrix& g,
                 RowMatrix* x,
                 SampleState* samples,
                 AdjointSummary* summary) {
  const int64_t batch = g.rows();
  const int64_t n = g.cols();
  RowMatrix v_old = RowMatrix::Zero(batch, n);
  RowMatrix v = RowMatrix::Zero(batch, n);
  RowMatrix v_next(batch, n);
  RowMatrix p = RowMatrix::Zero(batch, n);
  RowMatrix p_old = RowMatrix::Zero(batch, n);
  RowMatrix p_older = RowMatrix::Zero(batch, n);
  RowMatrix product(batch, n);
  summary->history_bytes = 7 * batch * n * 8;

  op->Apply(*x, &product);
  v_next = g - product;
  std::vector<double> beta_next(batch), beta_first(batch), residual(batch);
  std::vector<double> c(batch, 1.0), c_old(batch, 1.0), s(batch, 0.0), s_old(batch, 0.0);
  std::vector<double> eta(batch, 1.0);
  for (int64_t b = 0; b < batch; ++b) {
    beta_next[b] = v_next.row(b).norm();
    beta_first[b] = beta_next[b];
    residual[b] = beta_next[b];
  }
  std::vector<double> beta(batch, 0.0);
  while (true) {
    for (int64_t b = 0; b < batch; ++b) {
      if (!samples->active[b]) continue;
      if (!std::isfinite(residual[b])) {
        samples->End(b, TerminationType::kNonFinite);
      } else if (samples->Meets(b, residual[b])) {
        samples->End(b, TerminationType::kConverged);
      } else if (samples->iterations[b] >= options.max_iterations) {
        samples->End(b, TerminationType::kMaxIterations);
      }
    }
    if (!samples->AnyActive()) break;
    TraceActive(*samples, residual, summary);
    for (int64_t b = 0; b < batch; ++b) {
      if (!samples->active[b]) {
        v.row(b).setZero();
        continue;
      }
      if (!(beta_next[b] > 0.0)) {  // the Krylov space is exhausted: x is exact
        samples->End(b, TerminationType::kConverged);
        v.row(b).setZero();
        continue;
      }
      beta[b] = beta_next[b];
      v_old.row(b) = v.row(b);
      v.row(b) = v_next.row(b) / beta_next[b];
    }
    op->Apply(v, &product);
    ParallelOverSamples(batch, [&](int64_t b) {
      if (!samples->active[b]) return;
      v_next.row(b) = product.row(b) - beta[b] * v_old.row(b);
      const double alpha = v_next.row(b).dot(v.row(b));
      v_next.row(b) -= alpha * v.row(b);
      beta_next[b] = v_next.row(b).norm();
      if (!std::isfinite(alpha) || !std::isfinite(beta_next[b])) {
        samples->End(b, TerminationType::kNonFinite);
        return;
      }
      // Apply the two previous rotations to the new column of the
      // tridiagonal matrix, then make the rotation that zeroes beta_next.
      const double r2 = s[b] * alpha + c[b] * c_old[b] * beta[b];
      const double r3 = s_old[b] * beta[b];
      const double r1_hat = c[b] * alpha - c_old[b] * s[b] * beta[b];
      const double r1 = std::hypot(r1_hat, beta_next[b]);
      if (!(r1 > 0.0)) {
        samples->End(b, TerminationType::kLinearAlgebraFailure);
        return;
      }
      c_old[b] = c[b];
      s_old[b] = s[b];
      c[b] = r1_hat / r1;
      s[b] = beta_next[b] / r1;
      p_older.row(b) = p_old.row(b);
      p_old.row(b) = p.row(b);
      p.row(b) = (v.row(b) - r2 * p_old.row(b) - r3 * p_older.row(b)) / r1;
      x->row(b) += beta_first[b] * c[b] * eta[b] * p.row(b);
      residual[b] *= std::abs(s[b]);
      eta[b] = -s[b] * eta[b];
      ++samples->iterations[b];
      // An exhausted Krylov space (beta_next = 0) gives s = 0: the estimate
      // drops to 0 and the sample converges at the next check.
    });
  }
}

// -------------------------------------------------------------------- dense

void SolveDense(const BackwardOptions& options,
                AdjointOperator* op,
                const RowMatrix& g,
                RowMatrix* w,
                SampleState* samples,
                AdjointSummary* summary) {
  const int64_t batch = g.rows();
  const int64_t n = g.cols();
  SP_CHECK(n <= options.dense_max_state_size, "SolveAdjoint: the dense adjoint solver builds an ",
           n, " x ", n, " matrix per sample; the state size ", n,
           " exceeds dense_max_state_size = ", options.dense_max_state_size,
           " (use gmres or another iterative adjoint solver)");
  std::vector<Eigen::MatrixXd> system(batch, Eigen::MatrixXd(n, n));
  RowMatrix unit = RowMatrix::Zero(batch, n);
  RowMatrix column(batch, n);
  for (int64_t i = 0; i < n; ++i) {
    if (i > 0) unit.col(i - 1).setZero();
    unit.col(i).setOnes();
    // Row b of the result is J_b^T e_i, column i of J_b^T.
    op->ApplyTransposedJacobian(unit, &column);
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
}

// ------------------------------------------------------- float64 solvers

// GMRES, CG, MINRES, Neumann and dense, on float64 copies of g and w (the
// start: *w if defined, else g); writes the solution into *w.
void SolveOnFloat64Rows(const BackwardOptions& options,
                        const BatchedVjp& vjp,
                        const Tensor& g,
                        Tensor* w,
                        AdjointSummary* summary) {
  const int64_t batch = g.dim(0);
  const int64_t n = g.dim(1);
  RowMatrix g_matrix(batch, n);
  TensorToMatrix(g, &g_matrix);
  RowMatrix w_matrix(batch, n);
  if (w->defined()) {
    TensorToMatrix(*w, &w_matrix);
  } else {
    w_matrix = g_matrix;
  }

  SampleState samples(g_matrix, options.tolerance);
  AdjointOperator op(vjp, batch, n, g.dtype());
  RowMatrix residual(batch, n);
  const RowMatrix* known_residual = nullptr;
  switch (options.solver) {
    case AdjointSolverType::kNeumann:
      SolveNeumann(options, &op, g_matrix, &w_matrix, &samples, summary);
      summary->history_bytes = batch * n * 8;
      summary->message = "truncated Neumann series, " + std::to_string(options.neumann_terms) +
                         " terms requested.";
      break;
    case AdjointSolverType::kGmres:
      SolveGmres(options, &op, g_matrix, &w_matrix, &samples, &residual, summary);
      known_residual = &residual;
      summary->message =
          "restarted GMRES(" + std::to_string(std::min<int64_t>(options.gmres_restart, n)) + ").";
      if (options.gmres_restart > n) {
        summary->option_usage.push_back({"gmres_restart", std::to_string(options.gmres_restart),
                                         std::to_string(n),
                                         "a Krylov space cannot exceed the state size"});
      }
      break;
    case AdjointSolverType::kConjugateGradient:
      SolveConjugateGradient(options, &op, g_matrix, &w_matrix, &samples, summary);
      summary->message = "conjugate gradient (assumes I - J symmetric positive definite).";
      break;
    case AdjointSolverType::kMinres:
      SolveMinres(options, &op, g_matrix, &w_matrix, &samples, summary);
      summary->message = "MINRES (assumes I - J symmetric).";
      break;
    case AdjointSolverType::kDense:
      w_matrix = g_matrix;
      SolveDense(options, &op, g_matrix, &w_matrix, &samples, summary);
      summary->message = "dense LU of I - J^T assembled from " + std::to_string(n) + " VJPs.";
      if (options.warm_start) {
        summary->option_usage.push_back(
            {"warm_start", "true", "false", "the dense solve is exact and needs no start"});
      }
      break;
    default:
      break;
  }
  Finalize(&op, g_matrix, known_residual, &samples, &w_matrix, summary);
  summary->vjp_evaluations = op.calls();
  if (!w->defined()) *w = Tensor(g.shape(), g.dtype());
  MatrixToTensor(w_matrix, w);
}

}  // namespace

// ------------------------------------------------------------------- enums

const char* ToString(BackwardMode mode) {
  switch (mode) {
    case BackwardMode::kIft:
      return "ift";
    case BackwardMode::kJfb:
      return "jfb";
    case BackwardMode::kPhantom:
      return "phantom";
    case BackwardMode::kUnrolled:
      return "unrolled";
  }
  return "unknown";
}

bool StringToBackwardMode(const std::string& text, BackwardMode* mode) {
  return internal::ParseEnumByName(
      text,
      std::initializer_list<BackwardMode>{BackwardMode::kIft, BackwardMode::kJfb,
                                          BackwardMode::kPhantom, BackwardMode::kUnrolled},
      mode);
}

const char* ToString(AdjointSolverType type) {
  switch (type) {
    case AdjointSolverType::kFixedPoint:
      return "fixed_point";
    case AdjointSolverType::kAnderson:
      return "anderson";
    case AdjointSolverType::kBroyden:
      return "broyden";
    case AdjointSolverType::kGmres:
      return "gmres";
    case AdjointSolverType::kConjugateGradient:
      return "cg";
    case AdjointSolverType::kMinres:
      return "minres";
    case AdjointSolverType::kNeumann:
      return "neumann";
    case AdjointSolverType::kDense:
      return "dense";
  }
  return "unknown";
}

std::vector<AdjointSolverType> AllAdjointSolverTypes() {
  return {AdjointSolverType::kFixedPoint,        AdjointSolverType::kAnderson,
          AdjointSolverType::kBroyden,           AdjointSolverType::kGmres,
          AdjointSolverType::kConjugateGradient, AdjointSolverType::kMinres,
          AdjointSolverType::kNeumann,           AdjointSolverType::kDense};
}

bool StringToAdjointSolverType(const std::string& text, AdjointSolverType* type) {
  return internal::ParseEnumByName(text, AllAdjointSolverTypes(), type);
}

// ------------------------------------------------------------------ options

bool BackwardOptions::IsValid(std::string* error) const {
  std::ostringstream message;
  auto check = [&](bool ok, const char* field, const auto& value, const char* requirement) {
    if (!ok && message.tellp() == 0) {
      message << "BackwardOptions: " << field << " = " << value << " must be " << requirement;
    }
  };
  check(max_iterations >= 0, "max_iterations", max_iterations, ">= 0");
  check(std::isfinite(tolerance) && tolerance >= 0, "tolerance", tolerance,
        "finite and >= 0 (0 runs a fixed budget)");
  check(gmres_restart >= 1 && gmres_restart <= 512, "gmres_restart", gmres_restart, "in [1, 512]");
  check(anderson_memory >= 1 && anderson_memory <= 64, "anderson_memory", anderson_memory,
        "in [1, 64]");
  check(broyden_memory >= 1 && broyden_memory <= 256, "broyden_memory", broyden_memory,
        "in [1, 256]");
  check(stagnation_window >= 0, "stagnation_window", stagnation_window, ">= 0 (0 disables)");
  check(neumann_terms >= 0, "neumann_terms", neumann_terms, ">= 0");
  check(dense_max_state_size >= 1, "dense_max_state_size", dense_max_state_size, ">= 1");
  check(phantom_steps >= 1, "phantom_steps", phantom_steps, ">= 1");
  check(phantom_tau > 0 && phantom_tau <= 1, "phantom_tau", phantom_tau, "in (0, 1]");
  check(unrolled_steps >= 1, "unrolled_steps", unrolled_steps, ">= 1");
  const bool ok = message.tellp() == 0;
  if (!ok && error != nullptr) *error = message.str();
  return ok;
}

std::string BackwardOptions::ToString() const {
  std::ostringstream out;
  out << "mode: " << stillpoint::ToString(mode) << "\n"
      << "solver: " << stillpoint::ToString(solver) << "\n"
      << "max_iterations: " << max_iterations << "\n"
      << "tolerance: " << tolerance << "\n"
      << "gmres_restart: " << gmres_restart << "\n"
      << "anderson_memory: " << anderson_memory << "\n"
      << "broyden_memory: " << broyden_memory << "\n"
      << "stagnation_window: " << stagnation_window << "\n"
      << "neumann_terms: " << neumann_terms << "\n"
      << "dense_max_state_size: " << dense_max_state_size << "\n"
      << "warm_start: " << (warm_start ? "true" : "false") << "\n"
      << "phantom_steps: " << phantom_steps << "\n"
      << "phantom_tau: " << phantom_tau << "\n"
      << "unrolled_steps: " << unrolled_steps << "\n";
  return out.str();
}

// ------------------------------------------------------------------ summary

bool AdjointSummary::IsUsable() const {
  if (sample_termination.empty()) return false;
  return std::all_of(sample_termination.begin(), sample_termination.end(),
                     [](TerminationType t) { return t == TerminationType::kConverged; });
}

double AdjointSummary::MaxRelResidual() const {
  double worst = 0.0;
  for (double r : sample_rel_residual) worst = std::max(worst, r);
  return worst;
}

int64_t AdjointSummary::CountSamples(TerminationType type) const {
  return std::count(sample_termination.begin(), sample_termination.end(), type);
}

std::string AdjointSummary::BriefReport() const {
  std::ostringstream out;
  out << ToString(mode);
  if (mode == BackwardMode::kIft) out << "/" << ToString(solver);
  out << ": " << ToString(termination_type) << ", " << CountSamples(TerminationType::kConverged)
      << "/" << batch_size << " converged, " << iterations << " iterations, " << vjp_evaluations
      << " VJPs, max rel residual "
      << (HasResiduals() ? FormatDouble("%.3g", MaxRelResidual()) : std::string("n/a"));
  if (tolerance > 0.0) {
    const bool met = HasResiduals() && MaxRelResidual() <= tolerance;
    out << " (tolerance " << FormatDouble("%.3g", tolerance) << (met ? ")" : " NOT MET)");
  }
  out << ", " << FormatTime(wall_time_seconds);
  if (warm_started) out << ", warm start";
  return out.str();
}

std::string AdjointSummary::FullReport() const {
  std::ostringstream out;
  report::WriteReportPreamble(*this, out);
  out << "effort: " << iterations << " iterations, " << vjp_evaluations << " batched VJPs\n";
  out << "memory: " << FormatBytes(history_bytes) << " of solver buffers\n";
  out << "time: " << FormatTime(wall_time_seconds) << "\n";
  if (!option_usage.empty()) {
    out << "options given vs used:\n";
    for (const OptionUsage& usage : option_usage) {
      out << "  " << usage.name << ": " << usage.requested << " requested / " << usage.used
          << " used";
      if (!usage.note.empty()) out << " (" << usage.note << ")";
      out << "\n";
    }
  }
  if (!rel_residual_trace.empty()) {
    out << "trace (max rel residual over active samples):\n";
    for (size_t k = 0; k < rel_residual_trace.size(); ++k) {
      out << "  " << k << ": " << FormatDouble("%.4e", rel_residual_trace[k]) << "\n";
    }
  }
  if (batch_size <= 16) {
    for (size_t b = 0; b < sample_termination.size(); ++b) {
      // A residual that was never measured prints as n/a, never as 0.
      out << "  sample " << b << ": " << ToString(sample_termination[b]) << " after "
          << (b < sample_iterations.size() ? sample_iterations[b] : 0) << " iterations, abs "
          << (b < sample_abs_residual.size() ? FormatDouble("%.3e", sample_abs_residual[b])
                                             : std::string("n/a"))
          << ", rel "
          << (b < sample_rel_residual.size() ? FormatDouble("%.3e", sample_rel_residual[b])
                                             : std::string("n/a"))
          << "\n";
    }
  }
  return out.str();
}

// -------------------------------------------------------------- SolveAdjoint

AdjointSummary SolveAdjoint(const BackwardOptions& options,
                            const BatchedVjp& vjp,
                            const Tensor& g,
                            Tensor* w) {
  const auto start = std::chrono::steady_clock::now();
  std::string error;
  SP_CHECK(options.IsValid(&error), "SolveAdjoint: ", error);
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

  AdjointSummary summary;
  summary.mode = BackwardMode::kIft;
  summary.solver = options.solver;
  summary.batch_size = batch;
  summary.state_size = n;
  summary.warm_started = warm && options.solver != AdjointSolverType::kDense;

  // The forward solvers work on the state's tensors, the others on float64
  // copies (see SolveWithFixedPointSolver).
  if (UsesForwardSolver(options.solver)) {
    SolveWithFixedPointSolver(options, vjp, g, w, &summary);
  } else {
    SolveOnFloat64Rows(options, vjp, g, w, &summary);
  }

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
