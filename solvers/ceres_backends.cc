#include "solvers/ceres_backends.h"

#include <ceres/ceres.h>
#include <glog/logging.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "framework/check.h"

namespace stillpoint {
namespace {

bool AllFinite(const double* values, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(values[i])) return false;
  }
  return true;
}

// E and grad E of one sample, for ceres::GradientProblem.
class EnergyFunction : public ceres::FirstOrderFunction {
 public:
  EnergyFunction(CeresSolverBase* solver, int64_t sample, int n)
      : solver_(solver), sample_(sample), n_(n), scratch_(n) {}

  bool Evaluate(const double* params, double* cost, double* gradient) const override {
    double* g = gradient != nullptr ? gradient : scratch_.data();
    if (!solver_->EvaluateEnergyAt(sample_, params, cost, g)) return false;
    if (!std::isfinite(*cost) || !AllFinite(g, n_)) {
      solver_->NoteNonFinite();
      return false;
    }
    return true;
  }
  int NumParameters() const override { return n_; }

 private:
  CeresSolverBase* solver_;
  int64_t sample_;
  int n_;
  mutable std::vector<double> scratch_;
};

// The n residuals F(z) = f(z) - z of one sample and their dense Jacobian.
class ResidualFunction : public ceres::CostFunction {
 public:
  ResidualFunction(CeresSolverBase* solver, int64_t sample, int n)
      : solver_(solver), sample_(sample), n_(n), fz_(n) {
    set_num_residuals(n);
    mutable_parameter_block_sizes()->push_back(n);
  }

  bool Evaluate(double const* const* parameters,
                double* residuals,
                double** jacobians) const override {
    const double* z = parameters[0];
    if (!solver_->EvaluateMapAt(sample_, z, fz_.data())) return false;
    for (int i = 0; i < n_; ++i) residuals[i] = fz_[i] - z[i];
    if (!AllFinite(residuals, n_)) {
      solver_->NoteNonFinite();
      return false;
    }
    if (jacobians != nullptr && jacobians[0] != nullptr) {
      if (!solver_->EvaluateJacobianAt(sample_, z, fz_.data(), jacobians[0])) return false;
      if (!AllFinite(jacobians[0], static_cast<int64_t>(n_) * n_)) {
        solver_->NoteNonFinite();
        return false;
      }
    }
    return true;
  }

 private:
  CeresSolverBase* solver_;
  int64_t sample_;
  int n_;
  mutable std::vector<double> fz_;
};

// Stops Ceres as soon as stillpoint's own stopping rule holds.
class StopRule : public ceres::IterationCallback {
 public:
  StopRule(CeresSolverBase* solver, int64_t sample, const double* params)
      : solver_(solver), sample_(sample), params_(params) {}

  ceres::CallbackReturnType operator()(const ceres::IterationSummary& summary) override {
    if (summary.iteration > 0 && !summary.step_is_successful) return ceres::SOLVER_CONTINUE;
    return solver_->ShouldStop(sample_, summary.iteration, params_)
               ? ceres::SOLVER_TERMINATE_SUCCESSFULLY
               : ceres::SOLVER_CONTINUE;
  }

 private:
  CeresSolverBase* solver_;
  int64_t sample_;
  const double* params_;
};

// Ceres reports some events through glog warnings whatever its logging_type
// (nonlinear CG restarts, for instance). A solve inside a training loop must
// not flood stderr, so warnings are muted while Ceres runs; errors still show.
class MuteCeresWarnings {
 public:
  MuteCeresWarnings() : previous_(FLAGS_minloglevel) {
    if (FLAGS_minloglevel < google::GLOG_ERROR) FLAGS_minloglevel = google::GLOG_ERROR;
  }
  ~MuteCeresWarnings() { FLAGS_minloglevel = previous_; }
  MuteCeresWarnings(const MuteCeresWarnings&) = delete;
  MuteCeresWarnings& operator=(const MuteCeresWarnings&) = delete;

