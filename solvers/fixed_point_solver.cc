#include "solvers/fixed_point_solver.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "framework/check.h"
#include "framework/parallel.h"
#include "framework/parallel_loops.h"
#include "solvers/fallback.h"
#include "solvers/report_format.h"

namespace stillpoint {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// Four float64 lanes (one AVX register, or two SSE2 ones), so that float64
// accumulations run at SIMD width. Passed by pointer or reference: by value
// their ABI would depend on -mavx.
typedef double Double4 __attribute__((vector_size(4 * sizeof(double))));

// *out = x[0..3] in float64 (x need not be aligned). Written element-wise
// because GCC turns this, unlike __builtin_convertvector, into a single
// vcvtps2pd with AVX.
template <typename T>
void Load4(const T* x, Double4* out) {
  *out = Double4{static_cast<double>(x[0]), static_cast<double>(x[1]), static_cast<double>(x[2]),
                 static_cast<double>(x[3])};
}

double Sum(const Double4& v) { return (v[0] + v[1]) + (v[2] + v[3]); }

// Copies row `from_row` of `from` into row `to_row` of `to` (same dtype, same
// row length). No allocation.
void CopyRow(const Tensor& from, int64_t from_row, Tensor* to, int64_t to_row) {
  const int64_t n = from.dim(1);
  DispatchDType(from.dtype(), [&](auto zero) {
    using T = decltype(zero);
    std::memcpy(to->data<T>() + to_row * n, from.data<T>() + from_row * n, n * sizeof(T));
  });
}

// Options that no solver of this solve reads, yet differ from their defaults
// (ForwardSolverOptions::Fields, AppliesWhen): reported, so a mistyped
// configuration is not silently ignored.
void NoteUnusedOptions(const ForwardSolverOptions& options, std::vector<OptionUsage>* usage) {
  const std::string reason = std::string("not used by ") + ToString(options.type) +
                             (options.fallback_chain.empty() ? "" : " or its fallbacks");
  for (const auto* field : ForwardSolverOptions::Fields().Unused(options)) {
    usage->push_back({field->name, field->Text(options), "unused", reason});
  }
}

}  // namespace

// ---- factory ----

std::unique_ptr<FixedPointSolver> FixedPointSolver::Create(const ForwardSolverOptions& options) {
  // The options are checked once, by the constructor every solver runs.
  switch (options.type) {
#define SP_CREATE_FORWARD_SOLVER(value, name, factory) \
  case ForwardSolverType::value:                       \
    return factory(options);
    SP_FORWARD_SOLVERS(SP_CREATE_FORWARD_SOLVER)
#undef SP_CREATE_FORWARD_SOLVER
  }
  SP_CHECK(false, "FixedPointSolver::Create: unknown solver type ", static_cast<int>(options.type));
  return nullptr;
}

FixedPointSolver::FixedPointSolver(const ForwardSolverOptions& options) : options_(options) {
  std::string error;
  SP_CHECK(options_.IsValid(&error), "FixedPointSolver: ", error);
}

FixedPointSolver::~FixedPointSolver() = default;

// ---- the solve ----

