// What a task is: the datasets a config can name in task.kind.
//
// A task declares
//   - its options, a typed struct whose Fields() declares its task.* keys
//     (name, default, range, meaning) once: the schema, docs/config.md,
//     validation and reading come from that declaration;
//   - how it makes its training and held-out sets from those options;
//   - its footprint, what the memory estimate needs to know about an
//     example (tokens per example, embedding rows) and which keys set it.
// DefineTask turns such a declaration into a TaskDefinition, the one
// type-erased record the registry (training/data/dataset_registry.h) holds. The
// built-in tasks are listed once, in training/data/task_list.h.
//
// Tasks may share a key (task.length, task.train_examples, ...): then they
// declare it with the same type, default and range, and the schema's one key
// says which tasks read it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "training/config/config.h"
#include "training/data/dataset.h"
#include "training/config/option_schema.h"

namespace stillpoint {

// What a task is given.
struct DatasetRequest {
  const Config* config = nullptr;
  // The config file, against whose directory relative task paths resolve.
  std::string config_path;
  // > 0: regenerate the held-out set at this sequence length (tasks with a
  // length; others refuse it). `stillpoint eval --length`.
  int64_t length_override = 0;
  uint64_t seed = 0;  // the config's seed
  // > 0: regenerate the held-out set at this problem size (tasks with a
  // size, e.g. a maze's cells per side; others refuse it). `--size`.
  int64_t size_override = 0;
};

// A task's training and held-out sets and what the model needs to know
// about them.
struct DatasetSplit {
  std::unique_ptr<Dataset> train;
  std::unique_ptr<Dataset> test;
  int64_t vocab_size = 0;   // token ids (0: feature inputs)
  int64_t num_classes = 0;  // output classes
  int64_t feature_dim = 0;  // > 0: feature inputs
  bool per_token_targets = true;
  int64_t longest = 0;      // the longest sequence of either set
  // > 0: the examples are grids of this many tokens per row (row-major), for
  // 2-D positions; 0: plain sequences.
  int64_t grid_width = 0;
  // The classes' names by label, for reports (empty: the labels' numbers).
  std::vector<std::string> class_names;
  // Language modelling (task.kind text): every attention is causal, the
  // held-out loss is also reported in bits per symbol, and the held-out text
  // had this many symbols outside the training vocabulary.
  bool language_model = false;
  int64_t test_unknown_symbols = 0;
  // Files the run directory keeps beside config.yaml (name -> content), e.g.
  // a text task's vocabulary.json.
  std::map<std::string, std::string> run_files;
  // Applied to every training batch (empty: none), e.g. fashion_mnist's
  // task.flip and task.shift.
  BatchAugment train_augment;
};

// Throws ConfigError for settings the task cannot use.
using DatasetFactory = std::function<DatasetSplit(const DatasetRequest& request)>;

// What the memory estimate needs to know about a task's examples.
struct TaskFootprint {
  int64_t length = 0;      // tokens per training example
  int64_t vocab_size = 0;  // rows of the token embedding (0: feature inputs)
  // The config keys that set the two, named when a run cannot fit.
  std::vector<std::string> keys;
  // Examples held in memory (training and held-out sets) when the task
  // generates them; 0 for tasks read from files (their files are capped by
  // task.max_file_mib instead).
  int64_t examples = 0;
};

struct TaskDefinition {
  std::string doc;  // one line: what the task is
  // Adds the task's keys (each "task." + field) to a schema of its own.
  std::function<void(ConfigSchema& schema)> declare_keys;
  DatasetFactory make;
  std::function<TaskFootprint(const Config& config)> footprint;
  // Synthetic tasks: `examples` examples drawn from `seed` with the config's
  // task.* keys (the training set is seed 2 s + 1 of the config's seed s,
  // the held-out set 2 s + 2). Empty for tasks read from files.
  std::function<std::unique_ptr<InMemoryDataset>(const Config& config, int64_t examples,
                                                 uint64_t seed)>
      generate;