 private:
  int previous_;
};

TerminationType FromCeres(ceres::TerminationType type, bool trust_region) {
  switch (type) {
    case ceres::NO_CONVERGENCE:
      return TerminationType::kMaxIterations;
    case ceres::CONVERGENCE:
      return TerminationType::kStagnated;
    case ceres::USER_SUCCESS:
    case ceres::USER_FAILURE:
      return TerminationType::kUserStop;
    case ceres::FAILURE:
      return trust_region ? TerminationType::kLinearAlgebraFailure : TerminationType::kStagnated;
  }
  return TerminationType::kFailure;
}

}  // namespace

// ---- shared plumbing ----

CeresSolverBase::CeresSolverBase(const ForwardSolverOptions& options) : FixedPointSolver(options) {}

template <typename T>
void CeresSolverBase::WriteRow(const double* values, int64_t sample, Tensor* t) const {
  const int64_t n = state_size();
  T* row = t->data<T>() + sample * n;
  for (int64_t i = 0; i < n; ++i) row[i] = static_cast<T>(values[i]);
}

template <typename T>
void CeresSolverBase::ReadRow(const Tensor& t, int64_t sample, double* values) const {
  const int64_t n = state_size();
  const T* row = t.data<T>() + sample * n;
  for (int64_t i = 0; i < n; ++i) values[i] = static_cast<double>(row[i]);
}

int64_t CeresSolverBase::InitSolver() {
  const int64_t batch = batch_size();
  const int64_t n = state_size();
  point_ = Tensor(Shape{batch, n}, dtype());
  value_ = Tensor(Shape{batch, n}, dtype());
  unit_ = Tensor::Zeros(Shape{batch, n}, dtype());
  column_ = Tensor(Shape{batch, n}, dtype());
  energy_ = Tensor(Shape{1}, dtype());
  energy_gradient_ = Tensor(Shape{1, n}, dtype());
  ids_.assign(1, 0);
  cache_z_.assign(n, 0.0);
  cache_f_.assign(n, 0.0);
  cache_valid_ = false;
  cache_sample_ = -1;
  user_stopped_ = false;
  last_report_.clear();
  stalled_samples_ = 0;
  first_stalled_sample_ = -1;
  first_stall_report_.clear();
  first_stall_reason_.clear();
  return static_cast<int64_t>(point_.nbytes() + value_.nbytes() + unit_.nbytes() +
                              column_.nbytes() + energy_gradient_.nbytes()) +
         static_cast<int64_t>(2 * n * sizeof(double));
}

bool CeresSolverBase::EvaluateMapAt(int64_t sample, const double* params, double* fz) {
  const int64_t n = state_size();
  if (cache_valid_ && cache_sample_ == sample &&
      std::memcmp(cache_z_.data(), params, n * sizeof(double)) == 0) {
    std::copy(cache_f_.begin(), cache_f_.end(), fz);
    return true;
  }
  ids_[0] = sample;
  DispatchDType(dtype(), [&](auto zero) { WriteRow<decltype(zero)>(params, sample, &point_); });
  if (!EvaluateRows(ids_, point_, &value_)) return false;
  DispatchDType(dtype(), [&](auto zero) { ReadRow<decltype(zero)>(value_, sample, fz); });
  std::copy(params, params + n, cache_z_.begin());
  std::copy(fz, fz + n, cache_f_.begin());
  cache_sample_ = sample;
  cache_valid_ = true;
  return true;
}

