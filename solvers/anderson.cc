#include "solvers/anderson.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "framework/parallel.h"

namespace stillpoint {
namespace {

// Fixed maximum size: the small solve never touches the heap.
using SmallMatrix = Eigen::Matrix<double,
                                  Eigen::Dynamic,
                                  Eigen::Dynamic,
                                  Eigen::ColMajor,
                                  AndersonSolver::kMaxMemory,
                                  AndersonSolver::kMaxMemory>;
using SmallVector =
    Eigen::Matrix<double, Eigen::Dynamic, 1, Eigen::ColMajor, AndersonSolver::kMaxMemory, 1>;

// The newest difference pair: dg = (f - z) - pg and dz = z - pz, or, with
// fold_beta, dz = (z - pz) + beta dg; then pz = z and pg = f - z. The arrays
// must not overlap.
template <typename T>
void AppendDifference(const T* __restrict z,
                      const T* __restrict f,
                      T* __restrict pz,
                      T* __restrict pg,
                      T* __restrict dz,
                      T* __restrict dg,
                      bool fold_beta,
                      T beta,
                      int64_t n) {
  if (fold_beta) {
    for (int64_t i = 0; i < n; ++i) {
      const T g = f[i] - z[i];
      const T dgi = g - pg[i];
      dz[i] = (z[i] - pz[i]) + beta * dgi;
      dg[i] = dgi;
      pz[i] = z[i];
      pg[i] = g;
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const T g = f[i] - z[i];
      dz[i] = z[i] - pz[i];
      dg[i] = g - pg[i];
      pz[i] = z[i];
      pg[i] = g;
    }
  }
}

// Elements of the new iterate built per block: the block stays in L1 while
// every history column is subtracted from it.
constexpr int64_t kUpdateBlock = 256;

// z[i] -= coefficient u[i] for i < len.
template <typename T>
void SubtractColumn(T* __restrict z, const T* __restrict u, T coefficient, int64_t len) {
  for (int64_t i = 0; i < len; ++i) z[i] -= coefficient * u[i];
}

// z[i] -= coefficient (dz[i] + beta dg[i]) for i < len.
template <typename T>
void SubtractColumns(T* __restrict z,
                     const T* __restrict dz,
                     const T* __restrict dg,
                     T coefficient,
                     T beta,
                     int64_t len) {
  for (int64_t i = 0; i < len; ++i) z[i] -= coefficient * (dz[i] + beta * dg[i]);
}

}  // namespace

AndersonSolver::AndersonSolver(const ForwardSolverOptions& options) : FixedPointSolver(options) {}

int64_t AndersonSolver::InitSolver() {
  const int64_t batch = batch_size();
  const int64_t n = state_size();
  memory_ = options().anderson_memory;
  const int m = memory_;
  dz_ = Tensor(Shape{batch, m, n}, dtype());
  dg_ = Tensor(Shape{batch, m, n}, dtype());
  prev_z_ = Tensor(Shape{batch, n}, dtype());
  prev_g_ = Tensor(Shape{batch, n}, dtype());
  gram_gg_.assign(batch * m * m, 0.0);
  const bool type_one = options().anderson_type == AndersonType::kTypeI;
  gram_zg_.assign(type_one ? batch * m * m : 0, 0.0);
  norm_zz_.assign(type_one ? batch * m : 0, 0.0);
  count_.assign(batch, 0);
  head_.assign(batch, 0);
  has_prev_.assign(batch, 0);
  accelerated_.assign(batch, 0);
  rejected_flag_.assign(batch, 0);
  previous_abs_.assign(batch, 0.0);
  rejected_.clear();
  rejected_.reserve(batch);
  max_columns_used_ = 0;
  linear_algebra_restarts_ = 0;
  const int64_t doubles = static_cast<int64_t>(gram_gg_.size() + gram_zg_.size() + norm_zz_.size() +
                                               previous_abs_.size());
  return static_cast<int64_t>(dz_.nbytes() + dg_.nbytes() + prev_z_.nbytes() + prev_g_.nbytes()) +
         doubles * static_cast<int64_t>(sizeof(double));
}

void AndersonSolver::RestartHistory(int64_t sample) {
  count_[sample] = 0;
  head_[sample] = 0;
}

template <typename T>
void AndersonSolver::PlainStep(int64_t sample) {
  const int64_t n = state_size();
  const T beta = static_cast<T>(options().anderson_beta);
  T* z = state().template data<T>() + sample * n;
  const T* pz = prev_z_.data<T>() + sample * n;
  const T* pg = prev_g_.data<T>() + sample * n;
  for (int64_t i = 0; i < n; ++i) z[i] = pz[i] + beta * pg[i];
}

template <typename T>
bool AndersonSolver::ProposeStep(int64_t sample) {
  const int64_t n = state_size();
  const int m = memory_;
  const bool type_one = options().anderson_type == AndersonType::kTypeI;
  T* z = state().template data<T>() + sample * n;
  const T* f = map_value().template data<T>() + sample * n;
  T* pz = prev_z_.data<T>() + sample * n;
  T* pg = prev_g_.data<T>() + sample * n;
  T* dz = dz_.data<T>() + sample * m * n;
  T* dg = dg_.data<T>() + sample * m * n;
  double* gg = gram_gg_.data() + sample * m * m;

  if (!has_prev_[sample]) {
    for (int64_t i = 0; i < n; ++i) {
      pz[i] = z[i];
      pg[i] = f[i] - z[i];
    }
    has_prev_[sample] = 1;
    PlainStep<T>(sample);
    return false;
  }

  // 1. Append the newest difference pair to the ring (type II keeps
  //    dz + beta dg in place of dz: the step needs nothing else of dz);
  //    prev_z / prev_g become z_k and g_k.
  const int slot = head_[sample];
  T* dz_new = dz + slot * n;
  T* dg_new = dg + slot * n;
  const T beta = static_cast<T>(options().anderson_beta);
  AppendDifference(z, f, pz, pg, dz_new, dg_new, !type_one, beta, n);
  const int mk = std::min(count_[sample] + 1, m);
  count_[sample] = mk;
  head_[sample] = (slot + 1) % m;

  // 2. The Gram rows and columns of the new slot (the other entries stay
  //    valid) and the right-hand side, with both products of a history column
  //    taken from one read of it.
  SmallVector rhs(mk);
  if (type_one) {
    double* zg = gram_zg_.data() + sample * m * m;
    for (int j = 0; j < mk; ++j) {
      double value = 0.0;
      Dot2(dg + j * n, dg_new, dz_new, n, &value, &zg[slot * m + j]);
      gg[slot * m + j] = value;
      gg[j * m + slot] = value;
      Dot2(dz + j * n, dg_new, pg, n, &zg[j * m + slot], &rhs(j));
    }
    norm_zz_[sample * m + slot] = Dot(dz_new, dz_new, n);
  } else {
    for (int j = 0; j < mk; ++j) {
      double value = 0.0;
      Dot2(dg + j * n, dg_new, pg, n, &value, &rhs(j));
      gg[slot * m + j] = value;
      gg[j * m + slot] = value;
    }
  }

  // 3. The small regularised system, in float64.
  SmallMatrix h(mk, mk);
  double trace_gg = 0.0;
  for (int i = 0; i < mk; ++i) trace_gg += gg[i * m + i];
  double reg = 0.0;
  if (type_one) {
    const double* zg = gram_zg_.data() + sample * m * m;
    double trace_zz = 0.0;
    for (int i = 0; i < mk; ++i) {
      trace_zz += norm_zz_[sample * m + i];
      for (int j = 0; j < mk; ++j) h(i, j) = zg[i * m + j];
    }
    reg = options().anderson_lambda * std::sqrt(trace_zz * trace_gg) / mk;
  } else {
    for (int i = 0; i < mk; ++i) {
      for (int j = 0; j < mk; ++j) h(i, j) = gg[i * m + j];
    }
    reg = options().anderson_lambda * trace_gg / mk;
  }
  h.diagonal().array() += reg;
  const Eigen::ColPivHouseholderQR<SmallMatrix> qr(h);
  const SmallVector gamma = qr.solve(rhs);
  if (!gamma.allFinite()) {
    // Only reachable with a non-finite history; start over from a plain step.
    rejected_flag_[sample] = 2;
    RestartHistory(sample);
    PlainStep<T>(sample);
    return false;
  }

  // 4. z_{k+1} = z_k + beta g_k - sum_j gamma_j (dz_j + beta dg_j), one
  //    block of elements at a time.
  T coefficients[kMaxMemory];
  for (int j = 0; j < mk; ++j) coefficients[j] = static_cast<T>(gamma(j));
  for (int64_t begin = 0; begin < n; begin += kUpdateBlock) {
    const int64_t len = std::min(kUpdateBlock, n - begin);
    T* zb = z + begin;
    const T* pzb = pz + begin;
    const T* pgb = pg + begin;
    for (int64_t i = 0; i < len; ++i) zb[i] = pzb[i] + beta * pgb[i];
    for (int j = 0; j < mk; ++j) {
      if (type_one) {
        SubtractColumns(zb, dz + j * n + begin, dg + j * n + begin, coefficients[j], beta, len);
      } else {
        SubtractColumn(zb, dz + j * n + begin, coefficients[j], len);
      }
    }
  }
  return true;
}

void AndersonSolver::StepSolver() {
  const std::vector<int64_t>& samples = active_samples();
  const int64_t count = static_cast<int64_t>(samples.size());
  DispatchDType(dtype(), [&](auto zero) {
    using T = decltype(zero);
    // Propose every sample's next iterate (independent per sample).
    ParallelFor(0, count, 1, [this](int64_t lo, int64_t hi) {
      const std::vector<int64_t>& ids = active_samples();
      for (int64_t i = lo; i < hi; ++i) {
        const int64_t b = ids[i];
        previous_abs_[b] = sample_abs_residual(b);
        rejected_flag_[b] = 0;
        accelerated_[b] = ProposeStep<T>(b) ? 1 : 0;
      }
    });
  });
  for (int64_t b : samples) {
    max_columns_used_ = std::max(max_columns_used_, count_[b]);
    if (rejected_flag_[b] == 2) {
      ++linear_algebra_restarts_;
      AddRestarts(1);
    }
  }
  if (!EvaluateRows(samples, state(), &map_value())) return;

  // Safeguard: reject accelerated steps that made the residual non-finite or
  // raised it by more than the factor.
  const double factor = options().anderson_safeguard_factor;
  DispatchDType(dtype(), [&](auto zero) {
    using T = decltype(zero);
    ParallelFor(0, count, 4, [this, factor](int64_t lo, int64_t hi) {
      const std::vector<int64_t>& ids = active_samples();
      const int64_t n = state_size();
      for (int64_t i = lo; i < hi; ++i) {
        const int64_t b = ids[i];
        if (!accelerated_[b]) continue;
        const T* z = state().template data<T>() + b * n;
        const T* f = map_value().template data<T>() + b * n;
        double residual_sq = 0.0;
        double map_sq = 0.0;
        SquaredNorms(z, f, n, &residual_sq, &map_sq);
        const double residual = std::sqrt(residual_sq);
        const bool bad =
            !std::isfinite(residual) || (factor > 0 && residual > factor * previous_abs_[b]);
        rejected_flag_[b] = bad ? 1 : 0;
      }
    });
  });
  rejected_.clear();
  for (int64_t b : samples) {
    if (accelerated_[b] && rejected_flag_[b] == 1) rejected_.push_back(b);
  }
  if (rejected_.empty()) return;
  DispatchDType(dtype(), [&](auto zero) {
    using T = decltype(zero);
    for (int64_t b : rejected_) {
      PlainStep<T>(b);
      RestartHistory(b);
    }
  });
  AddRejectedSteps(static_cast<int64_t>(rejected_.size()));
  AddRestarts(static_cast<int64_t>(rejected_.size()));
  EvaluateRows(rejected_, state(), &map_value());
}

void AndersonSolver::FinishSolver(SolverSummary* summary) {
  if (max_columns_used_ < memory_) {
    summary->option_usage.push_back({"anderson_memory", std::to_string(memory_),
                                     std::to_string(max_columns_used_),
                                     "the solve ended before the history filled"});
  }
  if (summary->rejected_steps > 0 || linear_algebra_restarts_ > 0) {
    std::string note =
        "Anderson safeguard rejected " + std::to_string(summary->rejected_steps) + " step(s)";
    if (linear_algebra_restarts_ > 0) {
      note += "; " + std::to_string(linear_algebra_restarts_) +
              " restart(s) after a non-finite least-squares solution";
    }
    summary->message += (summary->message.empty() ? "" : " ") + note + ".";
  }
}

std::unique_ptr<FixedPointSolver> CreateAndersonSolver(const ForwardSolverOptions& options) {
  return std::make_unique<AndersonSolver>(options);
}

}  // namespace stillpoint
