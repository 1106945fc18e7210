// The IDX reader (training/data/idx_file.h) and Fashion-MNIST's patch tokens
// (training/data/fashion_mnist_reader.h): every header promise checked, errors naming
// the file, and the installed dataset (when dataset-fashion-mnist is there).
#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/error_text.h"
#include "framework/check.h"
#include "tests/scratch_path.h"
#include "training/data/fashion_mnist_reader.h"
#include "training/data/idx_file.h"

namespace stillpoint::idx_file_test {
namespace {

using testing_support::ErrorOf;

using testing_support::ScratchDirTest;

// An IDX header of unsigned bytes with these dimensions, then `data`.
std::string Idx(const std::vector<uint32_t>& dims, const std::string& data) {
  std::string bytes = {0, 0, 0x08, static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(static_cast<char>(d >> shift));
  }
  return bytes + data;
}

TEST(IdxTest, ParsesDimensionsAndValuesInOrder) {
  const IdxArray a = ParseIdx(Idx({2, 3}, std::string("\x01\x02\x03\x04\x05\xff", 6)), "x", 2);
  EXPECT_EQ(a.dims, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a.values, (std::vector<uint8_t>{1, 2, 3, 4, 5, 255}));
  // 300 is 0x0000012c: big-endian.
  EXPECT_EQ(ParseIdx(Idx({300}, std::string(300, 'a')), "x", 1).dims[0], 300);
}

TEST(IdxTest, EveryBrokenPromiseIsAnErrorNamingTheFile) {
  const std::string good = Idx({2, 2}, "abcd");
  std::string wrong_type = good;
  wrong_type[2] = 0x0D;  // float32
  std::string wrong_magic = good;
  wrong_magic[0] = 0x1f;  // e.g. a gzip stream read as IDX
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "shorter than the 4-byte magic"},
      {wrong_type, "magic number 0x00000d02"},
      {wrong_magic, "magic number 0x1f000802"},
      {Idx({2, 2}, "abcd"), ""},
      {good.substr(0, 9), "truncated: the header of 2 dimensions needs 12 bytes"},
      {good.substr(0, 14), "truncated: the header promises 4 bytes of data, the file has 2"},
      {good + "x", "1 bytes after the data"},
      {Idx({0, 2}, ""), "dimension 0 is 0"},
      {Idx({60000, 2800}, ""), "promises more than"},
  };
  for (const auto& [bytes, wanted] : cases) {
    const std::string message = ErrorOf<Error>([&] { ParseIdx(bytes, "images.idx", 2, 1 << 20); });
    if (wanted.empty()) {
      EXPECT_EQ(message, "");
      continue;
    }
    EXPECT_NE(message.find("images.idx"), std::string::npos) << message;
    EXPECT_NE(message.find(wanted), std::string::npos) << "wanted '" << wanted << "' in "
                                                       << message;
  }
  EXPECT_NE(ErrorOf<Error>([&] { ParseIdx(Idx({4}, "abcd"), "labels", 3); })
                .find("labels: an IDX array of 1 dimensions, expected 3"),
            std::string::npos);
}

TEST(IdxTest, PatchTokensFollowRowMajorPatchOrder) {
  // One 4x4 image with pixel value = its row-major index, patch 2.
  std::string pixels;
  for (int i = 0; i < 16; ++i) pixels.push_back(static_cast<char>(i));
  const IdxArray images = ParseIdx(Idx({1, 4, 4}, pixels), "i", 3);
  const IdxArray labels = ParseIdx(Idx({1}, std::string(1, '\x07')), "l", 1);
  const auto dataset = PatchImages(images, labels, 2, 0, "test");
  ASSERT_EQ(dataset->size(), 1);
  EXPECT_EQ(dataset->info().length, 4);
  EXPECT_EQ(dataset->info().feature_dim, 4);
  const Example& ex = dataset->Get(0);
  EXPECT_EQ(ex.targets, std::vector<int64_t>{7});
  // Patch (0, 1) is pixels 2, 3, 6, 7.
  const std::vector<double> second(ex.features.begin() + 4, ex.features.begin() + 8);
  EXPECT_EQ(second, (std::vector<double>{2 / 255.0, 3 / 255.0, 6 / 255.0, 7 / 255.0}));
  const IdxArray bad_label = ParseIdx(Idx({1}, std::string(1, '\x0a')), "l", 1);
  EXPECT_NE(ErrorOf<Error>([&] { PatchImages(images, bad_label, 2, 0, "set"); })
                .find("set: label 0 is 10, outside [0, 10)"),
            std::string::npos);
  EXPECT_NE(ErrorOf<Error>([&] { PatchImages(images, labels, 3, 0, "set"); })
                .find("task.patch 3 does not divide the 4x4 images"),
            std::string::npos);
  const IdxArray two_labels = ParseIdx(Idx({2}, "\x01\x02"), "l", 1);
  EXPECT_NE(ErrorOf<Error>([&] { PatchImages(images, two_labels, 2, 0, "set"); })
                .find("1 images but 2 labels"),
            std::string::npos);
}