bool CeresSolverBase::EvaluateJacobianAt(int64_t sample,
                                         const double* params,
                                         const double* fz,
                                         double* jacobian) {
  const int64_t n = state_size();
  // point_ / value_ rows must hold params and f(params) (forward differences use them).
  DispatchDType(dtype(), [&](auto zero) {
    using T = decltype(zero);
    WriteRow<T>(params, sample, &point_);
    WriteRow<T>(fz, sample, &value_);
  });
  ids_[0] = sample;
  bool ok = true;
  DispatchDType(dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* unit = unit_.data<T>() + sample * n;
    const T* column = column_.data<T>() + sample * n;
    for (int64_t j = 0; j < n && ok; ++j) {
      std::fill(unit, unit + n, T(0));
      unit[j] = T(1);
      ok = EvaluateJvpRows(ids_, point_, value_, unit_, &column_);
      if (!ok) break;
      for (int64_t i = 0; i < n; ++i) {
        jacobian[i * n + j] = static_cast<double>(column[i]) - (i == j ? 1.0 : 0.0);
      }
    }
    std::fill(unit, unit + n, T(0));
  });
  return ok;
}

bool CeresSolverBase::EvaluateEnergyAt(int64_t sample,
                                       const double* params,
                                       double* energy,
                                       double* gradient) {
  ids_[0] = sample;
  bool ok = false;
  DispatchDType(dtype(), [&](auto zero) {
    using T = decltype(zero);
    WriteRow<T>(params, sample, &point_);
    Tensor z = point_.SliceRows(sample, sample + 1);
    Tensor e = energy_;
    Tensor g = energy_gradient_;
    ok = problem().energy(z, ids_, &e, &g);
    AddEnergyEvaluations(1);
    if (!ok) return;
    *energy = e.at(0);
    const T* row = g.data<T>();
    for (int64_t i = 0; i < state_size(); ++i) gradient[i] = static_cast<double>(row[i]);
  });
  if (!ok) TerminateSample(sample, TerminationType::kFailure);
  return ok;
}

bool CeresSolverBase::ShouldStop(int64_t sample, int ceres_iteration, const double* params) {
  const int64_t n = state_size();
  std::vector<double> fz(n);
  if (!EvaluateMapAt(sample, params, fz.data())) return true;  // the map failed: kFailure
  // Judge the point as the base will: rounded to the state's dtype.
  double residual_sq = 0.0;
  double map_sq = 0.0;
  DispatchDType(dtype(), [&](auto zero) {
    using T = decltype(zero);
    for (int64_t i = 0; i < n; ++i) {
      const double d = fz[i] - static_cast<double>(static_cast<T>(params[i]));
      residual_sq += d * d;
      map_sq += fz[i] * fz[i];
    }
  });
  const double abs_residual = std::sqrt(residual_sq);
  const double rel_residual = abs_residual / (std::sqrt(map_sq) + options().relative_epsilon);
  if (!std::isfinite(abs_residual)) {
    NoteNonFinite();
    return false;
  }
  if (MeetsTolerance(abs_residual, rel_residual)) {
    converged_ = true;
    return true;
  }
  if (!options().callbacks.empty()) {
    IterationSummary s;
    s.iteration = ceres_iteration;
    s.active_samples = static_cast<int>(active_samples().size());
    s.max_abs_residual = abs_residual;
    s.max_rel_residual = rel_residual;
    s.function_evaluations = function_evaluations();
    s.elapsed_seconds = ElapsedSeconds();
    for (const IterationCallback& callback : options().callbacks) {
      if (callback(s) == CallbackReturnType::kStop) {
        user_stopped_ = true;
        return true;
      }
    }
  }
  return false;
}

