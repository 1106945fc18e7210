#include "training/summary_json.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <sstream>

#include "training/config/config.h"
#include "training/confusion.h"
#include "training/metrics.h"

namespace stillpoint {
namespace {

double Number(const YAML::Node& node, const std::string& key, double fallback = kNaN) {
  const YAML::Node value = node[key];
  if (!value || value.IsNull()) return fallback;
  return value.as<double>();
}

SolverStats StatsFromJson(const YAML::Node& node) {
  SolverStats stats;
  if (!node || !node.IsMap()) return stats;
  stats.iterations_mean = Number(node, "iterations_mean", 0);
  stats.iterations_max = Number(node, "iterations_max", 0);
  stats.residual_max = Number(node, "residual_max");
  stats.tolerance = Number(node, "tolerance", 0);
  stats.converged = static_cast<int64_t>(Number(node, "converged", 0));
  stats.not_converged = static_cast<int64_t>(Number(node, "not_converged", 0));
  stats.inexact = static_cast<int64_t>(Number(node, "inexact", 0));
  if (node["status"] && node["status"].IsMap()) {
    for (const auto& entry : node["status"]) {
      stats.status_counts[entry.first.as<std::string>()] = entry.second.as<int64_t>();
    }
  }
  return stats;
}

// true / false, or null when there was no tolerance or no measured residual.
std::string ToleranceMetJson(const SolverStats& stats) {
  if (stats.tolerance <= 0 || !stats.HasResidual()) return "null";
  return stats.ToleranceMissed() ? "false" : "true";
}

// Why a run has no held-out figures.
std::string NoEvaluationReason(const TrainSummary& s) {
  if (s.stopped_early || s.stop_signal != 0) {
    return "the run stopped before its first evaluation: " + s.stop_reason;
  }
  return "no evaluation ran";
}

// {"forward": {...}, "backward": {...}} of one family's tallies.
std::string FamilyJson(const ImplicitTally& t) {
  auto tally = [](const SolveTally& x) {
    std::string out = "{\"solves\": " + std::to_string(x.solves) +
                      ", \"unconverged_solves\": " + std::to_string(x.unconverged_solves) +
                      ", \"failed_solves\": " + std::to_string(x.failed_solves) +
                      ", \"samples\": " + std::to_string(x.samples) +
                      ", \"converged_samples\": " + std::to_string(x.converged_samples) +
                      ", \"inexact_samples\": " + std::to_string(x.inexact_samples) +
                      ", \"status\": " + StatusCountsJson(x.status_counts);
    return out + "}";
  };
  return "{\"forward\": " + tally(t.forward) + ", \"backward\": " + tally(t.backward) + "}";
}

// {"model": {...}, "attention": {...}, "hopfield": {...}}: the whole run's
// tallies of every family.
std::string RunSolveCountsJson(const RunSolveCounts& counts) {
  std::string out = "{";
  for (SolveFamily f : kSolveFamilies) {
    out += std::string(f == SolveFamily::kModel ? "" : ", ") + JsonString(ToString(f)) + ": " +
           FamilyJson(counts.solves[f]);
  }
  return out + "}";
}

// The last gradient check with its step, or null when none ran.
std::string GradientCheckJson(const TrainSummary& s) {
  if (!s.gradient_check.ran) return "null";
  const GradientCheck& g = s.gradient_check;
  std::ostringstream out;
  out << "{\"step\": " << s.gradient_check_step << ", \"cosine\": " << JsonNumber(g.cosine)
      << ", \"relative_error\": " << JsonNumber(g.relative_error) << ", \"no_reference\": "
      << (g.no_reference.empty() ? "null" : JsonString(g.no_reference))
      << ", \"used_depth\": " << g.used_depth
      << ", \"reference\": \"ift/gmres\", \"reference_tolerance\": "
      << JsonNumber(g.reference_tolerance)
      << ", \"reference_residual\": " << JsonNumber(g.reference_residual)
      << ", \"reference_status\": " << JsonString(g.reference_status)
      << ", \"spectral_radius\": " << JsonNumber(g.spectral_radius) << "}";
  return out.str();
}

}  // namespace

std::string SummaryJson(const TrainSummary& s) {
  const bool evaluated = s.final_eval.examples > 0;
  const RunSolveCounts& counts = s.solve_counts;
  std::ostringstream out;
  out << "{\n  \"steps\": " << s.steps << ",\n  \"skipped_steps\": " << s.skipped_steps
      << ",\n  \"stopped_early\": " << (s.stopped_early ? "true" : "false")
      << ",\n  \"stop_reason\": " << JsonString(s.stop_reason)
      << ",\n  \"parameters\": " << s.num_parameters
      << ",\n  \"checkpoints_written\": " << s.checkpoints_written
      << ",\n  \"final_train_loss\": " << JsonNumber(s.final_train_loss)
      << ",\n  \"final_train_accuracy\": " << JsonNumber(s.final_train_accuracy)
      << ",\n  \"test_loss\": " << JsonNumberIf(evaluated, s.final_eval.loss)
      << ",\n  \"test_accuracy\": " << JsonNumberIf(evaluated, s.final_eval.accuracy)
      << ",\n  \"test_bpc\": " << JsonNumberIf(evaluated, s.test_bpc)
      << ",\n  \"test_unknown_characters\": " << s.test_unknown_symbols
      << ",\n  \"test_solved_fraction\": "
      << JsonNumberIf(evaluated, s.final_eval.solved_fraction)
      << ",\n  \"test_examples\": " << s.final_eval.examples
      << ",\n  \"test_not_evaluated\": "
      << (evaluated ? "null" : JsonString(NoEvaluationReason(s)))
      << ",\n  \"test_forward_iterations_mean\": "
      << JsonNumberIf(evaluated && s.final_eval.forward.Ran(), s.final_eval.forward.iterations_mean)
      << ",\n  \"path_independence_cosine\": "
      << JsonNumberIf(evaluated, s.final_eval.path_independence.cosine)
      << ",\n  \"path_independence_agreement\": "
      << JsonNumberIf(evaluated, s.final_eval.path_independence.agreement)
      << ",\n  \"seconds_per_step\": " << JsonNumber(s.seconds_per_step)
      << ",\n  \"peak_rss_mb\": " << JsonNumber(s.peak_rss_mb)
      << ",\n  \"pool_peak_mb\": " << JsonNumber(s.pool_peak_mb)
      << ",\n  \"forward_iterations_mean\": " << JsonNumberIf(s.forward.Ran(), s.forward.iterations_mean)
      << ",\n  \"forward_residual_max\": " << JsonNumberIf(s.forward.Ran(), s.forward.residual_max)
      << ",\n  \"backward_iterations_mean\": " << JsonNumberIf(s.backward.Ran(), s.backward.iterations_mean)
      << ",\n  \"backward_residual_max\": " << JsonNumberIf(s.backward.Ran(), s.backward.residual_max)
      << ",\n  \"attention_iterations_mean\": " << JsonNumberIf(s.attention_forward.Ran(), s.attention_forward.iterations_mean)
      << ",\n  \"attention_residual_max\": " << JsonNumberIf(s.attention_forward.Ran(), s.attention_forward.residual_max)
      << ",\n  \"attention_backward_iterations_mean\": "
      << JsonNumberIf(s.attention_backward.Ran(), s.attention_backward.iterations_mean)
      << ",\n  \"attention_backward_residual_max\": "
      << JsonNumberIf(s.attention_backward.Ran(), s.attention_backward.residual_max)
      << ",\n  \"forward_tolerance\": " << JsonNumber(s.forward.tolerance)
      << ",\n  \"forward_tolerance_met\": " << ToleranceMetJson(s.forward)
      << ",\n  \"forward_status\": " << StatusCountsJson(s.forward.status_counts)
      << ",\n  \"backward_tolerance\": " << JsonNumber(s.backward.tolerance)
      << ",\n  \"backward_tolerance_met\": " << ToleranceMetJson(s.backward)
      << ",\n  \"backward_status\": " << StatusCountsJson(s.backward.status_counts)
      << ",\n  \"forward_unconverged_steps\": " << counts.forward_unconverged(SolveFamily::kModel)
      << ",\n  \"backward_unconverged_steps\": "
      << counts.backward_unconverged(SolveFamily::kModel)
      << ",\n  \"attention_forward_unconverged_steps\": "
      << counts.forward_unconverged(SolveFamily::kAttention)
      << ",\n  \"attention_backward_unconverged_steps\": "
      << counts.backward_unconverged(SolveFamily::kAttention)
      << ",\n  \"hopfield_forward_unconverged_steps\": "
      << counts.forward_unconverged(SolveFamily::kHopfield)
      << ",\n  \"hopfield_backward_unconverged_steps\": "
      << counts.backward_unconverged(SolveFamily::kHopfield)
      << ",\n  \"solve_counts\": " << RunSolveCountsJson(counts)
      << ",\n  \"solvers\": {\"forward\": " << SolverStatsJson(s.forward)
      << ", \"backward\": " << SolverStatsJson(s.backward)
      << ", \"attention_forward\": " << SolverStatsJson(s.attention_forward)
      << ", \"attention_backward\": " << SolverStatsJson(s.attention_backward) << "}"
      << ",\n  \"per_class_accuracy\": "
      << (s.confusion.classes() > 0 ? PerClassAccuracyJson(s.confusion) : "null")
      << ",\n  \"provenance\": " << ProvenanceJson(s.provenance)
      << ",\n  \"gradient_check\": " << GradientCheckJson(s)
      << ",\n  \"equilibrium\": " << s.equilibrium.Json() << "\n}\n";
  return out.str();
}


std::string SolverStatsJson(const SolverStats& stats) {
  std::string out = "{\"iterations_mean\": " + JsonNumber(stats.iterations_mean) +
                    ", \"iterations_max\": " + JsonNumber(stats.iterations_max) +
                    ", \"residual_max\": " + JsonNumber(stats.residual_max) +
                    ", \"tolerance\": " + JsonNumber(stats.tolerance) +
                    ", \"converged\": " + std::to_string(stats.converged) +
                    ", \"not_converged\": " + std::to_string(stats.not_converged) +
                    ", \"inexact\": " + std::to_string(stats.inexact) +
                    ", \"status\": " + StatusCountsJson(stats.status_counts);
  return out + "}";
}

TrainSummary ReadTrainSummary(const std::string& run_dir) {
  const std::string path = (std::filesystem::path(run_dir) / "summary.json").string();
  if (!std::filesystem::is_regular_file(path)) {
    throw ConfigError("'" + run_dir + "' is not a finished run directory (no summary.json)");
  }
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& error) {
    throw ConfigError(path + ": malformed JSON (" + error.msg + ")");
  }
  if (!root.IsMap()) throw ConfigError(path + ": expected a JSON object");
  TrainSummary s;
  try {
    s.run_dir = run_dir;
    s.steps = static_cast<int64_t>(Number(root, "steps", 0));
    s.skipped_steps = static_cast<int64_t>(Number(root, "skipped_steps", 0));
    s.stopped_early = root["stopped_early"] && root["stopped_early"].as<bool>();
    if (root["stop_reason"] && !root["stop_reason"].IsNull()) {
      s.stop_reason = root["stop_reason"].as<std::string>();
    }
    s.num_parameters = static_cast<int64_t>(Number(root, "parameters", 0));
    s.final_train_loss = Number(root, "final_train_loss");
    s.final_train_accuracy = Number(root, "final_train_accuracy");
    s.final_eval.loss = Number(root, "test_loss");
    s.final_eval.accuracy = Number(root, "test_accuracy");
    s.final_eval.solved_fraction = Number(root, "test_solved_fraction");
    s.test_bpc = Number(root, "test_bpc");
    s.language_model = !std::isnan(s.test_bpc);
    s.test_unknown_symbols = static_cast<int64_t>(Number(root, "test_unknown_characters", 0));
    s.final_eval.examples = static_cast<int64_t>(Number(root, "test_examples", 0));
    s.seconds_per_step = Number(root, "seconds_per_step");
    s.peak_rss_mb = Number(root, "peak_rss_mb");
    s.pool_peak_mb = Number(root, "pool_peak_mb");
    const YAML::Node solvers = root["solvers"];
    if (solvers && solvers.IsMap()) {
      s.forward = StatsFromJson(solvers["forward"]);
      s.backward = StatsFromJson(solvers["backward"]);
      s.attention_forward = StatsFromJson(solvers["attention_forward"]);
      s.attention_backward = StatsFromJson(solvers["attention_backward"]);
    }
    if (root["provenance"] && root["provenance"].IsMap()) {
      YAML::Emitter json;
      json << YAML::DoubleQuoted << YAML::Flow << root["provenance"];
      s.provenance = ProvenanceFromJson(json.c_str());
    }
    const YAML::Node check = root["gradient_check"];
    if (check && check.IsMap()) {
      s.gradient_check.ran = true;
      s.gradient_check.cosine = Number(check, "cosine");
      s.gradient_check.relative_error = Number(check, "relative_error");
      s.gradient_check_step = static_cast<int64_t>(Number(check, "step", 0));
      if (check["no_reference"] && !check["no_reference"].IsNull()) {
        s.gradient_check.no_reference = check["no_reference"].as<std::string>();
      }
    }
    const YAML::Node equilibrium = root["equilibrium"];
    if (equilibrium && equilibrium.IsMap()) {
      s.equilibrium.applies = true;
      s.equilibrium.verdict = equilibrium["verdict"].as<std::string>("");
      s.equilibrium.gradient_cosine_min = Number(equilibrium, "gradient_cosine_min");
    }
  } catch (const YAML::Exception& error) {
    throw ConfigError(path + ": unexpected value (" + error.msg + ")");
  }
  return s;
}

}  // namespace stillpoint
