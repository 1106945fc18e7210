// Krylov methods for (I - J^T) w = g on float64 rows, all samples at once:
// every iteration is one batched VJP (AdjointOperator::Apply), and each
// sample runs its own recurrence.
#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "solvers/adjoint/methods.h"

namespace stillpoint::adjoint {

// -------------------------------------------------------------------- GMRES

// Restarted GMRES(m): each sample runs its own Arnoldi process (modified
// Gram-Schmidt, one reorthogonalisation pass) and Givens QR. One step of the
// sample loop is one restart cycle.
void SolveGmres(Float64Solve* solve) {
  const BackwardOptions& options = solve->options;
  AdjointOperator* op = solve->op;
  const RowMatrix& g = solve->g;
  RowMatrix* x = solve->w;
  SampleState* samples = solve->samples;
  AdjointSummary* summary = solve->summary;
  const int64_t batch = g.rows();
  const int64_t n = g.cols();
  const int m = static_cast<int>(std::min<int64_t>(options.gmres_restart, n));
  summary->message = "restarted GMRES(" + std::to_string(m) + ").";
  if (options.gmres_restart > n) {
    summary->option_usage.push_back({"gmres_restart", std::to_string(options.gmres_restart),
                                     std::to_string(n),
                                     "a Krylov space cannot exceed the state size"});
  }
  std::vector<RowMatrix> basis(m + 1, RowMatrix::Zero(batch, n));
  std::vector<Eigen::MatrixXd> hessenberg(batch, Eigen::MatrixXd::Zero(m + 1, m));
  std::vector<Eigen::VectorXd> cosines(batch, Eigen::VectorXd::Zero(m));
  std::vector<Eigen::VectorXd> sines(batch, Eigen::VectorXd::Zero(m));
  std::vector<Eigen::VectorXd> rhs(batch, Eigen::VectorXd::Zero(m + 1));
  std::vector<int> dimension(batch, 0);
  std::vector<char> in_cycle(batch, 0);
  std::vector<double> residual(batch, 0.0);
  RowMatrix product(batch, n);
  // The residual of the restart point, which after the last cycle is that of
  // the returned w.
  RowMatrix& r = *solve->final_residual;
  solve->has_final_residual = true;
  summary->history_bytes =
      static_cast<int64_t>((m + 3) * batch * n + batch * (m + 1) * (m + 3)) * 8;

  const auto measure = [&] {
    op->Apply(*x, &product);
    r = g - product;
    for (int64_t b = 0; b < batch; ++b) {
      if (samples->active[b]) residual[b] = r.row(b).norm();
    }
  };
  const auto restart_cycle = [&] {
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
  };
  SampleLoopRules rules;
  rules.max_iterations = options.max_iterations;
  RunSampleLoop(rules, samples, residual, summary, measure, restart_cycle);
}

// ----------------------------------------------------------------------- CG

// Conjugate gradient; requires I - J^T symmetric positive definite.
void SolveConjugateGradient(Float64Solve* solve) {
  const BackwardOptions& options = solve->options;
  AdjointOperator* op = solve->op;
  const RowMatrix& g = solve->g;
  RowMatrix* x = solve->w;
  SampleState* samples = solve->samples;
  AdjointSummary* summary = solve->summary;
  const int64_t batch = g.rows();
  const int64_t n = g.cols();
  summary->message = "conjugate gradient (assumes I - J symmetric positive definite).";
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
  const auto step = [&] {
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
  };
  SampleLoopRules rules;
  rules.max_iterations = options.max_iterations;
  RunSampleLoop(rules, samples, residual, summary, nullptr, step);
}

// ------------------------------------------------------------------- MINRES

// MINRES (Paige and Saunders) without preconditioning: symmetric Lanczos on
// I - J^T, with the tridiagonal least-squares problem updated by Givens
// rotations. The residual estimate is |prod of sines| * ||r0||.
void SolveMinres(Float64Solve* solve) {
  const BackwardOptions& options = solve->options;
  AdjointOperator* op = solve->op;
  const RowMatrix& g = solve->g;
  RowMatrix* x = solve->w;
  SampleState* samples = solve->samples;
  AdjointSummary* summary = solve->summary;
  const int64_t batch = g.rows();
  const int64_t n = g.cols();
  summary->message = "MINRES (assumes I - J symmetric).";
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
  const auto step = [&] {
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
  };
  SampleLoopRules rules;
  rules.max_iterations = options.max_iterations;
  RunSampleLoop(rules, samples, residual, summary, nullptr, step);
}

}  // namespace stillpoint::adjoint
