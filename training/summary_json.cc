#include "training/summary_json.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "training/config.h"
#include "training/metrics.h"

namespace stillpoint {
namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

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

}  // namespace

std::string SolverStatsJson(const SolverStats& stats) {
  std::string out = "{\"iterations_mean\": " + JsonNumber(stats.iterations_mean) +
                    ", \"iterations_max\": " + JsonNumber(stats.iterations_max) +
                    ", \"residual_max\": " + JsonNumber(stats.residual_max) +
                    ", \"tolerance\": " + JsonNumber(stats.tolerance) +
                    ", \"converged\": " + std::to_string(stats.converged) +
                    ", \"not_converged\": " + std::to_string(stats.not_converged) +
                    ", \"inexact\": " + std::to_string(stats.inexact) + ", \"status\": {";
  bool first = true;
  for (const auto& [status, count] : stats.status_counts) {
    out += (first ? "" : ", ") + JsonString(status) + ": " + std::to_string(count);
    first = false;
  }
  return out + "}}";
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
    s.num_parameters = static_cast<int64_t>(Number(root, "parameters", 0));
    s.final_train_loss = Number(root, "final_train_loss");
    s.final_train_accuracy = Number(root, "final_train_accuracy");
    s.final_eval.loss = Number(root, "test_loss");
    s.final_eval.accuracy = Number(root, "test_accuracy");
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
    }
  } catch (const YAML::Exception& error) {
    throw ConfigError(path + ": unexpected value (" + error.msg + ")");
  }
  return s;
}

}  // namespace stillpoint
