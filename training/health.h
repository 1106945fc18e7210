// The health verdict of a training run's equilibria (summary.json
// `equilibrium`): is each implicit layer at a contracting fixed point, did
// its solves meet their tolerances, and is the gradient it trained with the
// implicit gradient?
//
// Measured over the whole run:
//   - per implicit layer family (training/solve_counts.h), the largest
//     spectral radius of J_f at z* seen at any evaluation (where it is
//     estimated: the model's own layer), and the fraction of samples whose
//     forward and adjoint solves met their tolerance over every training
//     step;
//   - the smallest gradient cosine of the evaluations' gradient checks
//     (training/gradient_check.h), and how many checks had no converged
//     reference.
// verdict: "healthy" when every threshold of health.* holds, else
// "unhealthy: " and every reason, "; "-separated.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "framework/option_fields.h"
#include "training/config/config.h"
#include "training/solve_counts.h"

namespace stillpoint {

// health.*
struct HealthOptions {
  // A layer is contracting when its largest spectral radius stays below
  // this at every evaluation.
  double max_spectral_radius = 1.0;
  // The fraction of samples whose forward (and adjoint) solves met their
  // tolerance over the run must be at least this.
  double min_converged_fraction = 0.999;
  // The gradient cosine against a converged reference must be at least
  // this at every evaluation.
  double min_gradient_cosine = 0.999;

  static const OptionFields<HealthOptions>& Fields();
  static HealthOptions FromConfig(const Config& config);
};

// What the evaluations measured, updated at each (training/train_hooks.h
// LogHook).
struct EquilibriumMonitor {
  static constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  // Per family (SolveFamily order); NaN: never estimated.
  std::array<double, 3> spectral_radius_max = {kNaN, kNaN, kNaN};
  // The signed dominant eigenvalue of the evaluation with the largest
  // radius (near -radius: an overshooting step; near +radius: expansion,
  // a saddle of an energy); NaN when not estimated.
  std::array<double, 3> dominant_eigenvalue = {kNaN, kNaN, kNaN};
  // Over the checks with a converged reference; NaN: none.
  double gradient_cosine_min = kNaN;
  int64_t gradient_checks = 0;
  // Checks whose reference did not converge (no cosine), and the last one's
  // reason.
  int64_t checks_without_reference = 0;
  std::string no_reference_reason;

  void AddSpectralRadius(SolveFamily family, double radius,
                         double eigenvalue = std::numeric_limits<double>::quiet_NaN());
  // A check's cosine (NaN when it had no reference, with `reason`).
  void AddGradientCheck(double cosine, const std::string& no_reference);
};

struct EquilibriumLayer {
  SolveFamily family = SolveFamily::kModel;
  double spectral_radius_max = std::numeric_limits<double>::quiet_NaN();
  double dominant_eigenvalue = std::numeric_limits<double>::quiet_NaN();
  ImplicitTally solves;  // over the run's training steps
};

struct Equilibrium {
  // false for a model without any implicit layer (summary.json: null).
  bool applies = false;
  std::vector<EquilibriumLayer> layers;  // the families that ran solves
  double gradient_cosine_min = std::numeric_limits<double>::quiet_NaN();
  int64_t gradient_checks = 0;
  int64_t checks_without_reference = 0;
  std::string no_reference_reason;
  HealthOptions thresholds;
  std::string verdict;  // "healthy" or "unhealthy: <reasons>"

  bool healthy() const { return verdict == "healthy"; }
  // The JSON object of summary.json.
  std::string Json() const;
};

// The verdict on a run's counts and evaluations. `has_implicit_layer`:
// whether the model has one (else Equilibrium::applies is false).
Equilibrium AssessEquilibrium(bool has_implicit_layer, const RunSolveCounts& counts,
                              const EquilibriumMonitor& monitor, const HealthOptions& options);

// The short form for tables: "healthy", "unhealthy (3)" with the count of
// reasons, "-" when it does not apply.
std::string VerdictCell(const std::string& verdict);

}  // namespace stillpoint
