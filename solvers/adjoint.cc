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
#include "framework/elementwise_kernels.h"
#include "framework/parallel.h"
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

// out += addend (same shape and dtype), spread over threads.
void AddInPlace(const Tensor& addend, Tensor* out) {
  DispatchDType(out->dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* o = out->data<T>();
    internal::BinaryLoop(o, addend.data<T>(), o, out->numel(), [](T x, T y) { return x + y; });
  });
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
    vjp_(input_, &output_);
    ++calls_;
    TensorToMatrix(output_, out);
  }

  void Apply(const RowMatrix& v, RowMatrix* out) {
    ApplyTransposedJacobian(v, out);
    *out = v - *out;
  }

  // out = J^T v on tensors of the state's dtype and shape [batch, n].
  void ApplyTransposedJacobianInPlace(const Tensor& v, Tensor* out) {
    vjp_(v, out);
    ++calls_;
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
    } else if (samples->Meets(b, abs_residual)) {
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

// Runs a forward fixed-point solver on the normalised adjoint map
// u -> g_b / ||g_b|| + J^T u. With ||g_b|| scaled to 1, the forward absolute
// residual ||f(u) - u|| is exactly the relative adjoint residual, so the
// forward absolute stopping rule implements the adjoint tolerance.
void SolveWithFixedPointSolver(const BackwardOptions& options,
                               const BatchedVjp& vjp,
                               const Tensor& g_tensor,
                               const RowMatrix& g,
                               const RowMatrix& w0,
                               RowMatrix* w,
                               AdjointSummary* summary) {
  const int64_t batch = g.rows();
  const int64_t n = g.cols();
  const DType dtype = g_tensor.dtype();
  SampleState samples(g, options.tolerance);

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
  forward.stop_mode = StopMode::kAbsolute;
  forward.absolute_tolerance = options.tolerance;
  // A fixed budget of plain iterations (tolerance 0: the DEQ literature's
  // adjoint) makes exactly max_iterations VJPs, as K iterations
  // u_{k+1} = g + J^T u_k do: the solver takes K - 1 judged steps, and the
  // map value it computed to judge its last iterate is the K-th iterate.
  // (Otherwise a last VJP would only measure the returned iterate's
  // residual.)
  const bool plain_budget = options.solver == AdjointSolverType::kFixedPoint &&
                            options.tolerance == 0.0 && options.max_iterations >= 1;
  if (plain_budget) forward.max_iterations = options.max_iterations - 1;

  RowMatrix g_unit(batch, n);
  RowMatrix u0(batch, n);
  for (int64_t b = 0; b < batch; ++b) {
    const double scale = samples.g_norm[b] > 0 ? 1.0 / samples.g_norm[b] : 0.0;
    g_unit.row(b) = g.row(b) * scale;
    u0.row(b) = w0.row(b) * scale;
  }

  AdjointOperator op(vjp, batch, n, dtype);
  RowMatrix full_in = RowMatrix::Zero(batch, n);
  RowMatrix full_out(batch, n);
  // The normalised gradient in the state's dtype, for the whole-batch path.
  Tensor g_unit_tensor(Shape{batch, n}, dtype);
  MatrixToTensor(g_unit, &g_unit_tensor);
  FixedPointProblem problem;
  problem.batch_size = batch;
  problem.state_size = n;
  // The last whole-batch map input and output (views of the solver's own
  // buffers, which hold the last iterate and its map value at the end).
  Tensor last_input, last_output;
  problem.map = [&](const Tensor& u, const std::vector<int64_t>& ids, Tensor* out) {
    if (IsWholeBatch(ids, batch)) {
      // Every sample at once (each iteration of a fixed budget): the VJP
      // reads u and writes out as they are, with no float64 round trip.
      op.ApplyTransposedJacobianInPlace(u, out);
      AddInPlace(g_unit_tensor, out);
      last_input = u;
      last_output = *out;
      return true;
    }
    last_input = Tensor();
    last_output = Tensor();
    // Rows of other samples stay zero: samples are independent, so they add
    // nothing to the rows asked for.
    full_in.setZero();
    RowMatrix rows(static_cast<int64_t>(ids.size()), n);
    TensorToMatrix(u, &rows);
    for (size_t i = 0; i < ids.size(); ++i) full_in.row(ids[i]) = rows.row(i);
    op.ApplyTransposedJacobian(full_in, &full_out);
    for (size_t i = 0; i < ids.size(); ++i) rows.row(i) = g_unit.row(ids[i]) + full_out.row(ids[i]);
    MatrixToTensor(rows, out);
    return true;
  };

  Tensor u(Shape{batch, n}, dtype);
  MatrixToTensor(u0, &u);
  SolverSummary forward_summary = SolveFixedPoint(forward, problem, &u);

  TensorToMatrix(u, w);
  if (plain_budget && last_input.defined()) {
    // The K-th iterate of each sample whose returned iterate is the last
    // one the solver evaluated (a sample whose residual grew keeps its best
    // earlier iterate).
    RowMatrix last_in(batch, n), last_out(batch, n);
    TensorToMatrix(last_input, &last_in);
    TensorToMatrix(last_output, &last_out);
    for (int64_t b = 0; b < batch; ++b) {
      if (w->row(b) == last_in.row(b) && last_out.row(b).allFinite()) {
        w->row(b) = last_out.row(b);
        ++forward_summary.sample_iterations[b];
      }
    }
  }
  for (int64_t b = 0; b < batch; ++b) w->row(b) *= samples.g_norm[b];

  summary->sample_iterations = forward_summary.sample_iterations;
  summary->sample_termination = forward_summary.sample_termination;
  summary->sample_rel_residual = forward_summary.sample_abs_residual;
  summary->sample_abs_residual.resize(batch);
  for (int64_t b = 0; b < batch; ++b) {
    summary->sample_abs_residual[b] = forward_summary.sample_abs_residual[b] * samples.g_norm[b];
  }
  summary->rel_residual_trace = forward_summary.abs_residual_trace;
  summary->vjp_evaluations = op.calls();
  summary->history_bytes = forward_summary.history_bytes;
  summary->option_usage = forward_summary.option_usage;
  if (plain_budget) {
    summary->message = "plain fixed-point iteration on the adjoint equation, a fixed budget of " +
                       std::to_string(options.max_iterations) + " iterations (" +
                       std::to_string(op.calls()) +
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
      if (!std::isfinite(r)) {
        samples->End(b, TerminationType::kNonFinite);
      } else if (samples->Meets(b, r)) {
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
      << (sample_rel_residual.empty() ? std::string("n/a") : FormatDouble("%.3g", MaxRelResidual()))
      << ", " << FormatTime(wall_time_seconds);
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
      out << "  sample " << b << ": " << ToString(sample_termination[b]) << " after "
          << (b < sample_iterations.size() ? sample_iterations[b] : 0) << " iterations, abs "
          << FormatDouble("%.3e", b < sample_abs_residual.size() ? sample_abs_residual[b] : 0.0)
          << ", rel "
          << FormatDouble("%.3e", b < sample_rel_residual.size() ? sample_rel_residual[b] : 0.0)
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

  RowMatrix g_matrix(batch, n);
  TensorToMatrix(g, &g_matrix);
  RowMatrix w_matrix(batch, n);
  if (warm) {
    TensorToMatrix(*w, &w_matrix);
  } else {
    w_matrix = g_matrix;
  }

  const AdjointSolverType type = options.solver;
  if (type == AdjointSolverType::kFixedPoint || type == AdjointSolverType::kAnderson ||
      type == AdjointSolverType::kBroyden) {
    RowMatrix w0 = w_matrix;
    SolveWithFixedPointSolver(options, vjp, g, g_matrix, w0, &w_matrix, &summary);
  } else {
    SampleState samples(g_matrix, options.tolerance);
    AdjointOperator op(vjp, batch, n, g.dtype());
    RowMatrix residual(batch, n);
    const RowMatrix* known_residual = nullptr;
    switch (type) {
      case AdjointSolverType::kNeumann:
        SolveNeumann(options, &op, g_matrix, &w_matrix, &samples, &summary);
        summary.history_bytes = batch * n * 8;
        summary.message = "truncated Neumann series, " + std::to_string(options.neumann_terms) +
                          " terms requested.";
        break;
      case AdjointSolverType::kGmres:
        SolveGmres(options, &op, g_matrix, &w_matrix, &samples, &residual, &summary);
        known_residual = &residual;
        summary.message =
            "restarted GMRES(" + std::to_string(std::min<int64_t>(options.gmres_restart, n)) + ").";
        if (options.gmres_restart > n) {
          summary.option_usage.push_back({"gmres_restart", std::to_string(options.gmres_restart),
                                          std::to_string(n),
                                          "a Krylov space cannot exceed the state size"});
        }
        break;
      case AdjointSolverType::kConjugateGradient:
        SolveConjugateGradient(options, &op, g_matrix, &w_matrix, &samples, &summary);
        summary.message = "conjugate gradient (assumes I - J symmetric positive definite).";
        break;
      case AdjointSolverType::kMinres:
        SolveMinres(options, &op, g_matrix, &w_matrix, &samples, &summary);
        summary.message = "MINRES (assumes I - J symmetric).";
        break;
      case AdjointSolverType::kDense:
        w_matrix = g_matrix;
        SolveDense(options, &op, g_matrix, &w_matrix, &samples, &summary);
        summary.message = "dense LU of I - J^T assembled from " + std::to_string(n) + " VJPs.";
        if (options.warm_start) {
          summary.option_usage.push_back(
              {"warm_start", "true", "false", "the dense solve is exact and needs no start"});
        }
        break;
      default:
        break;
    }
    Finalize(&op, g_matrix, known_residual, &samples, &w_matrix, &summary);
    summary.vjp_evaluations = op.calls();
  }

  summary.iterations = 0;
  for (int it : summary.sample_iterations) summary.iterations = std::max(summary.iterations, it);
  summary.termination_type = TerminationType::kConverged;
  for (TerminationType t : summary.sample_termination) {
    summary.termination_type = std::max(summary.termination_type, t);
  }
  if (!w->defined()) *w = Tensor(g.shape(), g.dtype());
  MatrixToTensor(w_matrix, w);
  summary.wall_time_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

}  // namespace stillpoint
