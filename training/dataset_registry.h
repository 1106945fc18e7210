// The datasets a config can name in task.kind, by name: the synthetic
// sequence tasks (reverse, sort, copy, prefix_parity, associative_recall),
// the 8x8 digits images and CSV files are built in. A new dataset is a
// factory registered under its name (in DatasetRegistry() or by the
// program before it loads a config); task.kind then accepts it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "layers/name_registry.h"
#include "training/config.h"
#include "training/dataset.h"

namespace stillpoint {

// What a dataset factory is given.
struct DatasetRequest {
  const Config* config = nullptr;
  // The config file, against whose directory relative task paths resolve.
  std::string config_path;
  // > 0: regenerate the held-out set at this sequence length (sequence
  // tasks only; others refuse it).
  int64_t length_override = 0;
  uint64_t seed = 0;  // the config's seed
};

// A dataset's training and held-out sets and what the model needs to
// know about them.
struct DatasetSplit {
  std::unique_ptr<Dataset> train;
  std::unique_ptr<Dataset> test;
  int64_t vocab_size = 0;   // token ids (0: feature inputs)
  int64_t num_classes = 0;  // output classes
  int64_t feature_dim = 0;  // > 0: feature inputs
  bool per_token_targets = true;
  int64_t longest = 0;      // the longest sequence of either set
  // The classes' names by label, for reports (empty: the labels' numbers).
  std::vector<std::string> class_names;
  // Language modelling (task.kind text): the held-out loss is also reported
  // in bits per symbol, and the held-out text had this many symbols outside
  // the training vocabulary.
  bool language_model = false;
  int64_t test_unknown_symbols = 0;
  // Files the run directory keeps beside config.yaml (name -> content), e.g.
  // a text task's vocabulary.json.
  std::map<std::string, std::string> run_files;
};

// Throws ConfigError for settings the dataset cannot use.
using DatasetFactory = std::function<DatasetSplit(const DatasetRequest& request)>;
Registry<DatasetFactory>& DatasetRegistry();

// A relative path resolved against the config file's directory ("" stays
// "").
std::string ResolvePath(const std::string& path, const std::string& config_path);

}  // namespace stillpoint