class FashionFilesTest : public ScratchDirTest {
 protected:
  FashionFilesTest() : ScratchDirTest("fashion") {}
  void WriteGzip(const std::string& name, const std::string& bytes) {
    gzFile file = gzopen((dir_ / name).c_str(), "wb");
    ASSERT_NE(file, nullptr);
    ASSERT_EQ(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
    gzclose(file);
  }
  void WriteSet(const std::string& prefix, uint32_t n, const std::string& image_bytes) {
    WriteGzip(prefix + "-images-idx3-ubyte.gz", Idx({n, 4, 4}, image_bytes));
    WriteGzip(prefix + "-labels-idx1-ubyte.gz", Idx({n}, std::string(n, '\x03')));
  }
};

TEST_F(FashionFilesTest, LoadsASubsetAndNamesTheBrokenFile) {
  WriteSet("train", 5, std::string(5 * 16, '\x10'));
  WriteSet("t10k", 2, std::string(2 * 16, '\x20'));
  FashionMnistOptions options;
  options.dir = dir_.string();
  options.patch = 2;
  options.train_examples = 3;
  FashionMnistSplit split = LoadFashionMnist(options);
  EXPECT_EQ(split.train->size(), 3);
  EXPECT_EQ(split.test->size(), 2);
  EXPECT_DOUBLE_EQ(split.test->Get(1).features[0], 32 / 255.0);
  // A truncated image file: the error names it.
  WriteGzip("t10k-images-idx3-ubyte.gz", Idx({2, 4, 4}, std::string(20, '\x20')));
  std::string message = ErrorOf<Error>([&] { LoadFashionMnist(options); });
  EXPECT_NE(message.find("t10k-images-idx3-ubyte.gz: truncated"), std::string::npos) << message;
  // A label file where an image file belongs: the wrong number of dimensions.
  WriteGzip("t10k-images-idx3-ubyte.gz", Idx({2}, "ab"));
  message = ErrorOf<Error>([&] { LoadFashionMnist(options); });
  EXPECT_NE(message.find("an IDX array of 1 dimensions, expected 3"), std::string::npos)
      << message;
  // A missing folder names the package that provides the files.
  options.dir = (dir_ / "missing").string();
  message = ErrorOf<Error>([&] { LoadFashionMnist(options); });
  EXPECT_NE(message.find("dataset-fashion-mnist"), std::string::npos) << message;
}

TEST(FashionMnistTest, TheInstalledDatasetHasItsKnownShape) {
  if (!std::filesystem::exists(std::string(kFashionMnistDir) + "/t10k-labels-idx1-ubyte.gz")) {
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  }
  FashionMnistOptions options;
  options.patch = 7;
  options.train_examples = 100;
  FashionMnistSplit split = LoadFashionMnist(options);
  EXPECT_EQ(split.train->size(), 100);
  EXPECT_EQ(split.test->size(), 10000);
  EXPECT_EQ(split.test->info().length, 16);
  EXPECT_EQ(split.test->info().feature_dim, 49);
  // The test set is balanced: 1000 images per class.
  std::vector<int> per_class(10, 0);
  for (int64_t i = 0; i < split.test->size(); ++i) ++per_class[split.test->Get(i).targets[0]];
  EXPECT_EQ(per_class, std::vector<int>(10, 1000));
}

}  // namespace
}  // namespace stillpoint::idx_file_test