void CeresSolverBase::StepSolver() {
  const int64_t n = state_size();
  std::vector<double> params(n);
  for (int64_t b : active_samples()) {
    if (user_stopped_) {
      TerminateSample(b, TerminationType::kUserStop);
      SetSampleIterations(b, 0);
      continue;
    }
    saw_non_finite_ = false;
    converged_ = false;
    // Start from the judged z0 and prime the cache with f(z0).
    DispatchDType(dtype(), [&](auto zero) {
      using T = decltype(zero);
      ReadRow<T>(state(), b, params.data());
      ReadRow<T>(map_value(), b, cache_f_.data());
    });
    std::copy(params.begin(), params.end(), cache_z_.begin());
    cache_sample_ = b;
    cache_valid_ = true;

    int ceres_iterations = 0;
    TerminationType outcome = TerminationType::kFailure;
    std::string reason;
    last_report_ = RunCeres(b, &params, &ceres_iterations, &outcome, &reason);

    // The final point and its map value become the sample's current row.
    std::vector<double> fz(n);
    const bool ok = EvaluateMapAt(b, params.data(), fz.data());
    DispatchDType(dtype(), [&](auto zero) {
      using T = decltype(zero);
      WriteRow<T>(params.data(), b, &state());
      if (ok) WriteRow<T>(fz.data(), b, &map_value());
    });
    SetSampleIterations(b, std::min(ceres_iterations, std::max(options().max_iterations, 0)));
    TerminationType end = outcome;
    if (converged_) {
      end = TerminationType::kStagnated;  // the base reports kConverged when the rule holds
    } else if (user_stopped_) {
      end = TerminationType::kUserStop;
    } else if (saw_non_finite_) {
      end = TerminationType::kNonFinite;
    } else if (end == TerminationType::kStagnated) {
      // Ceres ended by its own criteria (all disabled, so: a failed line
      // search or trust-region step) while our rule did not hold yet.
      if (stalled_samples_++ == 0) {
        first_stalled_sample_ = b;
        first_stall_report_ = last_report_;
        first_stall_reason_ = reason;
      }
    }
    TerminateSample(b, end);
  }
}

void CeresSolverBase::FinishSolver(SolverSummary* summary) {
  if (stalled_samples_ > 0) {
    summary->message += detail::StrCat(
        backend_name_, ": Ceres could make no further progress on ", stalled_samples_,
        " sample(s) before the stopping rule held, so they are reported STAGNATED at their "
        "best iterate (first: sample ", first_stalled_sample_, ", Ceres: ", first_stall_report_,
        "). ", stall_hint_, " ");
    // Name Ceres' own reason for stopping, not the base's stagnation window
    // (which Ceres samples never reach).
    SetStagnationNote(detail::StrCat("Ceres ended the solve by its own rule, first sample ",
                                     first_stalled_sample_, ": ", first_stall_reason_));
  }
  if (!last_report_.empty()) {
    summary->message += std::string("Ceres (last sample solved): ") + last_report_;
  }
}

// ---- L-BFGS / nonlinear CG on the energy ----

CeresLbfgsSolver::CeresLbfgsSolver(const ForwardSolverOptions& options) : CeresSolverBase(options) {
  backend_name_ = "ceres_lbfgs";
  stall_hint_ =
      "This is the usual precision floor of minimising an energy: near a minimum E changes by "
      "about |grad E|^2 per step, which drops below the rounding error of E (about machine "
      "epsilon x |E|) once the residual |grad E| nears sqrt(epsilon |E|), and the line search "
      "can no longer find a decrease. Ask for a looser tolerance, or refine with a fixed-point "
      "solver (e.g. fallback_chain: [anderson]).";
}

void CeresLbfgsSolver::ValidateProblem(const FixedPointProblem& problem) const {
  SP_CHECK(static_cast<bool>(problem.energy),
           "ceres_lbfgs: the problem has no energy (FixedPointProblem::energy); this backend "
           "minimises E and cannot solve a plain map");
}

