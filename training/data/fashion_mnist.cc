// fashion_mnist: Fashion-MNIST's 28x28 images (training/data/fashion_mnist_reader.h) as
// patch tokens, one class per image.
#include "training/data/fashion_mnist_reader.h"

#include <cmath>

#include "training/data/dataset_registry.h"
#include "training/data/image_augment.h"
#include "training/data/task_list.h"

namespace stillpoint {
namespace {

struct FashionMnistTaskOptions {
  std::string path;  // "": kFashionMnistDir
  int64_t patch = 4;
  // Shared with the sequence tasks (same default and range): here, at most
  // this many training images, the first ones.
  int64_t train_examples = 4096;
  bool flip = false;
  int64_t shift = 0;

  static const OptionFields<FashionMnistTaskOptions>& Fields() {
    using O = FashionMnistTaskOptions;
    static const auto* fields =
        &(new OptionFields<O>)
             ->String("path", &O::path,
                      "The folder of the four IDX files, plain or .gz (default: "
                      "/usr/share/datasets/fashion-mnist, Debian's dataset-fashion-mnist); "
                      "relative to the config file")
             .Int("patch", &O::patch, 1, 28,
                  "Pixels per side of a patch token; divides 28 (4: 49 tokens of 16 pixels, 7: "
                  "16 tokens of 49)")
             .Int("train_examples", &O::train_examples, 1, 1 << 24,
                  "The first N training images (60000 or more: all)")
             .Bool("flip", &O::flip,
                   "Training images only: mirror each left-right with probability 1/2, drawn "
                   "anew every time it is drawn (the held-out images are never changed)")
             .Int("shift", &O::shift, 0, 27,
                  "Training images only: move each by a random whole number of pixels in "
                  "[-shift, shift], rows and columns apart, drawn anew every time, the uncovered "
                  "pixels 0 (0: off)");
    return *fields;
  }
};

DatasetSplit MakeFashionMnist(const FashionMnistTaskOptions& o, const DatasetRequest& request) {
  RefuseOverrides(request);
  if (28 % o.patch != 0) {
    throw ConfigError("task.patch " + std::to_string(o.patch) +
                      " does not divide the 28x28 images (use 1, 2, 4, 7, 14 or 28)");
  }
  FashionMnistOptions options;
  const std::string path = ResolvePath(o.path, request.config_path);
  if (!path.empty()) options.dir = path;
  options.patch = o.patch;
  options.train_examples = o.train_examples;
  options.limit = DataReadLimit(*request.config);
  FashionMnistSplit images = LoadFashionMnist(options);
  DatasetSplit split;
  split.longest = images.train->info().length;
  split.feature_dim = images.train->info().feature_dim;
  split.train = std::move(images.train);
  split.test = std::move(images.test);
  split.num_classes = 10;
  split.per_token_targets = false;
  split.class_names.assign(FashionMnistClasses().begin(), FashionMnistClasses().end());
  if (o.flip || o.shift > 0) {
    // The images' side, from the tokens per image (square images).
    const int64_t patches_per_side = std::llround(std::sqrt(static_cast<double>(split.longest)));
    if (patches_per_side * patches_per_side != split.longest) {
      throw ConfigError("task.flip and task.shift need square images; the images in " +
                        options.dir + " have " + std::to_string(split.longest) +
                        " patches each");
    }
    const ImageAugmentOptions augment{patches_per_side * o.patch, o.patch, o.flip, o.shift};
    split.train_augment = [augment](Rng& rng, Batch* batch) {
      AugmentPatchedImages(augment, rng, batch);
    };
  }
  return split;
}

}  // namespace

TaskDefinition FashionMnistTask() {
  return DefineTask<FashionMnistTaskOptions>(
      "Fashion-MNIST's 28x28 clothing images as patch tokens, one of 10 classes per image",
      MakeFashionMnist, [](const FashionMnistTaskOptions& o) {
        const int64_t side = 28 / o.patch;
        return TaskFootprint{side * side, 0, {"task.patch"}};
      });
}

}  // namespace stillpoint
