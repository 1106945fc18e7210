#include "training/data/dataset.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <vector>

#include "tests/scratch_path.h"
#include "training/config_schema.h"
#include "training/data/dataset_registry.h"

namespace stillpoint::dataset_test {
namespace {

// 50 examples of a synthetic task as a config with these keys draws them.
std::unique_ptr<InMemoryDataset> Task(const std::string& kind, int64_t length, int64_t vocab) {
  const Config config = Config::FromYaml(
      StillpointSchema(), "", "test.yaml",
      {"task.kind=" + kind, "task.length=" + std::to_string(length),
       "task.vocab_size=" + std::to_string(vocab)});
  return GenerateTaskExamples(config, 50, 3);
}

TEST(SequenceTaskTest, ReverseTargetsAreTheReversedInput) {
  auto data = Task("reverse", 8, 16);
  for (int64_t i = 0; i < data->size(); ++i) {
    const Example& ex = data->Get(i);
    for (int t = 0; t < 8; ++t) ASSERT_EQ(ex.targets[t], ex.tokens[7 - t]);
    for (int64_t tok : ex.tokens) ASSERT_TRUE(tok >= 0 && tok < 16);
  }
}

TEST(SequenceTaskTest, SortTargetsAreSortedInputs) {
  auto data = Task("sort", 10, 5);
  for (int64_t i = 0; i < data->size(); ++i) {
    std::vector<int64_t> sorted = data->Get(i).tokens;
    std::sort(sorted.begin(), sorted.end());
    ASSERT_EQ(data->Get(i).targets, sorted);
  }
}

TEST(SequenceTaskTest, CopyTargetsRepeatTheFirstHalfAndIgnoreIt) {
  auto data = Task("copy", 8, 6);
  const Example& ex = data->Get(0);
  for (int t = 0; t < 4; ++t) {
    EXPECT_EQ(ex.targets[t], kIgnoreTarget);
    EXPECT_EQ(ex.targets[t + 4], ex.tokens[t]);
    EXPECT_EQ(ex.tokens[t + 4], 5);  // the blank symbol
    EXPECT_LT(ex.tokens[t], 5);
  }
}

TEST(SequenceTaskTest, AssociativeRecallAsksForTheQueriedValue) {
  auto data = Task("associative_recall", 10, 20);
  for (int64_t i = 0; i < data->size(); ++i) {
    const Example& ex = data->Get(i);
    const int64_t query = ex.tokens[8];
    int64_t expected = -2;
    for (int p = 0; p < 4; ++p) {
      if (ex.tokens[2 * p] == query) expected = ex.tokens[2 * p + 1];
    }
    ASSERT_EQ(ex.targets[9], expected);
    for (int t = 0; t < 9; ++t) ASSERT_EQ(ex.targets[t], kIgnoreTarget);
  }
}

TEST(SequenceTaskTest, SameSeedSameDataAndLengthKnob) {
  auto a = Task("reverse", 8, 16), b = Task("reverse", 8, 16);
  EXPECT_EQ(a->Get(7).tokens, b->Get(7).tokens);
  auto longer = Task("reverse", 24, 16);
  EXPECT_EQ(longer->info().length, 24);
  EXPECT_EQ(longer->Get(0).tokens.size(), 24u);
}

TEST(SequenceTaskTest, InvalidOptionsNameTheProblem) {
  try {
    Task("associative_recall", 7, 16);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("test.yaml: task.kind associative_recall: needs an even "
                                         "task.length >= 4"),
              std::string::npos)
        << e.what();
  }
}

TEST(BatcherTest, CoversEveryExampleOncePerEpochAndRestoresItsPosition) {
  auto data = Task("reverse", 4, 8);  // 50 examples
  Batcher batcher(*data, 10, 1, DType::kFloat32);
  std::vector<std::vector<int64_t>> seen;
  for (int k = 0; k < 5; ++k) seen.push_back(batcher.Next().tokens);
  // 50 examples in 5 batches: each example's tokens appear exactly once.
  std::multiset<std::vector<int64_t>> rows, expected;
  for (auto& batch : seen) {
    for (int r = 0; r < 10; ++r) rows.insert({batch.begin() + 4 * r, batch.begin() + 4 * r + 4});
  }
  for (int64_t i = 0; i < 50; ++i) expected.insert(data->Get(i).tokens);
  EXPECT_EQ(rows, expected);
  // Restore mid-epoch: the same following batches.
  Batcher a(*data, 7, 9, DType::kFloat32), b(*data, 7, 9, DType::kFloat32);
  for (int k = 0; k < 9; ++k) a.Next();
  b.Restore(a.position());
  for (int k = 0; k < 5; ++k) EXPECT_EQ(a.Next().tokens, b.Next().tokens);
}

TEST(FirstExamplesTest, KeepsTheFirstExamplesOrAllOfThem) {
  std::unique_ptr<InMemoryDataset> whole = Task("reverse", 6, 8);
  std::vector<std::vector<int64_t>> first;
  for (int64_t i = 0; i < 7; ++i) first.push_back(whole->Get(i).tokens);
  std::unique_ptr<Dataset> part = FirstExamples(std::move(whole), 7);
  ASSERT_EQ(part->size(), 7);
  EXPECT_EQ(part->info().length, 6);
  for (int64_t i = 0; i < 7; ++i) EXPECT_EQ(part->Get(i).tokens, first[i]);
  EXPECT_THROW(part->Get(7), Error);
  // 0, or a count at least the size: the whole set.
  EXPECT_EQ(FirstExamples(Task("reverse", 6, 8), 0)->size(), 50);
  EXPECT_EQ(FirstExamples(Task("reverse", 6, 8), 50)->size(), 50);
  EXPECT_EQ(FirstExamples(Task("reverse", 6, 8), 1000)->size(), 50);
}

TEST(SliceBatchTest, TakesTheExamplesTokensTargetsAndFeaturesOfARange) {
  auto data = Task("reverse", 4, 8);
  const Batch batch = MakeBatch(*data, {3, 1, 4, 1, 5}, DType::kFloat64);
  const Batch slice = SliceBatch(batch, 1, 3);
  EXPECT_EQ(slice.batch_size, 2);
  EXPECT_EQ(slice.length, 4);
  EXPECT_EQ(slice.tokens,
            std::vector<int64_t>(batch.tokens.begin() + 4, batch.tokens.begin() + 12));
  EXPECT_EQ(slice.targets,
            std::vector<int64_t>(batch.targets.begin() + 4, batch.targets.begin() + 12));
  EXPECT_THROW(SliceBatch(batch, 2, 2), Error);
  EXPECT_THROW(SliceBatch(batch, 4, 6), Error);
  EXPECT_THROW(SliceBatch(batch, -1, 1), Error);

  // One label per example, and features: a view of the examples' rows.
  Batch images;
  images.batch_size = 3;
  images.length = 2;
  images.features = Tensor::Arange(3 * 2 * 2, DType::kFloat64).Reshape(Shape{3, 2, 2});
  images.targets = {7, 8, 9};
  const Batch last = SliceBatch(images, 2, 3);
  EXPECT_EQ(last.targets, std::vector<int64_t>{9});
  EXPECT_EQ(last.features.shape(), (Shape{1, 2, 2}));
  EXPECT_EQ(last.features.at(0), 8.0);
  EXPECT_TRUE(last.tokens.empty());
}

class FileTest : public ::testing::Test {
 protected:
  // Each call writes into its own directory; a test may write several files.
  std::string Write(const std::string& name, const std::string& text) {
    const std::filesystem::path dir = testing_support::ScratchPathForThisTest("dataset_" + name);
    dirs_.push_back(dir);
    std::filesystem::create_directories(dir);
    const std::string path = (dir / "data.csv").string();
    std::ofstream(path) << text;
    return path;
  }
  void TearDown() override {
    for (const std::filesystem::path& dir : dirs_) std::filesystem::remove_all(dir);
  }
  std::vector<std::filesystem::path> dirs_;
};

std::string ErrorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST_F(FileTest, DigitsAreShippedAndSplitIntoPatchTokens) {
  const std::string path = std::string(STILLPOINT_SOURCE_DIR) + "/examples/data/digits.csv.gz";
  DigitsSplit split = LoadDigits(path, 0.2, 0);
  EXPECT_EQ(split.train->size() + split.test->size(), 1797);
  EXPECT_EQ(split.test->size(), 359);
  EXPECT_EQ(split.train->info().length, 16);
  EXPECT_EQ(split.train->info().feature_dim, 4);
  const Example& ex = split.train->Get(0);
  EXPECT_EQ(ex.features.size(), 64u);
  EXPECT_TRUE(ex.targets[0] >= 0 && ex.targets[0] < 10);
  for (double f : ex.features) ASSERT_TRUE(f >= 0 && f <= 1);
  Batch batch = MakeBatch(*split.test, {0, 1, 2}, DType::kFloat32);
  EXPECT_EQ(batch.features.shape(), (Shape{3, 16, 4}));
  EXPECT_EQ(batch.targets.size(), 3u);
}

TEST_F(FileTest, MalformedDigitsNameFileAndLine) {
  std::string row;
  for (int i = 0; i < 64; ++i) row += "1,";
  // The second row has its 64 pixels and no label.
  const std::string path = Write("digits", row + "3\n" + row.substr(0, row.size() - 1) + "\n");
  const std::string message = ErrorOf([&] { LoadDigits(path, 0.5, 0); });
  EXPECT_NE(message.find(path + ":2"), std::string::npos) << message;
  EXPECT_NE(message.find("65 columns"), std::string::npos) << message;
  EXPECT_NE(ErrorOf([] { LoadDigits("/nonexistent/digits.csv", 0.5, 0); }).find("/nonexistent"),
            std::string::npos);
}

TEST_F(FileTest, CsvTokensWithPerTokenTargets) {
  const std::string path = Write("csv", "0,1,2,2,1,0\n3,3,1,1,3,3\n");
  CsvDatasetOptions options{path, 3, 0, 4, 4};
  auto data = LoadCsvDataset(options);
  EXPECT_EQ(data->size(), 2);
  EXPECT_TRUE(data->info().per_token_targets);
  EXPECT_EQ(data->Get(1).targets, (std::vector<int64_t>{1, 3, 3}));
}

// A header row of column names is read as such; a line mixing names and
// numbers is not a header, and a header must name as many columns as the rows.
TEST_F(FileTest, CsvHeaderRowIsSkipped) {
  const std::string path =
      Write("csv_header", "t0,t1,t2,y0,y1,y2\n0,1,2,2,1,0\n3,3,1,1,3,3\n");
  CsvDatasetOptions options{path, 3, 0, 4, 4};
  auto data = LoadCsvDataset(options);
  ASSERT_EQ(data->size(), 2);
  EXPECT_EQ(data->Get(0).tokens, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_TRUE(IsCsvHeader("x0, x1 ,label"));
  EXPECT_FALSE(IsCsvHeader("x0,1,label"));
  EXPECT_FALSE(IsCsvHeader("1e3,2"));
  EXPECT_FALSE(IsCsvHeader("a,,b"));
  options.path = Write("csv_mixed", "t0,1,2,2,1,0\n0,1,2,2,1,0\n");
  EXPECT_NE(ErrorOf([&] { LoadCsvDataset(options); }).find(":1: column 1"), std::string::npos);
  options.path = Write("csv_narrow_header", "a,b,c,d\n0,1,2,2,1,0\n");
  const std::string message = ErrorOf([&] { LoadCsvDataset(options); });
  EXPECT_NE(message.find(":2: 6 columns, but the header row names 4"), std::string::npos)
      << message;
  // A second header-like line is data, and an error.
  options.path = Write("csv_two_headers", "a,b,c,d,e,f\na,b,c,d,e,f\n0,1,2,2,1,0\n");
  EXPECT_NE(ErrorOf([&] { LoadCsvDataset(options); }).find(":2: column 1"), std::string::npos);
}

TEST_F(FileTest, CsvErrorsNameLineAndColumn) {
  const std::string path = Write("csv_bad", "0,1,2,1\n0,x,2,1\n");
  CsvDatasetOptions options{path, 3, 0, 4, 4};
  std::string message = ErrorOf([&] { LoadCsvDataset(options); });
  EXPECT_NE(message.find(":2: column 2"), std::string::npos) << message;
  const std::string ragged = Write("csv_ragged", "0,1,2,1\n0,1\n");
  options.path = ragged;
  message = ErrorOf([&] { LoadCsvDataset(options); });
  EXPECT_NE(message.find(":2: expected"), std::string::npos) << message;
  const std::string range = Write("csv_range", "0,1,9,1\n");
  options.path = range;
  message = ErrorOf([&] { LoadCsvDataset(options); });
  EXPECT_NE(message.find("column 3 (token id) is 9"), std::string::npos) << message;
}

// Writes text gzip-compressed to path and returns the compressed size.
std::size_t WriteGzip(const std::string& path, const std::string& text) {
  gzFile file = gzopen(path.c_str(), "wb");
  EXPECT_NE(file, nullptr);
  EXPECT_EQ(gzwrite(file, text.data(), static_cast<unsigned>(text.size())),
            static_cast<int>(text.size()));
  gzclose(file);
  return std::filesystem::file_size(path);
}

// A gzip file cut short decodes to a prefix of its rows with no error from
// gzread; it used to load as a smaller dataset.
TEST_F(FileTest, TruncatedGzipIsAnErrorNotFewerRows) {
  std::string text;
  for (int i = 0; i < 4000; ++i) text += std::to_string(i % 4) + ",1,2,2,1,0\n";
  const std::string path = Write("gz", "") + ".gz";
  const std::size_t size = WriteGzip(path, text);
  CsvDatasetOptions options{path, 3, 0, 4, 4};
  EXPECT_EQ(LoadCsvDataset(options)->size(), 4000);
  std::filesystem::resize_file(path, size - 12);
  const std::string message = ErrorOf([&] { LoadCsvDataset(options); });
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;
  EXPECT_NE(ErrorOf([&] { ReadFileMaybeGzip(path); }).find("truncated"), std::string::npos);
}

// 1e30 as a token id: converting it to an integer was undefined behaviour
// (UBSan, through tests/fuzz/csv_fuzz.cc); now it is refused before.
TEST_F(FileTest, CsvIdsBeyondTheIntegerRangeAreErrors) {
  const std::string path = Write("csv_huge", "0,1e30,2,2,1,0\n");
  CsvDatasetOptions options{path, 3, 0, 4, 4};
  const std::string message = ErrorOf([&] { LoadCsvDataset(options); });
  EXPECT_NE(message.find(":1: column 2 (token id) must be an integer, got 1e+30"),
            std::string::npos)
      << message;
}

TEST_F(FileTest, TrailingEmptyCsvCellIsAnError) {
  // Six cells and a trailing comma: the seventh (empty) cell used to vanish.
  const std::string path = Write("csv_trailing", "0,1,2,2,1,0,\n");
  CsvDatasetOptions options{path, 3, 0, 4, 4};
  const std::string message = ErrorOf([&] { LoadCsvDataset(options); });
  EXPECT_NE(message.find(":1: column 7 is empty"), std::string::npos) << message;
}

TEST_F(FileTest, CsvFeatureBeyondFloat32IsAnError) {
  const std::string path = Write("csv_big", "0.5,1e39,0.25,1\n");
  CsvDatasetOptions options{path, 3, 1, 0, 2};
  const std::string message = ErrorOf([&] { LoadCsvDataset(options); });
  EXPECT_NE(message.find(":1: column 2 ('1e39') does not fit in float32"), std::string::npos)
      << message;
}

// Item 1 of issue 48: task.path=/dev/zero, a huge file and a gzip bomb
// ended in std::bad_alloc. Each is refused at the cap, naming the file and
// the key that raises it; a file at the cap is read.
TEST_F(FileTest, DataFilesBeyondTheCapAreRefusedNamingTheKey) {
  ReadLimit limit;
  limit.max_bytes = 1 << 20;
  limit.raised_by = "task.max_file_mib";
  const std::string zero = ErrorOf([&] { ReadFileMaybeGzip("/dev/zero", limit); });
  EXPECT_NE(zero.find("'/dev/zero': more than 1 MiB (the cap of task.max_file_mib; raise "
                      "task.max_file_mib to read it)"),
            std::string::npos)
      << zero;
  // A plain file one byte over the cap, and one at the cap.
  const std::string over = Write("over", std::string((1 << 20) + 1, '1'));
  EXPECT_NE(ErrorOf([&] { ReadFileMaybeGzip(over, limit); }).find("more than 1 MiB"),
            std::string::npos);
  const std::string at = Write("at", std::string(1 << 20, '1'));
  EXPECT_EQ(ReadFileMaybeGzip(at, limit).size(), std::size_t{1} << 20);
  // A gzip bomb: 8 MiB of zeros compress to a few KiB; the decompressed
  // bytes are what the cap counts.
  const std::string bomb = Write("bomb", "") + ".gz";
  EXPECT_LT(WriteGzip(bomb, std::string(8 << 20, '0')), std::size_t{1} << 16);
  const std::string message = ErrorOf([&] { ReadFileMaybeGzip(bomb, limit); });
  EXPECT_NE(message.find(bomb + "': more than 1 MiB"), std::string::npos) << message;
  // The CSV dataset reader passes its options' limit through.
  CsvDatasetOptions options{bomb, 3, 0, 4, 4, limit};
  EXPECT_NE(ErrorOf([&] { LoadCsvDataset(options); }).find("task.max_file_mib"),
            std::string::npos);
}

}  // namespace
}  // namespace stillpoint::dataset_test
