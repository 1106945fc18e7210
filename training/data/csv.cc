// csv: a user's training and held-out CSV files of token ids or features
// (training/data/dataset.h LoadCsvDataset).
#include "training/data/task_list.h"
#include "training/data/dataset_registry.h"

namespace stillpoint {
namespace {

struct CsvOptions {
  std::string path;
  std::string test_path;
  int64_t length = 16;
  int64_t feature_dim = 0;  // 0: token ids
  int64_t vocab_size = 16;
  int64_t num_classes = 0;  // required

  static const OptionFields<CsvOptions>& Fields() {
    using O = CsvOptions;
    static const auto* fields =
        &(new OptionFields<O>)
             ->String("path", &O::path, "The training CSV; relative to the config file")
             .String("test_path", &O::test_path, "The held-out CSV; relative to the config file")
             .Int("length", &O::length, 2, 4096, "Tokens per training sequence")
             .Int("feature_dim", &O::feature_dim, 0, 1 << 20,
                  "Numbers per token (0: the inputs are token ids)")
             .Int("vocab_size", &O::vocab_size, 2, 1 << 20, "Symbols of the sequences")
             .Int("num_classes", &O::num_classes, 0, 1 << 20, "Number of target classes");
    return *fields;
  }
};

DatasetSplit MakeCsv(const CsvOptions& o, const DatasetRequest& request) {
  RefuseOverrides(request);
  CsvDatasetOptions options;
  options.path = ResolvePath(o.path, request.config_path);
  options.length = o.length;
  options.feature_dim = o.feature_dim;
  options.vocab_size = o.vocab_size;
  options.num_classes = o.num_classes;
  options.limit = DataReadLimit(*request.config);
  if (options.path.empty() || o.test_path.empty()) {
    throw ConfigError("needs task.path and task.test_path");
  }
  if (options.num_classes < 1) {
    throw ConfigError("needs task.num_classes >= 1");
  }
  DatasetSplit split;
  split.train = LoadCsvDataset(options);
  options.path = ResolvePath(o.test_path, request.config_path);
  split.test = LoadCsvDataset(options);
  split.vocab_size = options.vocab_size;
  split.num_classes = options.num_classes;
  split.feature_dim = options.feature_dim;
  split.per_token_targets = split.train->info().per_token_targets;
  split.longest = options.length;
  return split;
}

}  // namespace

TaskDefinition CsvTask() {
  return DefineTask<CsvOptions>(
      "CSV files of token ids or features, with a target per token or one per line", MakeCsv,
      [](const CsvOptions& o) {
        return TaskFootprint{
            .length = o.length,
            .vocab_size = o.feature_dim > 0 ? 0 : o.vocab_size,
            .keys = {"task.length", "task.vocab_size", "task.feature_dim"}};
      });
}

}  // namespace stillpoint
