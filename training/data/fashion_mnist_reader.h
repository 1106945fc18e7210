// Fashion-MNIST (Zalando; MIT licence): 28x28 grey images of clothing in 10
// classes, 60,000 for training and 10,000 for testing, as the four IDX files
// Debian's dataset-fashion-mnist installs in kFashionMnistDir:
// {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz.
//
// Each image becomes a sequence of patch tokens: the (28/patch)^2 patches of
// patch x patch pixels in row-major patch order, each token the patch's
// pixels (row-major, value / 255). One label per image.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "training/data/dataset.h"
#include "training/data/idx_file.h"

namespace stillpoint {

inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
inline constexpr const char* kFashionMnistPackage = "dataset-fashion-mnist";

// The class names, by label.
const std::array<const char*, 10>& FashionMnistClasses();

struct FashionMnistOptions {
  std::string dir = kFashionMnistDir;  // the folder of the four files
  int64_t patch = 4;                   // pixels per patch side; divides the image side
  int64_t train_examples = 0;          // the first N training images; 0: all
  ReadLimit limit;                     // of each file's decompressed bytes
};

struct FashionMnistSplit {
  std::unique_ptr<InMemoryDataset> train;
  std::unique_ptr<InMemoryDataset> test;
};

// Reads the four files. Errors name the file: a missing one says which
// Debian package provides it; a wrong magic number, a truncated file, image
// and label counts that differ, an image side the patch does not divide, a
// label outside [0, 10).
FashionMnistSplit LoadFashionMnist(const FashionMnistOptions& options);

// The patch tokens of images [n, rows, cols] (bytes, row-major) with one label
// each: an in-memory dataset of n examples (at most `limit` when > 0).
std::unique_ptr<InMemoryDataset> PatchImages(const IdxArray& images, const IdxArray& labels,
                                             int64_t patch, int64_t limit,
                                             const std::string& name);

}  // namespace stillpoint
