// digits: the 8x8 digits images (training/data/dataset.h LoadDigits) as 16 tokens
// of 2x2 patches with 4 features each, one class per image.
#include <cstdlib>

#include "training/data/task_list.h"
#include "training/data/dataset_registry.h"

#ifndef STILLPOINT_DATA_DIR
#define STILLPOINT_DATA_DIR "examples/data"
#endif

namespace stillpoint {
namespace {

struct DigitsOptions {
  std::string path;  // "": the shipped examples/data/digits.csv.gz
  double test_fraction = 0.2;

  static const OptionFields<DigitsOptions>& Fields() {
    using O = DigitsOptions;
    static const auto* fields =
        &(new OptionFields<O>)
             ->String("path", &O::path,
                      "The digits CSV, 64 pixels and a label per line (default: the shipped "
                      "examples/data/digits.csv.gz; STILLPOINT_DATA_DIR overrides its "
                      "directory); relative to the config file")
             .Double("test_fraction", &O::test_fraction, 0.01, 0.99,
                     "Fraction of the examples held out for testing");
    return *fields;
  }
};

DatasetSplit MakeDigits(const DigitsOptions& o, const DatasetRequest& request) {
  RefuseOverrides(request);
  std::string path = ResolvePath(o.path, request.config_path);
  if (path.empty()) {
    const char* dir = std::getenv("STILLPOINT_DATA_DIR");
    path = std::string(dir && *dir ? dir : STILLPOINT_DATA_DIR) + "/digits.csv.gz";
  }
  DigitsSplit digits = LoadDigits(path, o.test_fraction, request.seed, DataReadLimit(*request.config));
  DatasetSplit split;
  split.train = std::move(digits.train);
  split.test = std::move(digits.test);
  split.num_classes = 10;
  split.feature_dim = 4;
  split.per_token_targets = false;
  split.longest = 16;
  return split;
}

}  // namespace

TaskDefinition DigitsTask() {
  return DefineTask<DigitsOptions>(
      "the 8x8 digits images, 16 tokens of 4 features, one class per image", MakeDigits,
      [](const DigitsOptions&) { return TaskFootprint{.length = 16}; });
}

}  // namespace stillpoint
