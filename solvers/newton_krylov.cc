#include "solvers/newton_krylov.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "framework/parallel.h"

namespace stillpoint {
namespace {

constexpr double kBreakdown = 1e-300;

}  // namespace

NewtonKrylovSolver::NewtonKrylovSolver(const ForwardSolverOptions& options)
    : FixedPointSolver(options) {}

int64_t NewtonKrylovSolver::InitSolver() {
  const int64_t batch = batch_size();
  const int64_t n = state_size();
  restart_ = options().gmres_restart;
  const int r = restart_;
  basis_ = Tensor(Shape{batch, r + 1, n}, dtype());
  base_z_ = Tensor(Shape{batch, n}, dtype());
  base_f_ = Tensor(Shape{batch, n}, dtype());
  solution_ = Tensor(Shape{batch, n}, dtype());
  jvp_in_ = Tensor(Shape{batch, n}, dtype());
  jvp_out_ = Tensor(Shape{batch, n}, dtype());
  hessenberg_.assign(batch * (r + 1) * r, 0.0);
  cosines_.assign(batch * r, 0.0);
  sines_.assign(batch * r, 0.0);
  rhs_.assign(batch * (r + 1), 0.0);
  inner_.assign(batch, 0);
  total_inner_.assign(batch, 0);
  residual_norm_.assign(batch, 0.0);
  previous_norm_.assign(batch, 0.0);
  eta_.assign(batch, options().newton_forcing);
  gmres_converged_.assign(batch, 0);
  non_finite_.assign(batch, 0);
  phase_.assign(batch, Phase::kDone);
  outcome_.assign(batch, 0);
  for (std::vector<int64_t>* list : {&list_, &next_, &ok_}) {
    list->clear();
    list->reserve(batch);
  }
  inner_iterations_ = 0;
  gmres_failures_ = 0;
  const int64_t doubles =
      static_cast<int64_t>(hessenberg_.size() + cosines_.size() + sines_.size() + rhs_.size());
  return static_cast<int64_t>(basis_.nbytes() + base_z_.nbytes() + base_f_.nbytes() +
                              solution_.nbytes() + jvp_in_.nbytes() + jvp_out_.nbytes()) +
         doubles * static_cast<int64_t>(sizeof(double));
}

template <typename T>
void NewtonKrylovSolver::StartCycle(int64_t sample, bool from_zero) {
  const int64_t n = state_size();
  const int r = restart_;
  T* v0 = basis_.data<T>() + sample * (r + 1) * n;
  const T* z = base_z_.data<T>() + sample * n;
  const T* f = base_f_.data<T>() + sample * n;
  if (from_zero) {
    for (int64_t i = 0; i < n; ++i) v0[i] = z[i] - f[i];  // r = -F
  } else {
    // r = -F - J_F x, with J_f x in jvp_out_ and x in jvp_in_.
    const T* jx = jvp_out_.data<T>() + sample * n;
    const T* x = jvp_in_.data<T>() + sample * n;
    for (int64_t i = 0; i < n; ++i) v0[i] = (z[i] - f[i]) - (jx[i] - x[i]);
  }
  const double beta = std::sqrt(Dot(v0, v0, n));
  double* g = rhs_.data() + sample * (r + 1);
  std::fill(g, g + r + 1, 0.0);
  g[0] = beta;
  inner_[sample] = 0;
  if (!std::isfinite(beta)) {
    non_finite_[sample] = 1;
    phase_[sample] = Phase::kDone;
    return;
  }
  if (beta <= eta_[sample] * residual_norm_[sample] || beta < kBreakdown) {
    gmres_converged_[sample] = 1;
    phase_[sample] = Phase::kDone;
    return;
  }
  const T inv = static_cast<T>(1.0 / beta);
  for (int64_t i = 0; i < n; ++i) v0[i] *= inv;
  phase_[sample] = Phase::kArnoldi;
}

template <typename T>
void NewtonKrylovSolver::UpdateSolution(int64_t sample) {
  const int64_t n = state_size();
  const int r = restart_;
  const int k = inner_[sample];
  if (k == 0) return;
  const double* h = hessenberg_.data() + sample * (r + 1) * r;
  const double* g = rhs_.data() + sample * (r + 1);
  double y[512];
  // Back substitution with the rotated (upper triangular) Hessenberg matrix.
  for (int i = k - 1; i >= 0; --i) {
    double sum = g[i];
    for (int j = i + 1; j < k; ++j) sum -= h[j * (r + 1) + i] * y[j];
    y[i] = sum / h[i * (r + 1) + i];
  }
  T* x = solution_.data<T>() + sample * n;
  const T* basis = basis_.data<T>() + sample * (r + 1) * n;
  for (int j = 0; j < k; ++j) {
    const T coefficient = static_cast<T>(y[j]);
    const T* vj = basis + j * n;
    for (int64_t i = 0; i < n; ++i) x[i] += coefficient * vj[i];
  }
}

template <typename T>
void NewtonKrylovSolver::ArnoldiStep(int64_t sample) {
  const int64_t n = state_size();
  const int r = restart_;
  const int j = inner_[sample];
  T* basis = basis_.data<T>() + sample * (r + 1) * n;
  const T* vj = basis + j * n;
  T* w = basis + (j + 1) * n;
  const T* jv = jvp_out_.data<T>() + sample * n;
  for (int64_t i = 0; i < n; ++i) w[i] = jv[i] - vj[i];                 // J_F v = J_f v - v
  double* h = hessenberg_.data() + sample * (r + 1) * r + j * (r + 1);  // column j
  // Modified Gram-Schmidt.
  for (int i = 0; i <= j; ++i) {
    const T* vi = basis + i * n;
    h[i] = Dot(w, vi, n);
    const T coefficient = static_cast<T>(h[i]);
    for (int64_t l = 0; l < n; ++l) w[l] -= coefficient * vi[l];
  }
  h[j + 1] = std::sqrt(Dot(w, w, n));
  if (!std::isfinite(h[j + 1])) {
    non_finite_[sample] = 1;
    phase_[sample] = Phase::kDone;
    return;
  }
  const bool breakdown = h[j + 1] < kBreakdown;
  if (!breakdown) {
    const T inv = static_cast<T>(1.0 / h[j + 1]);
    for (int64_t l = 0; l < n; ++l) w[l] *= inv;
  }
  // Apply the previous rotations, then make one that zeroes h[j + 1].
  double* c = cosines_.data() + sample * r;
  double* s = sines_.data() + sample * r;
  for (int i = 0; i < j; ++i) {
    const double a = h[i];
    const double b = h[i + 1];
    h[i] = c[i] * a + s[i] * b;
    h[i + 1] = -s[i] * a + c[i] * b;
  }
  const double denominator = std::hypot(h[j], h[j + 1]);
  double* g = rhs_.data() + sample * (r + 1);
  if (denominator == 0.0) {
    // J_F is singular on the Krylov space: keep what we have.
    phase_[sample] = Phase::kDone;
    return;
  }
  c[j] = h[j] / denominator;
  s[j] = h[j + 1] / denominator;
  h[j] = denominator;
  h[j + 1] = 0.0;
  g[j + 1] = -s[j] * g[j];
  g[j] = c[j] * g[j];
  inner_[sample] = j + 1;
  ++total_inner_[sample];

  const double residual = std::abs(g[j + 1]);
  const bool converged = residual <= eta_[sample] * residual_norm_[sample] || breakdown;
  if (converged || inner_[sample] == r || total_inner_[sample] >= options().gmres_max_iterations) {
    UpdateSolution<T>(sample);
    inner_[sample] = 0;
    if (converged) {
      gmres_converged_[sample] = 1;
      phase_[sample] = Phase::kDone;
    } else if (total_inner_[sample] >= options().gmres_max_iterations) {
      phase_[sample] = Phase::kDone;
    } else {
      phase_[sample] = Phase::kRestart;
    }
  }
}

void NewtonKrylovSolver::StepSolver() {
  const std::vector<int64_t>& samples = active_samples();
  const int64_t n = state_size();
  const bool eisenstat_walker = options().forcing_type == ForcingTermType::kEisenstatWalker;
  const double eta_max = options().newton_forcing;
  base_z_.CopyFrom(state());
  base_f_.CopyFrom(map_value());
  solution_.Fill(0.0);

  list_.clear();
  for (int64_t b : samples) {
    const double norm = sample_abs_residual(b);
    double eta = eta_max;
    if (eisenstat_walker && previous_norm_[b] > 0) {
      const double ratio = norm / previous_norm_[b];
      eta = 0.9 * ratio * ratio;
      const double floor = 0.9 * eta_[b] * eta_[b];
      if (floor > 0.1) eta = std::max(eta, floor);
      eta = std::min(eta, eta_max);
    }
    eta_[b] = eta;
    previous_norm_[b] = norm;
    residual_norm_[b] = norm;
    total_inner_[b] = 0;
    gmres_converged_[b] = 0;
    non_finite_[b] = 0;
    DispatchDType(dtype(), [&](auto zero) { StartCycle<decltype(zero)>(b, true); });
    if (phase_[b] == Phase::kArnoldi) list_.push_back(b);
  }

  // GMRES in lockstep: one batched Jacobian-vector product per round.
  while (!list_.empty()) {
    DispatchDType(dtype(), [&](auto zero) {
      using T = decltype(zero);
      for (int64_t b : list_) {
        const T* source = phase_[b] == Phase::kArnoldi
                              ? basis_.data<T>() + (b * (restart_ + 1) + inner_[b]) * n
                              : solution_.data<T>() + b * n;
        std::memcpy(jvp_in_.data<T>() + b * n, source, n * sizeof(T));
      }
    });
    if (!EvaluateJvpRows(list_, base_z_, base_f_, jvp_in_, &jvp_out_)) {
      // The base has ended these samples in kFailure.
      for (int64_t b : list_) {
        phase_[b] = Phase::kDone;
        non_finite_[b] = 2;
      }
      break;
    }
    inner_iterations_ += static_cast<int64_t>(list_.size());
    DispatchDType(dtype(), [&](auto zero) {
      using T = decltype(zero);
      ParallelFor(0, static_cast<int64_t>(list_.size()), 1, [this](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) {
          const int64_t b = list_[i];
          if (phase_[b] == Phase::kArnoldi) {
            ArnoldiStep<T>(b);
          } else {
            StartCycle<T>(b, false);
          }
        }
      });
    });
    next_.clear();
    for (int64_t b : list_) {
      if (phase_[b] != Phase::kDone) next_.push_back(b);
    }
    list_.swap(next_);
  }