void FixedPointSolver::Init(const FixedPointProblem& problem, const Tensor& z0) {
  SP_CHECK(static_cast<bool>(problem.map), "FixedPointSolver::Init: problem.map is empty");
  SP_CHECK(problem.batch_size >= 1 && problem.state_size >= 1,
           "FixedPointSolver::Init: problem sizes must be positive, got batch_size ",
           problem.batch_size, " and state_size ", problem.state_size);
  SP_CHECK(z0.defined(), "FixedPointSolver::Init: z0 is empty");
  SP_CHECK(z0.rank() == 2 && z0.dim(0) == problem.batch_size && z0.dim(1) == problem.state_size,
           "FixedPointSolver::Init: z0 has shape ", z0.shape(), " but the problem is [",
           problem.batch_size, ", ", problem.state_size, "]");
  ValidateProblem(problem);
  start_time_ = std::chrono::steady_clock::now();
  problem_ = problem;
  const int64_t batch = problem.batch_size;
  const int64_t n = problem.state_size;
  const Shape shape{batch, n};
  const DType type = z0.dtype();

  state_ = z0.Clone();
  best_state_ = z0.Clone();
  map_value_ = Tensor(shape, type);
  gather_in_ = Tensor(shape, type);
  gather_out_ = Tensor(shape, type);
  gather_aux_ = UsesJvp() ? Tensor(shape, type) : Tensor();
  gather_in_rows_.clear();
  gather_aux_rows_.clear();
  gather_out_rows_.clear();
  for (int64_t k = 0; k <= batch; ++k) {
    gather_in_rows_.push_back(gather_in_.SliceRows(0, k));
    gather_out_rows_.push_back(gather_out_.SliceRows(0, k));
    if (gather_aux_.defined()) gather_aux_rows_.push_back(gather_aux_.SliceRows(0, k));
  }

  active_.clear();
  active_.reserve(batch);
  for (int64_t b = 0; b < batch; ++b) active_.push_back(b);
  step_samples_.clear();
  step_samples_.reserve(batch);
  is_active_.assign(batch, 1);
  failed_this_step_.assign(batch, 0);
  abs_residual_.assign(batch, kInfinity);
  rel_residual_.assign(batch, kInfinity);
  map_norm_.assign(batch, kInfinity);
  best_abs_.assign(batch, kInfinity);
  best_rel_.assign(batch, kInfinity);
  best_monitored_.assign(batch, kInfinity);
  improved_.clear();
  improved_.reserve(batch);
  initial_abs_.assign(batch, kInfinity);
  stagnation_reference_.assign(batch, kInfinity);
  stagnation_since_.assign(batch, 0);
  previous_monitored_.assign(batch, kInfinity);
  consecutive_rises_.assign(batch, 0);
  diverged_by_growth_ = 0;
  sample_iterations_.assign(batch, 0);
  termination_.assign(batch, TerminationType::kFailure);
  pending_termination_.assign(batch, TerminationType::kFailure);
  has_pending_.assign(batch, 0);
  fd_step_.assign(batch, 0.0);
  search_step_.assign(batch, 1.0);
  search_base_.assign(batch, 0.0);
  search_backtracks_.assign(batch, 0);
  search_non_finite_.assign(batch, 0);
  search_pending_.clear();
  search_pending_.reserve(batch);
  search_next_.clear();
  search_next_.reserve(batch);
  abs_trace_.clear();
  rel_trace_.clear();
  abs_trace_.reserve(options_.max_iterations + 2);
  rel_trace_.reserve(options_.max_iterations + 2);
  map_calls_ = 0;
  function_evaluations_ = 0;
  jvp_evaluations_ = 0;
  energy_evaluations_ = 0;
  restarts_ = 0;
  rejected_steps_ = 0;
  converged_count_ = 0;
  solver_option_usage_.clear();
  solver_message_.clear();
  stagnation_note_.clear();
  iteration_ = 0;
  stopped_by_callback_ = false;
  initialized_ = true;

  step_samples_ = active_;
  EvaluateRows(step_samples_, state_, &map_value_);
  JudgeSamples(step_samples_);
  history_bytes_ = BaseBytes() + InitSolver();
  RunCallbacks();
}

bool FixedPointSolver::Step() {
  SP_CHECK(initialized_, "FixedPointSolver::Step: call Init first");
  if (active_.empty()) return false;
  step_samples_ = active_;  // capacity B: no allocation
  for (int64_t b : step_samples_) {
    ++sample_iterations_[b];
    has_pending_[b] = 0;
    failed_this_step_[b] = 0;
  }
  ++iteration_;
  StepSolver();
  JudgeSamples(step_samples_);
  RunCallbacks();
  return !active_.empty();
}