  // For Registry<TaskDefinition>: a definition is usable once it can make.
  explicit operator bool() const { return static_cast<bool>(make); }
};

// A task from its typed options: Options::Fields() declares its keys,
// `make` builds the split from the options read from the config, and
// `footprint` describes an example.
template <typename Options>
TaskDefinition DefineTask(std::string doc,
                          std::function<DatasetSplit(const Options&, const DatasetRequest&)> make,
                          std::function<TaskFootprint(const Options&)> footprint) {
  TaskDefinition task;
  task.doc = std::move(doc);
  task.declare_keys = [](ConfigSchema& schema) {
    AddOptionKeys(schema, "task.", Options::Fields());
  };
  task.make = [make](const DatasetRequest& request) {
    return make(ReadOptionKeys(*request.config, "task.", Options::Fields()), request);
  };
  task.footprint = [footprint](const Config& config) {
    return footprint(ReadOptionKeys(config, "task.", Options::Fields()));
  };
  return task;
}

// The scale a synthetic task's held-out set is drawn at: the request's
// overrides applied to the options, or a ConfigError naming what the task
// cannot change.
template <typename Options>
using ApplyOverrides = std::function<Options(Options, const DatasetRequest&)>;

// Declares task.train_examples and task.test_examples, the example counts
// DefineSyntheticTask reads, on a task's fields: one declaration, so the
// tasks that share the keys agree on their type, range and wording.
template <typename Options>
OptionFields<Options>& ExampleCountFields(OptionFields<Options>& fields) {
  return fields
      .Int("train_examples", &Options::train_examples, 1, 1 << 24, "Training sequences generated")
      .Int("test_examples", &Options::test_examples, 1, 1 << 24,
           "Held-out sequences generated with another seed");
}

// A synthetic task: Options has int64_t train_examples and test_examples;
// `draw` makes `examples` examples from `seed`; `test_options` applies the
// request's overrides (--length, --size) to the held-out set's options.
// The split is the training set (seed 2 s + 1) and the held-out set (2 s + 2)
// of the config's seed s, so every synthetic task is seeded the same way.
template <typename Options>
TaskDefinition DefineSyntheticTask(
    std::string doc,
    std::function<std::unique_ptr<InMemoryDataset>(const Options&, int64_t examples,
                                                   uint64_t seed)>
        draw,
    ApplyOverrides<Options> test_options, std::function<TaskFootprint(const Options&)> footprint) {
  auto make = [draw, test_options](const Options& options, const DatasetRequest& request) {
    DatasetSplit split;
    split.train = draw(options, options.train_examples, request.seed * 2 + 1);
    split.test = draw(test_options(options, request), options.test_examples, request.seed * 2 + 2);
    const DatasetInfo& info = split.train->info();
    split.vocab_size = info.vocab_size;
    split.num_classes = info.num_classes;
    split.feature_dim = info.feature_dim;
    split.per_token_targets = info.per_token_targets;
    split.longest = std::max(info.length, split.test->info().length);
    split.grid_width = std::max(info.grid_width, split.test->info().grid_width);
    return split;
  };
  // A generated dataset is held whole: its size counts in the memory
  // estimate, and its example counts are keys that set it.
  auto counted = [footprint](const Options& o) {
    TaskFootprint f = footprint(o);
    f.examples = o.train_examples + o.test_examples;
    f.keys.push_back("task.train_examples");
    f.keys.push_back("task.test_examples");
    return f;
  };
  TaskDefinition task = DefineTask<Options>(std::move(doc), make, counted);
  task.generate = [draw](const Config& config, int64_t examples, uint64_t seed) {
    return draw(ReadOptionKeys(config, "task.", Options::Fields()), examples, seed);
  };
  return task;
}

// Refuses both overrides (a ConfigError): for tasks whose held-out set has
// one scale.
void RefuseOverrides(const DatasetRequest& request);

// The held-out set of a synthetic task as a config would draw it (the
// config's task.kind and task.* keys, `examples` examples from `seed`).
// Throws ConfigError for a task that is not synthetic.
std::unique_ptr<InMemoryDataset> GenerateTaskExamples(const Config& config, int64_t examples,
                                                      uint64_t seed);

}  // namespace stillpoint
