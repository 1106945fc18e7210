#include "training/data/dataset_registry.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <sstream>
#include <stdexcept>

#include "training/data/task_list.h"

namespace stillpoint {
namespace {

// The built-in tasks' names, in the list's order.
const std::vector<std::string>& BuiltInTaskNames() {
#define SP_TASK_NAME(Name, name) name,
  static const std::vector<std::string> names = {SP_TASKS(SP_TASK_NAME)};
#undef SP_TASK_NAME
  return names;
}

// The keys a task declares, in its declaration's order.
std::vector<ConfigKey> KeysOf(const TaskDefinition& task) {
  ConfigSchema own;
  task.declare_keys(own);
  return own.keys();
}

bool SameKey(const ConfigKey& a, const ConfigKey& b) {
  return a.type == b.type && a.default_value == b.default_value && a.choices == b.choices &&
         a.has_min == b.has_min && a.has_max == b.has_max && a.min == b.min && a.max == b.max &&
         a.min_open == b.min_open && a.max_open == b.max_open &&
         a.zero_allowed == b.zero_allowed && a.required == b.required;
}

std::string Join(const std::vector<std::string>& items, const std::string& separator) {
  std::string text;
  for (const std::string& item : items) text += (text.empty() ? "" : separator) + item;
  return text;
}

}  // namespace

ReadLimit DataReadLimit(const Config& config) {
  ReadLimit limit;
  limit.max_bytes = static_cast<uint64_t>(config.GetInt("task.max_file_mib")) << 20;
  limit.raised_by = "task.max_file_mib";
  return limit;
}

std::string ResolvePath(const std::string& path, const std::string& config_path) {
  if (path.empty() || std::filesystem::path(path).is_absolute() || config_path.empty()) {
    return path;
  }
  return (std::filesystem::path(config_path).parent_path() / path).string();
}

Registry<TaskDefinition>& DatasetRegistry() {
  static Registry<TaskDefinition>* registry = [] {
    auto* r = new Registry<TaskDefinition>("task");
#define SP_REGISTER_TASK(Name, name) \
  {                                  \
    TaskDefinition task = Name##Task(); \
    r->Register(name, task, task.doc); \
  }
    SP_TASKS(SP_REGISTER_TASK)
#undef SP_REGISTER_TASK
    return r;
  }();
  return *registry;
}

std::vector<std::string> TaskNames() {
  std::vector<std::string> names = BuiltInTaskNames();
  for (const std::string& name : DatasetRegistry().Names()) {
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  return names;
}

void AddTaskKeys(ConfigSchema& schema) {
  const std::vector<std::string> names = TaskNames();
  std::vector<std::string> described;
  for (const std::string& name : names) {
    described.push_back(name + ": " + DatasetRegistry().Get(name).doc);
  }
  schema.Enum("task.kind", names.front(), names,
              "The task (training/data/task_list.h). " + Join(described, ". "));
  // Each key once, in the order of first declaration; its docs grouped by
  // the tasks that give the same text.
  struct Merged {
    ConfigKey key;
    std::vector<std::pair<std::string, std::vector<std::string>>> docs;  // doc, tasks
    std::string first_task;
  };
  std::vector<Merged> merged;
  for (const std::string& name : names) {
    for (const ConfigKey& key : KeysOf(DatasetRegistry().Get(name))) {
      auto it = std::find_if(merged.begin(), merged.end(),
                             [&](const Merged& m) { return m.key.path == key.path; });
      if (it == merged.end()) {
        merged.push_back({key, {}, name});
        it = merged.end() - 1;
      } else if (!SameKey(it->key, key)) {
        throw std::logic_error("task key '" + key.path + "': task '" + name +
                               "' declares it with another type, default or range than task '" +
                               it->first_task + "' (one key has one meaning)");
      }
      auto doc = std::find_if(it->docs.begin(), it->docs.end(),
                              [&](const auto& d) { return d.first == key.doc; });
      if (doc == it->docs.end()) {
        it->docs.push_back({key.doc, {name}});
      } else {
        doc->second.push_back(name);
      }
    }
  }
  for (Merged& m : merged) {
    std::vector<std::string> parts;
    for (const auto& [doc, tasks] : m.docs) {
      parts.push_back(m.docs.size() == 1 ? doc + " (" + Join(tasks, ", ") + ")"
                                         : Join(tasks, ", ") + ": " + doc);
    }
    m.key.doc = Join(parts, "; ");
    schema.Add(m.key);
  }
}

DatasetSplit MakeTaskSplit(const DatasetRequest& request) {
  const Config& config = *request.config;
  const std::string kind = config.GetString("task.kind");
  const TaskDefinition& task = DatasetRegistry().Get(kind);
  // A key of another task, set here, would be silently ignored.
  // (A resolved config.yaml sets every key, so "set" is "not the default".)
  std::vector<std::string> own;
  for (const ConfigKey& key : KeysOf(task)) own.push_back(key.path);
  for (const std::string& name : TaskNames()) {
    for (const ConfigKey& key : KeysOf(DatasetRegistry().Get(name))) {
      const std::string& path = key.path;
      if (std::find(own.begin(), own.end(), path) != own.end()) continue;
      if (config.ValueText(path) == key.default_value) continue;
      throw ConfigError(config.Origin(path) + ": " + path + " is not read by task.kind " + kind +
                      " (its keys: " + (own.empty() ? "none" : Join(own, ", ")) + ")");
    }
  }
  try {
    return task.make(request);
  } catch (const ConfigError& error) {
    throw ConfigError(config.source() + ": task.kind " + kind + ": " + error.what());
  }
}

TaskFootprint TaskFootprintOf(const Config& config) {
  return DatasetRegistry().Get(config.GetString("task.kind")).footprint(config);
}

void RefuseOverrides(const DatasetRequest& request) {
  if (request.length_override > 0 || request.size_override > 0) {
    throw ConfigError("its examples have one length and size; --length and --size do not apply");
  }
}

std::unique_ptr<InMemoryDataset> GenerateTaskExamples(const Config& config, int64_t examples,
                                                      uint64_t seed) {
  const std::string kind = config.GetString("task.kind");
  const TaskDefinition& task = DatasetRegistry().Get(kind);
  if (!task.generate) {
    throw ConfigError(config.source() + ": task.kind " + kind +
                      " is read from files, not generated");
  }
  try {
    return task.generate(config, examples, seed);
  } catch (const ConfigError& error) {
    throw ConfigError(config.source() + ": task.kind " + kind + ": " + error.what());
  }
}

}  // namespace stillpoint