void FixedPointSolver::Finish(Tensor* z, SolverSummary* summary) {
  SP_CHECK(initialized_, "FixedPointSolver::Finish: call Init first");
  SP_CHECK(z != nullptr && summary != nullptr, "FixedPointSolver::Finish: null output");
  for (int64_t b : active_) EndSample(b, TerminationType::kUserStop);
  active_.clear();

  const int64_t batch = batch_size();
  if (z->defined() && z->shape() == best_state_.shape() && z->dtype() == best_state_.dtype()) {
    z->CopyFrom(best_state_);
  } else {
    *z = best_state_.Clone();
  }

  SolverSummary s;
  s.solver_type = type();
  s.batch_size = batch;
  s.state_size = state_size();
  s.sample_iterations = sample_iterations_;
  s.sample_abs_residual = best_abs_;
  s.sample_rel_residual = best_rel_;
  s.sample_termination = termination_;
  s.sample_solver.assign(batch, type());
  s.abs_residual_trace = abs_trace_;
  s.rel_residual_trace = rel_trace_;
  s.iterations = *std::max_element(sample_iterations_.begin(), sample_iterations_.end());
  s.map_calls = map_calls_;
  s.function_evaluations = function_evaluations_;
  s.jvp_evaluations = jvp_evaluations_;
  s.energy_evaluations = energy_evaluations_;
  s.restarts = restarts_;
  s.rejected_steps = rejected_steps_;
  s.history_bytes = history_bytes_;
  s.termination_type = TerminationType::kConverged;
  for (TerminationType t : termination_) s.termination_type = std::max(s.termination_type, t);
  s.option_usage = solver_option_usage_;
  NoteUnusedOptions(options_, &s.option_usage);
  FinishSolver(&s);

  std::ostringstream message;
  const int64_t converged = s.CountSamples(TerminationType::kConverged);
  if (converged == batch) {
    message << "all " << batch << " samples converged within " << s.iterations << " iterations";
  } else {
    message << converged << "/" << batch << " samples converged;";
    for (TerminationType t : report::kAllTerminations) {
      const int64_t count = t == TerminationType::kConverged ? 0 : s.CountSamples(t);
      if (count == 0) continue;
      message << " " << count << " " << ToString(t);
      switch (t) {
        case TerminationType::kUserStop:
          message << (stopped_by_callback_ ? " (a callback stopped the solve)"
                                           : " (stepping ended before the samples did)");
          break;
        case TerminationType::kMaxIterations:
          message << (options_.FixedBudget() ? " (tolerance 0: fixed budget of "
                                             : " (max_iterations ")
                  << options_.max_iterations << (options_.FixedBudget() ? " iterations)" : ")");
          break;
        case TerminationType::kStagnated:
          if (!stagnation_note_.empty()) {
            message << " (" << stagnation_note_ << ")";
          } else {
            message << " (no " << options_.stagnation_min_improvement << " relative improvement in "
                    << options_.stagnation_window << " iterations)";
          }
          break;
        case TerminationType::kDiverged:
          if (diverged_by_growth_ < count) {
            message << " (" << count - diverged_by_growth_ << " with residual above "
                    << options_.divergence_factor << " x initial)";
          }
          if (diverged_by_growth_ > 0) {
            message << " (" << diverged_by_growth_ << " with residual rising at each of "
                    << options_.stagnation_window << " iterations)";
          }
          break;
        case TerminationType::kFailure:
          message << " (the map or energy returned false)";
          break;
        default:
          break;
      }
      message << ";";
    }
  }
  if (!solver_message_.empty()) message << " " << solver_message_;
  s.message = message.str() + (s.message.empty() ? "" : " " + s.message);
  s.wall_time_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time_).count();
  *summary = std::move(s);
}

void FixedPointSolver::Solve(const FixedPointProblem& problem, Tensor* z, SolverSummary* summary) {
  SP_CHECK(z != nullptr && z->defined(), "FixedPointSolver::Solve: z must hold z0");
  SP_CHECK(summary != nullptr, "FixedPointSolver::Solve: summary is null");
  Init(problem, *z);
  while (Step()) {
  }
  Finish(z, summary);
  if (!options_.fallback_chain.empty()) RunFallbackChain(options_, problem, z, summary);
}

SolverSummary SolveFixedPoint(const ForwardSolverOptions& options,
                              const FixedPointProblem& problem,
                              Tensor* z) {
  SolverSummary summary;
  FixedPointSolver::Create(options)->Solve(problem, z, &summary);
  return summary;
}

// ---- judging ----

double FixedPointSolver::Monitored(int64_t sample) const {
  return options_.stop_mode == StopMode::kRelative ? rel_residual_[sample] : abs_residual_[sample];
}

bool FixedPointSolver::MeetsTolerance(double abs_residual, double rel_residual) const {
  if (options_.FixedBudget()) return false;
  switch (options_.stop_mode) {
    case StopMode::kAbsolute:
      return abs_residual <= options_.absolute_tolerance;
    case StopMode::kRelative:
      return rel_residual <= options_.relative_tolerance;
    case StopMode::kEither:
      return (options_.absolute_tolerance > 0 && abs_residual <= options_.absolute_tolerance) ||
             (options_.relative_tolerance > 0 && rel_residual <= options_.relative_tolerance);
  }
  return false;
}

