// The tasks a config can name in task.kind, by name: the built-in tasks of
// training/data/task_list.h (each its own file under training/data/), and
// any a program registers in DatasetRegistry() before it loads a config;
// task.kind then accepts it and its keys join the schema.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "layers/name_registry.h"
#include "training/config/config.h"
#include "training/data/task.h"
#include "training/data/dataset.h"

namespace stillpoint {

Registry<TaskDefinition>& DatasetRegistry();

// The registered task names: the built-in list's order (its first is
// task.kind's default), then the others sorted.
std::vector<std::string> TaskNames();

// task.kind and every task's keys, "task." + field: a key several tasks
// declare appears once (they must agree on its type, default and range) and
// its doc says which tasks read it.
void AddTaskKeys(ConfigSchema& schema);

// The config's task (task.kind) made for `request`. A task key set in the
// config that this task does not read is a ConfigError naming it and the
// task's keys; so is a setting the task refuses (prefixed with the config
// file and task.kind).
DatasetSplit MakeTaskSplit(const DatasetRequest& request);

// The config's task's view of an example, for the memory estimate.
TaskFootprint TaskFootprintOf(const Config& config);

// The cap on a data file's (decompressed) bytes: task.max_file_mib MiB,
// named as the key that raises it.
ReadLimit DataReadLimit(const Config& config);

// A relative path resolved against the config file's directory ("" stays
// "").
std::string ResolvePath(const std::string& path, const std::string& config_path);

}  // namespace stillpoint
