#include "training/dataset_registry.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "training/fashion_mnist.h"
#include "training/text_corpus.h"

#ifndef STILLPOINT_DATA_DIR
#define STILLPOINT_DATA_DIR "examples/data"
#endif

namespace stillpoint {
namespace {

// Training sequences a sequence task generates when task.train_examples is 0.
constexpr int64_t kDefaultSequenceExamples = 4096;

// One of the synthetic sequence tasks.
DatasetSplit SequenceTaskSplit(SequenceTask task, const DatasetRequest& request) {
  const Config& config = *request.config;
  SequenceTaskOptions options;
  options.task = task;
  options.length = config.GetInt("task.length");
  options.vocab_size = config.GetInt("task.vocab_size");
  options.num_examples = config.GetInt("task.train_examples");
  if (options.num_examples == 0) options.num_examples = kDefaultSequenceExamples;
  options.seed = request.seed * 2 + 1;
  std::string error;
  if (!options.IsValid(&error)) throw ConfigError(config.source() + ": task: " + error);
  DatasetSplit split;
  split.train = MakeSequenceTask(options);
  options.num_examples = config.GetInt("task.test_examples");
  options.seed = request.seed * 2 + 2;
  if (request.length_override > 0) options.length = request.length_override;
  if (!options.IsValid(&error)) throw ConfigError(config.source() + ": task: " + error);
  split.test = MakeSequenceTask(options);
  split.vocab_size = split.num_classes = split.train->info().num_classes;
  split.longest = std::max(split.train->info().length, split.test->info().length);
  return split;
}

// The 8x8 digits images as 16 tokens of 4 features.
DatasetSplit DigitsSplitOf(const DatasetRequest& request) {
  const Config& config = *request.config;
  SP_CHECK(request.length_override <= 0, "digits images have a fixed length of 16 tokens");
  std::string path = ResolvePath(config.GetString("task.path"), request.config_path);
  if (path.empty()) {
    const char* dir = std::getenv("STILLPOINT_DATA_DIR");
    path = std::string(dir && *dir ? dir : STILLPOINT_DATA_DIR) + "/digits.csv.gz";
  }
  DigitsSplit digits = LoadDigits(path, config.GetDouble("task.test_fraction"), request.seed);
  DatasetSplit split;
  split.train = std::move(digits.train);
  split.test = std::move(digits.test);
  split.num_classes = 10;
  split.feature_dim = 4;
  split.per_token_targets = false;
  split.longest = 16;
  return split;
}

// Fashion-MNIST's 28x28 images as patch tokens.
DatasetSplit FashionMnistSplitOf(const DatasetRequest& request) {
  const Config& config = *request.config;
  SP_CHECK(request.length_override <= 0, "fashion_mnist images have a fixed number of tokens");
  FashionMnistOptions options;
  const std::string path = ResolvePath(config.GetString("task.path"), request.config_path);
  if (!path.empty()) options.dir = path;
  options.patch = config.GetInt("task.patch");
  options.train_examples = config.GetInt("task.train_examples");
  if (28 % options.patch != 0) {
    throw ConfigError(config.Origin("task.patch") + ": task.patch " +
                      std::to_string(options.patch) +
                      " does not divide the 28x28 Fashion-MNIST images (use 1, 2, 4, 7, 14 or 28)");
  }
  FashionMnistSplit images = LoadFashionMnist(options);
  DatasetSplit split;
  split.longest = images.train->info().length;
  split.feature_dim = images.train->info().feature_dim;
  split.train = std::move(images.train);
  split.test = std::move(images.test);
  split.num_classes = 10;
  split.per_token_targets = false;
  split.class_names.assign(FashionMnistClasses().begin(), FashionMnistClasses().end());
  return split;
}

// Character-level language modelling over a text file.
DatasetSplit TextSplitOf(const DatasetRequest& request) {
  const Config& config = *request.config;
  SP_CHECK(request.length_override <= 0,
           "text windows have the length task.context; set it instead of a held-out length");
  TextSplitOptions options;
  options.path = ResolvePath(config.GetString("task.path"), request.config_path);
  const std::string encoding = config.GetString("task.encoding");
  SP_CHECK(StringToTextEncoding(encoding, &options.encoding), "task.encoding: unknown '",
           encoding, "'");
  options.context = config.GetInt("task.context");
  options.validation_fraction = config.GetDouble("task.validation_fraction");
  TextSplit text = LoadTextSplit(options);
  DatasetSplit split;
  split.vocab_size = split.num_classes = text.vocabulary.size();
  split.longest = options.context;
  split.language_model = true;
  split.test_unknown_symbols = text.test_unknown;
  split.run_files[kVocabularyFile] = text.vocabulary.ToJson();
  split.train = std::move(text.train);
  split.test = std::move(text.test);
  return split;
}

// A training and a held-out CSV file.
DatasetSplit CsvSplit(const DatasetRequest& request) {
  const Config& config = *request.config;
  CsvDatasetOptions options;
  options.path = ResolvePath(config.GetString("task.path"), request.config_path);
  options.length = config.GetInt("task.length");
  options.feature_dim = config.GetInt("task.feature_dim");
  options.vocab_size = config.GetInt("task.vocab_size");
  options.num_classes = config.GetInt("task.num_classes");
  if (options.path.empty() || config.GetString("task.test_path").empty()) {
    throw ConfigError(config.source() + ": task.kind csv needs task.path and task.test_path");
  }
  if (options.num_classes < 1) {
    throw ConfigError(config.source() + ": task.kind csv needs task.num_classes >= 1");
  }
  DatasetSplit split;
  split.train = LoadCsvDataset(options);
  options.path = ResolvePath(config.GetString("task.test_path"), request.config_path);
  split.test = LoadCsvDataset(options);
  split.vocab_size = options.vocab_size;
  split.num_classes = options.num_classes;
  split.feature_dim = options.feature_dim;
  split.per_token_targets = split.train->info().per_token_targets;
  split.longest = options.length;
  return split;
}

}  // namespace

std::string ResolvePath(const std::string& path, const std::string& config_path) {
  if (path.empty() || std::filesystem::path(path).is_absolute() || config_path.empty()) {
    return path;
  }
  return (std::filesystem::path(config_path).parent_path() / path).string();
}

Registry<DatasetFactory>& DatasetRegistry() {
  static Registry<DatasetFactory>* registry = [] {
    auto* r = new Registry<DatasetFactory>("dataset");
    for (SequenceTask task : {SequenceTask::kReverse, SequenceTask::kSort, SequenceTask::kCopy,
                              SequenceTask::kPrefixParity, SequenceTask::kAssociativeRecall}) {
      r->Register(
          ToString(task),
          [task](const DatasetRequest& request) { return SequenceTaskSplit(task, request); },
          "synthetic sequence task (task.length, task.vocab_size, task.train_examples, "
          "task.test_examples)");
    }
    r->Register("digits", DigitsSplitOf,
                "the 8x8 digits images, 16 tokens of 4 features (task.path, task.test_fraction)");
    r->Register("fashion_mnist", FashionMnistSplitOf,
                "Fashion-MNIST's 28x28 images as patch tokens (task.path: the folder of the four "
                "IDX files, task.patch, task.train_examples)");
    r->Register("text", TextSplitOf,
                "character-level language modelling over a text file (task.path, default the "
                "Jargon File; task.encoding, task.context, task.validation_fraction)");
    r->Register("csv", CsvSplit,
                "CSV files of token ids or features (task.path, task.test_path, "
                "task.feature_dim, task.num_classes)");
    return r;
  }();
  return *registry;
}

}  // namespace stillpoint