void FixedPointSolver::EndSample(int64_t sample, TerminationType type) {
  if (!is_active_[sample]) return;
  is_active_[sample] = 0;
  termination_[sample] = type;
  if (type == TerminationType::kConverged) ++converged_count_;
}

void FixedPointSolver::ComputeResiduals(int64_t sample) {
  const int64_t n = state_size();
  DispatchDType(dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* z = state_.data<T>() + sample * n;
    const T* f = map_value_.data<T>() + sample * n;
    double residual_sq = 0.0;
    double map_sq = 0.0;
    SquaredNorms(z, f, n, &residual_sq, &map_sq);
    abs_residual_[sample] = std::sqrt(residual_sq);
    map_norm_[sample] = std::sqrt(map_sq);
    rel_residual_[sample] = abs_residual_[sample] / (map_norm_[sample] + options_.relative_epsilon);
  });
}

void FixedPointSolver::JudgeSamples(const std::vector<int64_t>& samples) {
  if (samples.empty()) return;
  ParallelFor(0, static_cast<int64_t>(samples.size()), 4, [this, &samples](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      if (!failed_this_step_[samples[i]]) ComputeResiduals(samples[i]);
    }
  });

  const bool fixed_budget = options_.FixedBudget();
  double max_abs = 0.0;
  double max_rel = 0.0;
  improved_.clear();
  for (int64_t b : samples) {
    if (failed_this_step_[b]) {
      max_abs = max_rel = kInfinity;
      EndSample(b, TerminationType::kFailure);
      continue;
    }
    const double abs_r = abs_residual_[b];
    const double rel_r = rel_residual_[b];
    if (!std::isfinite(abs_r) || !std::isfinite(map_norm_[b])) {
      max_abs = max_rel = kInfinity;
      EndSample(b, TerminationType::kNonFinite);
      continue;
    }
    max_abs = std::max(max_abs, abs_r);
    max_rel = std::max(max_rel, rel_r);
    const double monitored = Monitored(b);
    if (iteration_ == 0) {
      initial_abs_[b] = abs_r;
      stagnation_reference_[b] = monitored;
      stagnation_since_[b] = 0;
      consecutive_rises_[b] = 0;
    } else {
      consecutive_rises_[b] = monitored > previous_monitored_[b] ? consecutive_rises_[b] + 1 : 0;
    }
    previous_monitored_[b] = monitored;
    const bool converged = MeetsTolerance(abs_r, rel_r);
    if (converged || monitored < best_monitored_[b]) {
      improved_.push_back(b);
      best_abs_[b] = abs_r;
      best_rel_[b] = rel_r;
      best_monitored_[b] = monitored;
    }
    if (converged) {
      EndSample(b, TerminationType::kConverged);
      continue;
    }
    if (has_pending_[b]) {
      EndSample(b, pending_termination_[b]);
      continue;
    }
    if (!fixed_budget) {
      if (options_.divergence_factor > 0 &&
          abs_r > options_.divergence_factor * std::max(initial_abs_[b], 1e-300)) {
        EndSample(b, TerminationType::kDiverged);
        continue;
      }
      if (options_.stagnation_window > 0) {
        if (monitored < stagnation_reference_[b] * (1.0 - options_.stagnation_min_improvement)) {
          stagnation_reference_[b] = monitored;
          stagnation_since_[b] = sample_iterations_[b];
        } else if (sample_iterations_[b] - stagnation_since_[b] >= options_.stagnation_window) {
          // No progress within the window. A residual that rose at every
          // iterate of it is running away (an expansive map under Picard
          // grows by its spectral radius per step), long before it would
          // reach divergence_factor x the initial one: that is DIVERGED.
          if (consecutive_rises_[b] >= options_.stagnation_window) {
            ++diverged_by_growth_;
            EndSample(b, TerminationType::kDiverged);
          } else {
            EndSample(b, TerminationType::kStagnated);
          }
          continue;
        }
      }
    }
    if (sample_iterations_[b] >= options_.max_iterations) {
      EndSample(b, TerminationType::kMaxIterations);
    }
  }
  // The improved states become the returned ones, copied in parallel: on a
  // W2 step these copies are a whole [B, n] state per iteration.
  ParallelFor(0, static_cast<int64_t>(improved_.size()), MinRowsPerTask(),
              [this](int64_t lo, int64_t hi) {
                for (int64_t i = lo; i < hi; ++i) {
                  CopyRow(state_, improved_[i], &best_state_, improved_[i]);
                }
              });
  abs_trace_.push_back(max_abs);
  rel_trace_.push_back(max_rel);
  active_.erase(
      std::remove_if(active_.begin(), active_.end(), [this](int64_t b) { return !is_active_[b]; }),
      active_.end());
}