  // Globalise with a line search along x; samples that cannot go on keep z_k.
  ok_.clear();
  for (int64_t b : samples) {
    if (!non_finite_[b]) ok_.push_back(b);
    if (!gmres_converged_[b]) ++gmres_failures_;
  }
  LineSearch(ok_, base_z_, solution_, &outcome_);
  DispatchDType(dtype(), [&](auto zero) {
    using T = decltype(zero);
    for (int64_t b : samples) {
      TerminationType end = TerminationType::kNonFinite;
      if (non_finite_[b] == 2) {
        end = TerminationType::kFailure;
      } else if (non_finite_[b]) {
        end = TerminationType::kNonFinite;
      } else if (outcome_[b] == 2) {
        end = TerminationType::kNonFinite;
      } else if (outcome_[b] == 1) {
        end = gmres_converged_[b] ? TerminationType::kStagnated
                                  : TerminationType::kLinearAlgebraFailure;
      } else {
        continue;
      }
      std::memcpy(state().template data<T>() + b * n, base_z_.data<T>() + b * n, n * sizeof(T));
      std::memcpy(map_value().template data<T>() + b * n, base_f_.data<T>() + b * n, n * sizeof(T));
      TerminateSample(b, end);
    }
  });
}

void NewtonKrylovSolver::FinishSolver(SolverSummary* summary) {
  summary->message += "Newton-Krylov: " + std::to_string(inner_iterations_) +
                      " GMRES iterations (per-sample JVPs), " + std::to_string(gmres_failures_) +
                      " inner solve(s) stopped above the forcing tolerance.";
  if (!problem().jvp) {
    summary->option_usage.push_back(
        {"jacobian-vector products", "problem.jvp", "forward differences",
         "the problem has no jvp; step " + std::to_string(FiniteDifferenceStep())});
  }
}

std::unique_ptr<FixedPointSolver> CreateNewtonKrylovSolver(const ForwardSolverOptions& options) {
  return std::make_unique<NewtonKrylovSolver>(options);
}

}  // namespace stillpoint