std::string CeresLbfgsSolver::RunCeres(int64_t sample,
                                       std::vector<double>* params,
                                       int* ceres_iterations,
                                       TerminationType* outcome,
                                       std::string* reason) {
  const int n = static_cast<int>(state_size());
  ceres::GradientProblem problem(new EnergyFunction(this, sample, n));
  ceres::GradientProblemSolver::Options o;
  o.line_search_direction_type =
      options().ceres_line_search_direction == CeresLineSearchDirection::kLbfgs
          ? ceres::LBFGS
          : ceres::NONLINEAR_CONJUGATE_GRADIENT;
  o.max_num_iterations = options().max_iterations;
  o.function_tolerance = 0.0;
  o.gradient_tolerance = 0.0;
  o.parameter_tolerance = 0.0;
  o.logging_type = ceres::SILENT;
  o.minimizer_progress_to_stdout = false;
  o.update_state_every_iteration = true;
  StopRule stop(this, sample, params->data());
  o.callbacks.push_back(&stop);
  ceres::GradientProblemSolver::Summary summary;
  {
    const MuteCeresWarnings mute;
    ceres::Solve(o, problem, params->data(), &summary);
  }
  *ceres_iterations = std::max(0, static_cast<int>(summary.iterations.size()) - 1);
  *outcome = FromCeres(summary.termination_type, /*trust_region=*/false);
  *reason = std::string(ceres::TerminationTypeToString(summary.termination_type)) + ": " +
            summary.message;
  return summary.BriefReport();
}

// ---- trust region on F(z) = 0 ----

CeresTrustRegionSolver::CeresTrustRegionSolver(const ForwardSolverOptions& options)
    : CeresSolverBase(options) {
  backend_name_ = "ceres_trust_region";
  stall_hint_ =
      "The trust region could not find a step that reduces |F|^2 (its decrease fell below the "
      "rounding error of |F|^2, or the Jacobian is singular there).";
}

void CeresTrustRegionSolver::ValidateProblem(const FixedPointProblem& problem) const {
  SP_CHECK(problem.state_size <= options().ceres_max_state_size, "ceres_trust_region: state_size ",
           problem.state_size, " exceeds ceres_max_state_size ", options().ceres_max_state_size,
           " (the backend forms a dense n x n Jacobian per sample)");
}

std::string CeresTrustRegionSolver::RunCeres(int64_t sample,
                                             std::vector<double>* params,
                                             int* ceres_iterations,
                                             TerminationType* outcome,
                                             std::string* reason) {
  const int n = static_cast<int>(state_size());
  ceres::Problem problem;
  problem.AddResidualBlock(new ResidualFunction(this, sample, n), nullptr, params->data());
  ceres::Solver::Options o;
  o.trust_region_strategy_type =
      options().ceres_trust_region_strategy == CeresTrustRegionStrategy::kLevenbergMarquardt
          ? ceres::LEVENBERG_MARQUARDT
          : ceres::DOGLEG;
  o.linear_solver_type = ceres::DENSE_QR;
  o.max_num_iterations = options().max_iterations;
  o.function_tolerance = 0.0;
  o.gradient_tolerance = 0.0;
  o.parameter_tolerance = 0.0;
  o.num_threads = 1;
  o.logging_type = ceres::SILENT;
  o.minimizer_progress_to_stdout = false;
  o.update_state_every_iteration = true;
  StopRule stop(this, sample, params->data());
  o.callbacks.push_back(&stop);
  ceres::Solver::Summary summary;
  {
    const MuteCeresWarnings mute;
    ceres::Solve(o, &problem, &summary);
  }
  *ceres_iterations = std::max(0, static_cast<int>(summary.iterations.size()) - 1);
  *outcome = FromCeres(summary.termination_type, /*trust_region=*/true);
  *reason = std::string(ceres::TerminationTypeToString(summary.termination_type)) + ": " +
            summary.message;
  return summary.BriefReport();
}

std::unique_ptr<FixedPointSolver> CreateCeresLbfgsSolver(const ForwardSolverOptions& options) {
  return std::make_unique<CeresLbfgsSolver>(options);
}

std::unique_ptr<FixedPointSolver> CreateCeresTrustRegionSolver(
    const ForwardSolverOptions& options) {
  return std::make_unique<CeresTrustRegionSolver>(options);
}

}  // namespace stillpoint