void FixedPointSolver::RunCallbacks() {
  if (options_.callbacks.empty()) return;
  IterationSummary s;
  s.iteration = iteration_;
  s.active_samples = static_cast<int>(active_.size());
  s.converged_samples = static_cast<int>(converged_count_);
  s.max_abs_residual = abs_trace_.empty() ? 0.0 : abs_trace_.back();
  s.max_rel_residual = rel_trace_.empty() ? 0.0 : rel_trace_.back();
  s.function_evaluations = function_evaluations_;
  s.elapsed_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time_).count();
  for (const IterationCallback& callback : options_.callbacks) {
    if (callback(s) == CallbackReturnType::kStop) {
      for (int64_t b : active_) EndSample(b, TerminationType::kUserStop);
      active_.clear();
      stopped_by_callback_ = true;
      return;
    }
  }
}

// ---- helpers for solvers ----

template <typename T>
void FixedPointSolver::Dot2(const T* c, const T* a, const T* b, int64_t n, double* ac, double* bc) {
  Double4 a0 = {}, a1 = {}, b0 = {}, b1 = {};
  Double4 c0, c1, x0, x1;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    Load4(c + i, &c0);
    Load4(c + i + 4, &c1);
    Load4(a + i, &x0);
    Load4(a + i + 4, &x1);
    a0 += x0 * c0;
    a1 += x1 * c1;
    Load4(b + i, &x0);
    Load4(b + i + 4, &x1);
    b0 += x0 * c0;
    b1 += x1 * c1;
  }
  double sa = Sum(a0 + a1);
  double sb = Sum(b0 + b1);
  for (; i < n; ++i) {
    const double ci = static_cast<double>(c[i]);
    sa += static_cast<double>(a[i]) * ci;
    sb += static_cast<double>(b[i]) * ci;
  }
  *ac = sa;
  *bc = sb;
}

template <typename T>
void FixedPointSolver::SquaredNorms(
    const T* z, const T* f, int64_t n, double* residual_sq, double* map_sq) {
  Double4 r0 = {}, r1 = {}, m0 = {}, m1 = {};
  Double4 f0, f1, z0, z1;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    Load4(f + i, &f0);
    Load4(f + i + 4, &f1);
    Load4(z + i, &z0);
    Load4(z + i + 4, &z1);
    m0 += f0 * f0;
    m1 += f1 * f1;
    f0 -= z0;
    f1 -= z1;
    r0 += f0 * f0;
    r1 += f1 * f1;
  }
  double rs = Sum(r0 + r1);
  double ms = Sum(m0 + m1);
  for (; i < n; ++i) {
    const double fi = static_cast<double>(f[i]);
    const double d = fi - static_cast<double>(z[i]);
    rs += d * d;
    ms += fi * fi;
  }
  *residual_sq = rs;
  *map_sq = ms;
}

// The solve dtypes.
template void FixedPointSolver::Dot2(
    const float*, const float*, const float*, int64_t, double*, double*);
template void FixedPointSolver::Dot2(
    const double*, const double*, const double*, int64_t, double*, double*);
template void FixedPointSolver::SquaredNorms(const float*, const float*, int64_t, double*, double*);
template void FixedPointSolver::SquaredNorms(
    const double*, const double*, int64_t, double*, double*);

void FixedPointSolver::TerminateSample(int64_t sample, TerminationType type) {
  if (type == TerminationType::kFailure) failed_this_step_[sample] = 1;
  if (!has_pending_[sample] || type > pending_termination_[sample]) {
    pending_termination_[sample] = type;
  }
  has_pending_[sample] = 1;
}

void FixedPointSolver::AppendMessage(const std::string& text) {
  if (!solver_message_.empty()) solver_message_ += " ";
  solver_message_ += text;
}

