#include "training/resume.h"

#include <exception>

#include "training/config_schema.h"

namespace stillpoint {
namespace {

const char* const kWarmStartPrefix = "adjoint_warm_start/";

std::shared_ptr<AdjointWarmStart> WarmStartOf(const SequenceModel& model) {
  const Implicit* layer = model.implicit();
  return layer ? layer->options().adjoint_warm_start : nullptr;
}

}  // namespace

bool MayChangeOnResume(const std::string& key) {
  static const char* const kKeys[] = {
      "train.steps", "train.eval_every", "train.log_every", "train.checkpoint_every",
      "log.dir",     "log.progress",     "log.plots"};
  for (const char* k : kKeys) {
    if (key == k) return true;
  }
  return key.rfind("eval.", 0) == 0 || key.rfind("compare.", 0) == 0;
}

CheckpointState LoadCheckpointForResume(const std::string& path,
                                        const Config& current,
                                        bool force,
                                        std::vector<std::string>* forced) {
  CheckpointState state;
  try {
    state = LoadCheckpoint(path);
  } catch (const ConfigError&) {
    throw;
  } catch (const std::exception& e) {
    throw ConfigError(std::string(e.what()) +
                      " (--resume reads it; move it away to start the run afresh)");
  }
  Config stored;
  try {
    stored = Config::FromYaml(current.schema(), state.config_yaml, path + " (stored config)");
  } catch (const ConfigError& e) {
    if (!force) {
      throw ConfigError(std::string(e.what()) +
                        "; the checkpoint's config does not load in this version (--force "
                        "resumes without comparing it)");
    }
    if (forced) forced->push_back(std::string("stored config not compared: ") + e.what());
    return state;
  }
  std::vector<std::string> differences;
  for (const ConfigKey& key : current.schema().keys()) {
    if (MayChangeOnResume(key.path)) continue;
    const std::string before = stored.ValueText(key.path), now = current.ValueText(key.path);
    if (before != now) {
      differences.push_back(key.path + ": " + (before.empty() ? "(unset)" : before) + " -> " +
                            (now.empty() ? "(unset)" : now) + " (now from " +
                            current.Origin(key.path) + ")");
    }
  }
  if (differences.empty()) return state;
  if (force) {
    if (forced) forced->insert(forced->end(), differences.begin(), differences.end());
    return state;
  }
  std::string message = path +
                        ": the checkpoint was trained with another config; resuming "
                        "would not continue that run. Differences:";
  for (const std::string& d : differences) message += "\n  " + d;
  message +=
      "\nOnly train.steps, the eval/log/checkpoint cadence, eval.* and log.* may change "
      "on --resume; --force resumes anyway.";
  throw ConfigError(message);
}

NamedTensors WarmStartState(const std::vector<SequenceModel*>& models) {
  NamedTensors state;
  for (std::size_t i = 0; i < models.size(); ++i) {
    const std::shared_ptr<AdjointWarmStart> warm = WarmStartOf(*models[i]);
    if (warm && warm->solution.defined()) {
      state.emplace_back(kWarmStartPrefix + std::to_string(i), warm->solution.Clone());
    }
  }
  return state;
}

void RestoreWarmStartState(const NamedTensors& state,
                           const std::vector<SequenceModel*>& models,
                           const std::string& source) {
  for (const auto& [name, tensor] : state) {
    if (name.rfind(kWarmStartPrefix, 0) != 0) continue;
    std::size_t index = models.size();
    try {
      index = std::stoul(name.substr(std::string(kWarmStartPrefix).size()));
    } catch (const std::exception&) {
    }
    const std::shared_ptr<AdjointWarmStart> warm =
        index < models.size() ? WarmStartOf(*models[index]) : nullptr;
    if (!warm) {
      throw ConfigError(source + ": holds solver state '" + name +
                        "' that this model has no place for");
    }
    warm->solution = tensor.Clone();
  }
}

}  // namespace stillpoint
