#include "solvers/broyden.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "framework/parallel.h"

namespace stillpoint {
BroydenSolver::BroydenSolver(const ForwardSolverOptions& options) : FixedPointSolver(options) {}

int64_t BroydenSolver::InitSolver() {
  const int64_t batch = batch_size();
  const int64_t n = state_size();
  memory_ = options().broyden_memory;
  u_ = Tensor(Shape{batch, memory_, n}, dtype());
  v_ = Tensor(Shape{batch, memory_, n}, dtype());
  previous_z_ = Tensor(Shape{batch, n}, dtype());
  previous_f_ = Tensor(Shape{batch, n}, dtype());
  direction_ = Tensor(Shape{batch, n}, dtype());
  scratch_ = Tensor(Shape{batch, n}, dtype());
  automatic_scale_ = options().broyden_initial_scale == 0.0;
  alpha_.assign(batch, automatic_scale_ ? 1.0 : options().broyden_initial_scale);
  count_.assign(batch, 0);
  head_.assign(batch, 0);
  has_previous_.assign(batch, 0);
  skipped_.assign(batch, 0);
  outcome_.assign(batch, 0);
  reset_.clear();
  reset_.reserve(batch);
  max_pairs_used_ = 0;
  skipped_updates_ = 0;
  resets_ = 0;
  return static_cast<int64_t>(u_.nbytes() + v_.nbytes() + previous_z_.nbytes() +
                              previous_f_.nbytes() + direction_.nbytes() + scratch_.nbytes());
}

template <typename T>
void BroydenSolver::UpdateAndDirection(int64_t sample) {
  const int64_t n = state_size();
  const int m = memory_;
  T* z = state().template data<T>() + sample * n;
  const T* f = map_value().template data<T>() + sample * n;
  T* zk = previous_z_.data<T>() + sample * n;  // becomes s, then z_k again
  T* fk = previous_f_.data<T>() + sample * n;  // becomes y, then F_k again
  T* p = direction_.data<T>() + sample * n;
  T* u = u_.data<T>() + sample * m * n;
  T* v = v_.data<T>() + sample * m * n;
  skipped_[sample] = 0;

  if (has_previous_[sample]) {
    // s and y of the last step, in place.
    for (int64_t i = 0; i < n; ++i) {
      zk[i] = z[i] - zk[i];
      fk[i] = (f[i] - z[i]) - fk[i];
    }
    const T* s = zk;
    const T* y = fk;
    const double alpha = alpha_[sample];
    const int used = count_[sample];
    // p <- H y = -alpha y + sum_i u_i (v_i . y)
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(-alpha * static_cast<double>(y[i]));
    for (int j = 0; j < used; ++j) {
      const T coefficient = static_cast<T>(Dot(v + j * n, y, n));
      for (int64_t i = 0; i < n; ++i) p[i] += coefficient * u[j * n + i];
    }
    // The new pair is formed in scratch and stored only if accepted, so a
    // skipped update leaves H untouched even when the ring is full.
    T* w = scratch_.data<T>() + sample * n;
    double denominator = 0.0;
    if (options().broyden_variant == BroydenVariant::kGood) {
      // w <- H^T s = -alpha s + sum_i v_i (u_i . s); denominator s^T H y.
      double coefficients[256];
      for (int j = 0; j < used; ++j) coefficients[j] = Dot(u + j * n, s, n);
      for (int64_t i = 0; i < n; ++i) w[i] = static_cast<T>(-alpha * static_cast<double>(s[i]));
      for (int j = 0; j < used; ++j) {
        const T coefficient = static_cast<T>(coefficients[j]);
        for (int64_t i = 0; i < n; ++i) w[i] += coefficient * v[j * n + i];
      }
      denominator = Dot(w, y, n);
    } else {
      for (int64_t i = 0; i < n; ++i) w[i] = y[i];
      denominator = Dot(y, y, n);
    }
    const double scale = std::sqrt(Dot(w, w, n) * Dot(y, y, n));
    if (std::isfinite(denominator) && denominator != 0.0 && std::abs(denominator) > 1e-14 * scale) {
      const int slot = head_[sample];
      const T inv = static_cast<T>(1.0 / denominator);
      T* u_new = u + slot * n;
      T* v_new = v + slot * n;
      for (int64_t i = 0; i < n; ++i) {
        u_new[i] = (s[i] - p[i]) * inv;
        v_new[i] = w[i];
      }
      count_[sample] = std::min(used + 1, m);
      head_[sample] = (slot + 1) % m;
    } else {
      skipped_[sample] = 1;
    }
  }

  // Save z_k, F_k and form p = -H F_k = alpha F_k - sum_i u_i (v_i . F_k).
  if (!has_previous_[sample] && automatic_scale_) {
    // Automatic scale: the first step z0 + alpha F(z0) is at most half of
    // max(||z0||, 1) long, and alpha stays the scale of H_0 for the solve.
    double residual_sq = 0.0, map_sq = 0.0;
    SquaredNorms(z, f, n, &residual_sq, &map_sq);
    const double limit = 0.5 * std::max(std::sqrt(Dot(z, z, n)), 1.0);
    const double length = std::sqrt(residual_sq);
    alpha_[sample] = length > limit ? limit / length : 1.0;
  }
  const double alpha = alpha_[sample];
  for (int64_t i = 0; i < n; ++i) {
    zk[i] = z[i];
    fk[i] = f[i] - z[i];
    p[i] = static_cast<T>(alpha * static_cast<double>(fk[i]));
  }
  for (int j = 0; j < count_[sample]; ++j) {
    const T coefficient = static_cast<T>(Dot(v + j * n, fk, n));
    for (int64_t i = 0; i < n; ++i) p[i] -= coefficient * u[j * n + i];
  }
  has_previous_[sample] = 1;
}

void BroydenSolver::StepSolver() {
  const std::vector<int64_t>& samples = active_samples();
  const int64_t count = static_cast<int64_t>(samples.size());
  const int64_t n = state_size();
  DispatchDType(dtype(), [&](auto zero) {
    using T = decltype(zero);
    ParallelFor(0, count, 1, [this](int64_t lo, int64_t hi) {
      const std::vector<int64_t>& ids = active_samples();
      for (int64_t i = lo; i < hi; ++i) UpdateAndDirection<T>(ids[i]);
    });
  });
  for (int64_t b : samples) {
    skipped_updates_ += skipped_[b];
    max_pairs_used_ = std::max(max_pairs_used_, count_[b]);
  }

  if (!options().broyden_line_search) {
    DispatchDType(dtype(), [&](auto zero) {
      using T = decltype(zero);
      for (int64_t b : samples) {
        T* z = state().template data<T>() + b * n;
        const T* zk = previous_z_.data<T>() + b * n;
        const T* p = direction_.data<T>() + b * n;
        for (int64_t i = 0; i < n; ++i) z[i] = zk[i] + p[i];
      }
    });
    EvaluateRows(samples, state(), &map_value());
    return;
  }

  LineSearch(samples, previous_z_, direction_, &outcome_);
  // No acceptable step along p: forget the secant information and take a
  // plain fixed-point step from z_k.
  reset_.clear();
  for (int64_t b : samples) {
    if (outcome_[b] != 0) reset_.push_back(b);
  }
  if (reset_.empty()) return;
  DispatchDType(dtype(), [&](auto zero) {
    using T = decltype(zero);
    for (int64_t b : reset_) {
      count_[b] = 0;
      head_[b] = 0;
      T* z = state().template data<T>() + b * n;
      const T* zk = previous_z_.data<T>() + b * n;
      const T* fk = previous_f_.data<T>() + b * n;
      const T alpha = static_cast<T>(alpha_[b]);
      for (int64_t i = 0; i < n; ++i) z[i] = zk[i] + alpha * fk[i];
    }
  });
  resets_ += static_cast<int64_t>(reset_.size());
  AddRestarts(static_cast<int64_t>(reset_.size()));
  EvaluateRows(reset_, state(), &map_value());
}

void BroydenSolver::FinishSolver(SolverSummary* summary) {
  if (options().broyden_initial_scale == 0.0 && !alpha_.empty()) {
    const auto [low, high] = std::minmax_element(alpha_.begin(), alpha_.end());
    char used[64];
    std::snprintf(used, sizeof(used), "%.3g to %.3g", *low, *high);
    summary->option_usage.push_back({"broyden_initial_scale", "0 (automatic)", used,
                                     "alpha over samples, from each one's first residual"});
  }
  if (max_pairs_used_ < memory_) {
    summary->option_usage.push_back({"broyden_memory", std::to_string(memory_),
                                     std::to_string(max_pairs_used_),
                                     "the solve ended before the memory filled"});
  }
  if (skipped_updates_ > 0 || resets_ > 0) {
    summary->message += "Broyden: " + std::to_string(skipped_updates_) +
                        " update(s) skipped (vanishing denominator), " + std::to_string(resets_) +
                        " reset(s) after a failed line search.";
  }
}

std::unique_ptr<FixedPointSolver> CreateBroydenSolver(const ForwardSolverOptions& options) {
  return std::make_unique<BroydenSolver>(options);
}

}  // namespace stillpoint