void FixedPointSolver::LineSearch(const std::vector<int64_t>& samples,
                                  const Tensor& base_z,
                                  const Tensor& direction,
                                  std::vector<char>* outcome) {
  const int64_t n = state_size();
  const double c = options_.armijo_c;
  const double shrink = options_.line_search_shrink;
  const int max_backtracks = options_.line_search_max_backtracks;
  auto place_trials = [&](const std::vector<int64_t>& ids) {
    DispatchDType(dtype(), [&](auto zero) {
      using T = decltype(zero);
      for (int64_t b : ids) {
        const T t = static_cast<T>(search_step_[b]);
        const T* zb = base_z.data<T>() + b * n;
        const T* db = direction.data<T>() + b * n;
        T* out = state_.data<T>() + b * n;
        for (int64_t i = 0; i < n; ++i) out[i] = zb[i] + t * db[i];
      }
    });
  };
  search_pending_.clear();
  for (int64_t b : samples) {
    search_step_[b] = 1.0;
    search_backtracks_[b] = 0;
    search_non_finite_[b] = 0;
    search_base_[b] = abs_residual_[b];
    (*outcome)[b] = 1;
    search_pending_.push_back(b);
  }
  place_trials(search_pending_);
  while (!search_pending_.empty()) {
    if (!EvaluateRows(search_pending_, state_, &map_value_)) {
      for (int64_t b : search_pending_) (*outcome)[b] = 1;
      return;
    }
    search_next_.clear();
    for (int64_t b : search_pending_) {
      ComputeResiduals(b);
      const double trial = abs_residual_[b];
      const double base = search_base_[b];
      if (!std::isfinite(trial) || !std::isfinite(map_norm_[b])) {
        search_non_finite_[b] = 1;
      } else if (trial * trial <= (1.0 - 2.0 * c * search_step_[b]) * base * base) {
        (*outcome)[b] = 0;
        continue;
      }
      if (search_backtracks_[b] < max_backtracks) {
        ++search_backtracks_[b];
        search_step_[b] *= shrink;
        search_next_.push_back(b);
      } else {
        (*outcome)[b] = search_non_finite_[b] ? 2 : 1;
      }
    }
    if (!search_next_.empty()) rejected_steps_ += static_cast<int64_t>(search_next_.size());
    search_pending_.swap(search_next_);
    place_trials(search_pending_);
  }
}

int64_t FixedPointSolver::MinRowsPerTask() const {
  return std::max<int64_t>(1, kMinParallelElements / std::max<int64_t>(1, state_size()));
}

double FixedPointSolver::ElapsedSeconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time_).count();
}

double FixedPointSolver::FiniteDifferenceStep() const {
  if (options_.jvp_finite_difference_step > 0) return options_.jvp_finite_difference_step;
  return dtype() == DType::kFloat64 ? std::sqrt(std::numeric_limits<double>::epsilon())
                                    : std::sqrt(std::numeric_limits<float>::epsilon());
}

int64_t FixedPointSolver::BaseBytes() const {
  int64_t bytes = 0;
  for (const Tensor* t :
       {&state_, &map_value_, &best_state_, &gather_in_, &gather_aux_, &gather_out_}) {
    if (t->defined()) bytes += static_cast<int64_t>(t->nbytes());
  }
  return bytes;
}

bool FixedPointSolver::CallMap(const std::vector<int64_t>& samples, const Tensor& z, Tensor* out) {
  Tensor result = *out;  // shares storage; a map that rebinds its output is still honoured
  const bool ok = problem_.map(z, samples, &result);
  ++map_calls_;
  function_evaluations_ += static_cast<int64_t>(samples.size());
  if (!ok) return false;
  SP_CHECK(result.shape() == out->shape() && result.dtype() == out->dtype(),
           "FixedPointSolver: the map wrote a ", ToString(result.dtype()), " tensor of shape ",
           result.shape(), " but ", ToString(out->dtype()), " ", out->shape(), " was expected");
  if (!result.SameStorage(*out)) {
    // A map that rebinds its output (to the tensor its computation made)
    // hands that storage over when nothing else holds it, instead of having
    // it copied: a W2 forward solve would otherwise copy its whole [8, 16384]
    // state, on one thread, at every evaluation. Anything else that shares
    // it (z itself, for a map that returns its input) is copied.
    if (result.HoldsStorageAlone()) {
      *out = std::move(result);
    } else {
      out->CopyFrom(result);
    }
  }
  return true;
}

