#include "training/data/fashion_mnist_reader.h"

#include <filesystem>

#include "framework/check.h"

namespace stillpoint {
namespace {

constexpr int64_t kClasses = 10;

// dir/file, or dir/file without its .gz when only the uncompressed file is
// there.
IdxArray ReadPart(const std::string& dir, const std::string& file, int dims,
                  const ReadLimit& limit) {
  std::string path = (std::filesystem::path(dir) / file).string();
  const std::string plain = path.substr(0, path.size() - 3);
  if (!std::filesystem::exists(path) && std::filesystem::exists(plain)) path = plain;
  SP_CHECK(std::filesystem::exists(path), "Fashion-MNIST: '", path,
           "' does not exist; Debian's package ", kFashionMnistPackage,
           " installs it (sudo apt-get install ", kFashionMnistPackage,
           ", or bash scripts/setup.sh), or set task.path to a folder holding the four IDX files");
  return ReadIdxFile(path, dims, limit);
}

}  // namespace

const std::array<const char*, 10>& FashionMnistClasses() {
  static const std::array<const char*, 10> names = {
      "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
      "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  return names;
}

std::unique_ptr<InMemoryDataset> PatchImages(const IdxArray& images, const IdxArray& labels,
                                             int64_t patch, int64_t limit,
                                             const std::string& name) {
  SP_CHECK(images.dims.size() == 3 && labels.dims.size() == 1, name,
           ": expected images [n, rows, cols] and labels [n]");
  const int64_t n = images.dims[0], rows = images.dims[1], cols = images.dims[2];
  SP_CHECK(labels.dims[0] == n, name, ": ", n, " images but ", labels.dims[0], " labels");
  SP_CHECK(patch >= 1 && rows % patch == 0 && cols % patch == 0, name, ": task.patch ", patch,
           " does not divide the ", rows, "x", cols, " images");
  const int64_t count = limit > 0 ? std::min(limit, n) : n;
  const int64_t patch_rows = rows / patch, patch_cols = cols / patch;
  DatasetInfo info;
  info.length = patch_rows * patch_cols;
  info.feature_dim = patch * patch;
  info.num_classes = kClasses;
  info.per_token_targets = false;
  std::vector<Example> examples(count);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t label = labels.values[i];
    SP_CHECK(label < kClasses, name, ": label ", i, " is ", label, ", outside [0, ", kClasses,
             ")");
    Example& ex = examples[i];
    ex.targets = {label};
    ex.features.reserve(rows * cols);
    const uint8_t* image = images.values.data() + i * rows * cols;
    for (int64_t pr = 0; pr < patch_rows; ++pr) {
      for (int64_t pc = 0; pc < patch_cols; ++pc) {
        for (int64_t dr = 0; dr < patch; ++dr) {
          for (int64_t dc = 0; dc < patch; ++dc) {
            ex.features.push_back(image[(pr * patch + dr) * cols + pc * patch + dc] / 255.0);
          }
        }
      }
    }
  }
  return std::make_unique<InMemoryDataset>(info, std::move(examples));
}

FashionMnistSplit LoadFashionMnist(const FashionMnistOptions& options) {
  SP_CHECK(options.train_examples >= 0, "Fashion-MNIST: train_examples must be >= 0, got ",
           options.train_examples);
  FashionMnistSplit split;
  for (const char* part : {"train", "t10k"}) {
    const std::string prefix = part;
    const IdxArray images = ReadPart(options.dir, prefix + "-images-idx3-ubyte.gz", 3, options.limit);
    const IdxArray labels = ReadPart(options.dir, prefix + "-labels-idx1-ubyte.gz", 1, options.limit);
    const std::string name = (std::filesystem::path(options.dir) / (prefix + "-*")).string();
    auto dataset = PatchImages(images, labels, options.patch,
                               prefix == "train" ? options.train_examples : 0, name);
    (prefix == "train" ? split.train : split.test) = std::move(dataset);
  }
  return split;
}

}  // namespace stillpoint
