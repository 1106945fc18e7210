#include "training/health.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "training/metrics.h"
#include "training/config/option_schema.h"

namespace stillpoint {
namespace {

constexpr double kInf = std::numeric_limits<double>::max();

std::string Number(double value, const char* format = "%.4g") {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), format, value);
  return buffer;
}

// The decimals (2 to 6) it takes for the percents of `fraction` and
// `threshold` to read differently: 99.896% < 99.900%, not 99.90% < 99.90%.
int DecimalsApart(double fraction, double threshold) {
  int decimals = 2;
  for (; decimals < 6; ++decimals) {
    const std::string format = "%." + std::to_string(decimals) + "f";
    if (Number(100.0 * fraction, format.c_str()) != Number(100.0 * threshold, format.c_str())) {
      break;
    }
  }
  return decimals;
}

std::string Percent(double fraction, int decimals) {
  const std::string format = "%." + std::to_string(decimals) + "f";
  return Number(100.0 * fraction, format.c_str()) + "%";
}

std::string TallyJson(const SolveTally& t) {
  std::string out = "{\"solves\": " + std::to_string(t.solves) +
                    ", \"unconverged_solves\": " + std::to_string(t.unconverged_solves) +
                    ", \"failed_solves\": " + std::to_string(t.failed_solves) +
                    ", \"samples\": " + std::to_string(t.samples) +
                    ", \"converged_samples\": " + std::to_string(t.converged_samples) +
                    ", \"inexact_samples\": " + std::to_string(t.inexact_samples) +
                    ", \"converged_fraction\": " + JsonNumber(t.ConvergedFraction()) +
                    ", \"status\": " + StatusCountsJson(t.status_counts);
  return out + "}";
}

}  // namespace

const OptionFields<HealthOptions>& HealthOptions::Fields() {
  using O = HealthOptions;
  static const auto* fields =
      &(new OptionFields<O>)
           ->Double("max_spectral_radius", &O::max_spectral_radius,
                    OptionBounds::OpenClosed(0.0, kInf),
                    "The equilibrium verdict (summary.json equilibrium): an implicit layer is "
                    "healthy only if the spectral radius of J_f at z* stays below this at every "
                    "evaluation")
           .Double("min_converged_fraction", &O::min_converged_fraction, 0.0, 1.0,
                   "The equilibrium verdict: the fraction of samples whose forward and adjoint "
                   "solves met their tolerance over the run must be at least this, for every "
                   "implicit layer")
           .Double("min_gradient_cosine", &O::min_gradient_cosine, -1.0, 1.0,
                   "The equilibrium verdict: the cosine between the gradient used and a "
                   "converged reference must be at least this at every evaluation's gradient "
                   "check (eval.gradient_check_batch_size)");
  return *fields;
}

HealthOptions HealthOptions::FromConfig(const Config& config) {
  return ReadOptionKeys(config, "health.", Fields());
}

void EquilibriumMonitor::AddSpectralRadius(SolveFamily family, double radius, double eigenvalue) {
  if (std::isnan(radius)) return;
  double& max = spectral_radius_max[static_cast<int>(family)];
  if (std::isnan(max) || radius > max || std::isinf(radius)) {
    max = radius;
    dominant_eigenvalue[static_cast<int>(family)] = eigenvalue;
  }
}

void EquilibriumMonitor::AddGradientCheck(double cosine, const std::string& no_reference) {
  ++gradient_checks;
  if (!no_reference.empty()) {
    ++checks_without_reference;
    no_reference_reason = no_reference;
    return;
  }
  // A NaN cosine with a reference (a zero gradient) is the worst there is.
  if (std::isnan(cosine)) cosine = -1.0;
  if (std::isnan(gradient_cosine_min) || cosine < gradient_cosine_min) {
    gradient_cosine_min = cosine;
  }
}

