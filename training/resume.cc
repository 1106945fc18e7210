#include "training/resume.h"

#include <algorithm>
#include <exception>

#include "layers/dropout.h"
#include "training/config_schema.h"

namespace stillpoint {
namespace {

const char* const kWarmStartPrefix = "adjoint_warm_start/";

// The model's adjoint warm start, or null when its implicit layer does not
// use one (backward.warm_start off): such a model has no place for one.
std::shared_ptr<AdjointWarmStart> WarmStartOf(const SequenceModel& model) {
  const Implicit* layer = model.implicit();
  if (layer == nullptr || !layer->options().backward.warm_start) return nullptr;
  return layer->adjoint_warm_start();
}

// Whether two configs hold the same value for key: numbers compared as
// numbers (`lr: 1.0e-3` is `0.001`), booleans as booleans, the rest as text.
bool SameValue(const Config& a, const Config& b, const ConfigKey& key) {
  const std::string text_a = a.ValueText(key.path), text_b = b.ValueText(key.path);
  if (text_a == text_b) return true;
  if (text_a.empty() || text_b.empty()) return false;  // set in one only
  switch (key.type) {
    case ConfigType::kBool:
      return a.GetBool(key.path) == b.GetBool(key.path);
    case ConfigType::kInt:
      return a.GetInt(key.path) == b.GetInt(key.path);
    case ConfigType::kDouble:
      return a.GetDouble(key.path) == b.GetDouble(key.path);
    case ConfigType::kDoubleList:
      return a.GetDoubleList(key.path) == b.GetDoubleList(key.path);
    default:
      return false;
  }
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
    if (!SameValue(stored, current, key)) {
      const std::string before = stored.ValueText(key.path), now = current.ValueText(key.path);
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

namespace {

// Every Dropout in module's tree with its dotted path.
void CollectDropouts(Module& module,
                     const std::string& path,
                     std::vector<std::pair<std::string, Dropout*>>* found) {
  if (auto* dropout = dynamic_cast<Dropout*>(&module)) found->emplace_back(path, dropout);
  for (const auto& [name, child] : module.children()) {
    CollectDropouts(*child, path.empty() ? name : path + "." + name, found);
  }
}

std::vector<std::pair<std::string, Dropout*>> Dropouts(const std::vector<SequenceModel*>& models) {
  std::vector<std::pair<std::string, Dropout*>> found;
  for (std::size_t i = 0; i < models.size(); ++i) {
    CollectDropouts(*models[i], std::to_string(i), &found);
  }
  return found;
}

}  // namespace

std::map<std::string, std::string> RandomStreamState(const std::vector<SequenceModel*>& models) {
  std::map<std::string, std::string> streams;
  for (const auto& [name, dropout] : Dropouts(models)) streams[name] = dropout->SaveStreamState();
  return streams;
}

bool RestoreRandomStreamState(const std::map<std::string, std::string>& streams,
                              const std::vector<SequenceModel*>& models,
                              const std::string& source) {
  const auto dropouts = Dropouts(models);
  for (const auto& [name, dropout] : dropouts) {
    if (!streams.count(name)) return false;
  }
  for (const auto& entry : streams) {
    const std::string& name = entry.first;
    const std::string& stream = entry.second;
    auto it = std::find_if(dropouts.begin(), dropouts.end(),
                           [&name](const auto& d) { return d.first == name; });
    if (it == dropouts.end()) {
      throw ConfigError(source + ": holds the random stream of '" + name +
                        "', which this model does not have");
    }
    if (!it->second->LoadStreamState(stream)) {
      throw ConfigError(source + ": the random stream of '" + name + "' does not parse");
    }
  }
  return true;
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