bool FixedPointSolver::EvaluateRows(const std::vector<int64_t>& samples,
                                    const Tensor& z,
                                    Tensor* out) {
  const int64_t k = static_cast<int64_t>(samples.size());
  if (k == 0) return true;
  bool ok = false;
  if (k == batch_size()) {
    ok = CallMap(samples, z, out);
  } else {
    Tensor& in = gather_in_rows_[k];
    Tensor& result = gather_out_rows_[k];
    for (int64_t i = 0; i < k; ++i) CopyRow(z, samples[i], &in, i);
    ok = CallMap(samples, in, &result);
    if (ok) {
      for (int64_t i = 0; i < k; ++i) CopyRow(result, i, out, samples[i]);
    }
  }
  if (!ok) {
    for (int64_t b : samples) TerminateSample(b, TerminationType::kFailure);
  }
  return ok;
}

bool FixedPointSolver::EvaluateJvpRows(const std::vector<int64_t>& samples,
                                       const Tensor& z,
                                       const Tensor& fz,
                                       const Tensor& v,
                                       Tensor* out) {
  SP_CHECK(gather_aux_.defined(),
           "FixedPointSolver::EvaluateJvpRows: the solver did not declare UsesJvp()");
  const int64_t k = static_cast<int64_t>(samples.size());
  if (k == 0) return true;
  const int64_t n = state_size();
  bool ok = false;
  if (problem_.jvp) {
    Tensor& zin = gather_in_rows_[k];
    Tensor& vin = gather_aux_rows_[k];
    Tensor& result = gather_out_rows_[k];
    for (int64_t i = 0; i < k; ++i) {
      CopyRow(z, samples[i], &zin, i);
      CopyRow(v, samples[i], &vin, i);
    }
    Tensor written = result;
    ok = problem_.jvp(zin, vin, samples, &written);
    jvp_evaluations_ += k;
    if (ok) {
      SP_CHECK(written.shape() == result.shape() && written.dtype() == result.dtype(),
               "FixedPointSolver: the jvp wrote a tensor of shape ", written.shape(), " but ",
               result.shape(), " was expected");
      for (int64_t i = 0; i < k; ++i) CopyRow(written, i, out, samples[i]);
    }
  } else {
    // Forward difference along v, with a step scaled to z and v so that the
    // perturbation is relatively small in the state's precision.
    const double base_step = FiniteDifferenceStep();
    Tensor& shifted = gather_aux_rows_[k];
    Tensor& result = gather_out_rows_[k];
    DispatchDType(dtype(), [&](auto zero) {
      using T = decltype(zero);
      for (int64_t i = 0; i < k; ++i) {
        const int64_t b = samples[i];
        const T* zb = z.data<T>() + b * n;
        const T* vb = v.data<T>() + b * n;
        double z_sq = 0.0;
        double v_sq = 0.0;
        for (int64_t j = 0; j < n; ++j) {
          z_sq += static_cast<double>(zb[j]) * zb[j];
          v_sq += static_cast<double>(vb[j]) * vb[j];
        }
        const double v_norm = std::sqrt(v_sq);
        const double h = v_norm > 0 ? base_step * (1.0 + std::sqrt(z_sq)) / v_norm : base_step;
        fd_step_[b] = h;
        T* sb = shifted.data<T>() + i * n;
        for (int64_t j = 0; j < n; ++j) sb[j] = static_cast<T>(zb[j] + h * vb[j]);
      }
    });
    ok = CallMap(samples, shifted, &result);
    if (ok) {
      DispatchDType(dtype(), [&](auto zero) {
        using T = decltype(zero);
        for (int64_t i = 0; i < k; ++i) {
          const int64_t b = samples[i];
          const T* fb = fz.data<T>() + b * n;
          const T* rb = result.data<T>() + i * n;
          T* ob = out->data<T>() + b * n;
          const double inv_h = 1.0 / fd_step_[b];
          for (int64_t j = 0; j < n; ++j) {
            ob[j] = static_cast<T>((static_cast<double>(rb[j]) - fb[j]) * inv_h);
          }
        }
      });
    }
  }
  if (!ok) {
    for (int64_t b : samples) TerminateSample(b, TerminationType::kFailure);
  }
  return ok;
}

}  // namespace stillpoint