Equilibrium AssessEquilibrium(bool has_implicit_layer, const RunSolveCounts& counts,
                              const EquilibriumMonitor& monitor, const HealthOptions& options) {
  Equilibrium e;
  e.thresholds = options;
  if (!has_implicit_layer) return e;
  e.applies = true;
  e.gradient_cosine_min = monitor.gradient_cosine_min;
  e.gradient_checks = monitor.gradient_checks;
  e.checks_without_reference = monitor.checks_without_reference;
  e.no_reference_reason = monitor.no_reference_reason;
  std::vector<std::string> reasons;
  for (SolveFamily f : kSolveFamilies) {
    const double radius = monitor.spectral_radius_max[static_cast<int>(f)];
    const ImplicitTally& solves = counts.solves[f];
    if (solves.forward.empty() && solves.backward.empty() && std::isnan(radius)) continue;
    const double eigenvalue = monitor.dominant_eigenvalue[static_cast<int>(f)];
    e.layers.push_back({f, radius, eigenvalue, solves});
    const std::string name = ToString(f);
    if (!(std::isnan(radius) || radius < options.max_spectral_radius)) {
      std::string reason = name + " spectral radius " + Number(radius) + " >= " +
                           Number(options.max_spectral_radius);
      if (!std::isnan(eigenvalue)) {
        // Which side the dominant eigenvalue is on says what would help.
        reason += " (eigenvalue " + Number(eigenvalue) +
                  (eigenvalue < 0 ? ": an overshooting step, damping contracts it)"
                                  : ": an expanding direction)");
      }
      reasons.push_back(reason);
    }
    for (const auto& [what, tally] :
         {std::pair<const char*, const SolveTally*>{"forward", &solves.forward},
          {"adjoint", &solves.backward}}) {
      const double fraction = tally->ConvergedFraction();
      if (!std::isnan(fraction) && fraction < options.min_converged_fraction) {
        const int decimals = DecimalsApart(fraction, options.min_converged_fraction);
        reasons.push_back(name + " " + what + " solves converged for " +
                          Percent(fraction, decimals) + " of samples < " +
                          Percent(options.min_converged_fraction, decimals));
      }
    }
  }
  if (monitor.gradient_checks == 0) {
    reasons.push_back("no gradient check ran (eval.gradient_check_batch_size 0, or no evaluation)");
  } else {
    if (monitor.checks_without_reference > 0) {
      reasons.push_back("no converged reference gradient at " +
                        std::to_string(monitor.checks_without_reference) + " of " +
                        std::to_string(monitor.gradient_checks) + " evaluations (" +
                        monitor.no_reference_reason + ")");
    }
    if (!std::isnan(monitor.gradient_cosine_min) &&
        monitor.gradient_cosine_min < options.min_gradient_cosine) {
      reasons.push_back("gradient cosine " + Number(monitor.gradient_cosine_min, "%.4f") + " < " +
                        Number(options.min_gradient_cosine));
    }
  }
  if (reasons.empty()) {
    e.verdict = "healthy";
  } else {
    e.verdict = "unhealthy: ";
    for (std::size_t i = 0; i < reasons.size(); ++i) e.verdict += (i ? "; " : "") + reasons[i];
  }
  return e;
}

std::string Equilibrium::Json() const {
  if (!applies) return "null";
  std::ostringstream out;
  out << "{\"verdict\": " << JsonString(verdict) << ", \"layers\": {";
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const EquilibriumLayer& l = layers[i];
    out << (i ? ", " : "") << JsonString(ToString(l.family))
        << ": {\"spectral_radius_max\": " << JsonNumber(l.spectral_radius_max)
        << ", \"dominant_eigenvalue\": " << JsonNumber(l.dominant_eigenvalue)
        << ", \"forward_converged_fraction\": " << JsonNumber(l.solves.forward.ConvergedFraction())
        << ", \"backward_converged_fraction\": "
        << JsonNumber(l.solves.backward.ConvergedFraction())
        << ", \"forward\": " << TallyJson(l.solves.forward)
        << ", \"backward\": " << TallyJson(l.solves.backward) << "}";
  }
  out << "}, \"gradient_cosine_min\": " << JsonNumber(gradient_cosine_min)
      << ", \"gradient_checks\": " << gradient_checks
      << ", \"gradient_checks_without_reference\": " << checks_without_reference
      << ", \"no_reference_reason\": "
      << (no_reference_reason.empty() ? "null" : JsonString(no_reference_reason))
      << ", \"thresholds\": {\"max_spectral_radius\": "
      << JsonNumber(thresholds.max_spectral_radius)
      << ", \"min_converged_fraction\": " << JsonNumber(thresholds.min_converged_fraction)
      << ", \"min_gradient_cosine\": " << JsonNumber(thresholds.min_gradient_cosine) << "}}";
  return out.str();
}

std::string VerdictCell(const std::string& verdict) {
  if (verdict.empty()) return "-";
  if (verdict == "healthy") return verdict;
  const std::size_t reasons =
      1 + static_cast<std::size_t>(std::count(verdict.begin(), verdict.end(), ';'));
  return "unhealthy (" + std::to_string(reasons) + ")";
}

}  // namespace stillpoint
