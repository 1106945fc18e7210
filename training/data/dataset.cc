#include "training/data/dataset.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <sstream>

namespace stillpoint {

// ------------------------------------------------------------ containers

InMemoryDataset::InMemoryDataset(DatasetInfo info, std::vector<Example> examples)
    : info_(info), examples_(std::move(examples)) {}

const Example& InMemoryDataset::Get(int64_t index) const {
  SP_CHECK(index >= 0 && index < size(), "Dataset::Get: index ", index, " out of range [0, ",
           size(), ")");
  return examples_[index];
}

namespace {

class FirstExamplesView : public Dataset {
 public:
  FirstExamplesView(std::unique_ptr<Dataset> whole, int64_t count)
      : whole_(std::move(whole)), count_(count) {}
  const DatasetInfo& info() const override { return whole_->info(); }
  int64_t size() const override { return count_; }
  const Example& Get(int64_t index) const override {
    SP_CHECK(index >= 0 && index < count_, "Dataset::Get: index ", index, " out of range [0, ",
             count_, ")");
    return whole_->Get(index);
  }

 private:
  std::unique_ptr<Dataset> whole_;
  int64_t count_;
};

}  // namespace

std::unique_ptr<Dataset> FirstExamples(std::unique_ptr<Dataset> whole, int64_t count) {
  SP_CHECK(count >= 0, "FirstExamples: count must be >= 0, got ", count);
  if (count == 0 || count >= whole->size()) return whole;
  return std::make_unique<FirstExamplesView>(std::move(whole), count);
}

Batch MakeBatch(const Dataset& dataset, const std::vector<int64_t>& indices, DType dtype) {
  const DatasetInfo& info = dataset.info();
  Batch batch;
  batch.batch_size = static_cast<int64_t>(indices.size());
  batch.length = info.length;
  batch.grid_width = info.grid_width;
  if (info.feature_dim > 0) {
    batch.features =
        Tensor(Shape{batch.batch_size, info.length, info.feature_dim}, dtype);
  }
  int64_t row = 0;
  for (int64_t index : indices) {
    const Example& example = dataset.Get(index);
    if (info.feature_dim > 0) {
      const int64_t width = info.length * info.feature_dim;
      for (int64_t k = 0; k < width; ++k) batch.features.set(row * width + k, example.features[k]);
    } else {
      batch.tokens.insert(batch.tokens.end(), example.tokens.begin(), example.tokens.end());
    }
    batch.targets.insert(batch.targets.end(), example.targets.begin(), example.targets.end());
    ++row;
  }
  return batch;
}

Batch SliceBatch(const Batch& batch, int64_t begin, int64_t end) {
  SP_CHECK(0 <= begin && begin < end && end <= batch.batch_size, "SliceBatch: examples [", begin,
           ", ", end, ") of a batch of ", batch.batch_size);
  Batch slice;
  slice.batch_size = end - begin;
  slice.length = batch.length;
  slice.grid_width = batch.grid_width;
  if (!batch.tokens.empty()) {
    slice.tokens.assign(batch.tokens.begin() + begin * batch.length,
                        batch.tokens.begin() + end * batch.length);
  }
  if (batch.features.defined()) slice.features = batch.features.SliceRows(begin, end);
  // One target per token, or one per example.
  const int64_t per_example =
      static_cast<int64_t>(batch.targets.size()) / std::max<int64_t>(batch.batch_size, 1);
  slice.targets.assign(batch.targets.begin() + begin * per_example,
                       batch.targets.begin() + end * per_example);
  return slice;
}

Batcher::Batcher(const Dataset& dataset, int64_t batch_size, uint64_t seed, DType dtype,
                 BatchAugment augment)
    : dataset_(dataset),
      batch_size_(batch_size),
      seed_(seed),
      dtype_(dtype),
      augment_(std::move(augment)) {
  SP_CHECK(batch_size >= 1, "Batcher: batch_size must be >= 1, got ", batch_size);
  SP_CHECK(dataset.size() >= 1, "Batcher: the dataset is empty");
  Shuffle();
}

void Batcher::Shuffle() {
  order_.resize(dataset_.size());
  std::iota(order_.begin(), order_.end(), 0);
  // A fresh generator per epoch: the order depends only on (seed, epoch), so
  // restoring a position needs no generator state.
  Rng rng(seed_ * 1000003 + static_cast<uint64_t>(epoch_));
  for (int64_t i = static_cast<int64_t>(order_.size()) - 1; i > 0; --i) {
    std::swap(order_[i], order_[rng.UniformInt(i + 1)]);
  }
}

Batch Batcher::Next() {
  const Position start = position();
  std::vector<int64_t> indices;
  indices.reserve(batch_size_);
  while (static_cast<int64_t>(indices.size()) < batch_size_) {
    if (offset_ == static_cast<int64_t>(order_.size())) {
      ++epoch_;
      offset_ = 0;
      Shuffle();
    }
    indices.push_back(order_[offset_++]);
  }
  Batch batch = MakeBatch(dataset_, indices, dtype_);
  if (augment_) {
    // A generator of the batch's own, from where it starts: (seed, epoch,
    // offset) names the batch, so a restored position draws the same.
    Rng rng((seed_ * 1000003 + static_cast<uint64_t>(start.epoch)) * 1000033 +
            static_cast<uint64_t>(start.offset) + 0x5eed);
    augment_(rng, &batch);
  }
  return batch;
}

void Batcher::Restore(const Position& position) {
  SP_CHECK(position.epoch >= 0 && position.offset >= 0 && position.offset <= dataset_.size(),
           "Batcher::Restore: position (epoch ", position.epoch, ", offset ", position.offset,
           ") does not fit a dataset of ", dataset_.size(), " examples");
  epoch_ = position.epoch;
  offset_ = position.offset;
  Shuffle();
}

// ---------------------------------------------------------------- files

std::string ReadFileMaybeGzip(const std::string& path, const ReadLimit& limit) {
  // The size a regular file reports (the compressed size) is checked first;
  // the decompressed bytes are counted as they come (a gzip bomb).
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    SP_CHECK(false, "cannot read '", path, "': it is a directory");
  }
  if (std::filesystem::is_regular_file(path, error) &&
      std::filesystem::file_size(path, error) > limit.max_bytes && !error) {
    ThrowReadLimitExceeded(path, limit);
  }
  // gzopen reads plain files unchanged, so one code path serves both.
  gzFile file = gzopen(path.c_str(), "rb");
  SP_CHECK(file != nullptr, "cannot open '", path, "': ", std::strerror(errno));
  std::string content;
  char buffer[1 << 16];
  while (true) {
    const int n = gzread(file, buffer, sizeof(buffer));
    if (n < 0) {
      int code = 0;
      const std::string message = gzerror(file, &code);
      gzclose(file);
      SP_CHECK(false, "cannot read '", path, "': ", message);
    }
    if (n == 0) {
      // End of input. A gzip stream cut short also ends here, with the rows
      // decoded so far; only gzerror says it was truncated.
      int code = Z_OK;
      const std::string message = gzerror(file, &code);
      gzclose(file);
      SP_CHECK(code == Z_OK || code == Z_STREAM_END, "cannot read '", path,
               "': the compressed data ends early (", message, "); the file is truncated");
      return content;
    }
    if (content.size() + static_cast<std::size_t>(n) > limit.max_bytes) {
      gzclose(file);
      ThrowReadLimitExceeded(path, limit);
    }
    content.append(buffer, n);
  }
}

namespace {

// Splits a CSV line into numbers; errors name file, line and column. A
// trailing comma is an empty last cell (an error), not the end of the row.
std::vector<double> ParseCsvNumbers(const std::string& line, const std::string& path,
                                    int64_t line_number) {
  std::vector<double> values;
  std::size_t begin = 0;
  int64_t column = 0;
  while (true) {
    const std::size_t comma = line.find(',', begin);
    const std::string cell =
        line.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
    ++column;
    const auto first = cell.find_first_not_of(" \t\r");
    const auto last = cell.find_last_not_of(" \t\r");
    SP_CHECK(first != std::string::npos, path, ":", line_number, ": column ", column,
             " is empty");
    const std::string text = cell.substr(first, last - first + 1);
    char* end = nullptr;
    const double value = std::strtod(text.c_str(), &end);
    SP_CHECK(end == text.c_str() + text.size() && std::isfinite(value), path, ":", line_number,
             ": column ", column, " is not a finite number: '", text, "'");
    // Features become float32 tensors, where this would be infinite.
    SP_CHECK(std::fabs(value) <= FLT_MAX, path, ":", line_number, ": column ", column, " ('",
             text, "') does not fit in float32");
    values.push_back(value);
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  return values;
}

// The number of comma-separated cells of a line.
int64_t CsvCellCount(const std::string& line) {
  return static_cast<int64_t>(std::count(line.begin(), line.end(), ',')) + 1;
}

int64_t AsClass(double value, int64_t num_classes, bool allow_ignore, const std::string& path,
                int64_t line_number, int64_t column, const char* what) {
  // Checked before the conversion, which is undefined for a double beyond
  // int64's range (found by tests/fuzz/csv_fuzz.cc).
  SP_CHECK(value == std::trunc(value) && std::fabs(value) < 9.0e18, path, ":", line_number,
           ": column ", column, " (", what, ") must be an integer, got ", value);
  const int64_t id = static_cast<int64_t>(value);
  SP_CHECK((id >= 0 && id < num_classes) || (allow_ignore && id == kIgnoreTarget), path, ":",
           line_number, ": column ", column, " (", what, ") is ", id, ", outside [0, ",
           num_classes, ")");
  return id;
}

}  // namespace

DigitsSplit LoadDigits(const std::string& path, double test_fraction, uint64_t seed,
                       const ReadLimit& limit) {
  SP_CHECK(test_fraction > 0 && test_fraction < 1, "LoadDigits: test_fraction must be in (0, 1)");
  const std::string content = ReadFileMaybeGzip(path, limit);
  std::vector<Example> examples;
  std::stringstream lines(content);
  std::string line;
  int64_t line_number = 0;
  while (std::getline(lines, line)) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::vector<double> values = ParseCsvNumbers(line, path, line_number);
    SP_CHECK(values.size() == 65, path, ":", line_number, ": expected 65 columns (64 pixels and "
             "a label), got ", values.size());
    Example ex;
    // 16 tokens: the 2x2 patches of the 8x8 image in row-major patch order.
    for (int64_t pr = 0; pr < 4; ++pr) {
      for (int64_t pc = 0; pc < 4; ++pc) {
        for (int64_t dr = 0; dr < 2; ++dr) {
          for (int64_t dc = 0; dc < 2; ++dc) {
            const int64_t column = (2 * pr + dr) * 8 + (2 * pc + dc);
            SP_CHECK(values[column] >= 0 && values[column] <= 16, path, ":", line_number,
                     ": pixel column ", column + 1, " is ", values[column], ", outside [0, 16]");
            ex.features.push_back(values[column] / 16.0);
          }
        }
      }
    }
    ex.targets = {AsClass(values[64], 10, false, path, line_number, 65, "label")};
    examples.push_back(std::move(ex));
  }
  SP_CHECK(examples.size() >= 2, path, ": needs at least two examples, found ", examples.size());
  // Seeded shuffle, then the split.
  Rng rng(seed);
  for (int64_t i = static_cast<int64_t>(examples.size()) - 1; i > 0; --i) {
    std::swap(examples[i], examples[rng.UniformInt(i + 1)]);
  }
  const int64_t test_count = std::max<int64_t>(
      1, static_cast<int64_t>(test_fraction * static_cast<double>(examples.size())));
  DatasetInfo info;
  info.length = 16;
  info.feature_dim = 4;
  info.num_classes = 10;
  info.per_token_targets = false;
  std::vector<Example> test(std::make_move_iterator(examples.end() - test_count),
                            std::make_move_iterator(examples.end()));
  examples.resize(examples.size() - test_count);
  return {std::make_unique<InMemoryDataset>(info, std::move(examples)),
          std::make_unique<InMemoryDataset>(info, std::move(test))};
}

bool IsCsvHeader(const std::string& line) {
  std::size_t begin = 0;
  while (true) {
    const std::size_t comma = line.find(',', begin);
    const std::string cell =
        line.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
    const auto first = cell.find_first_not_of(" \t\r");
    if (first == std::string::npos) return false;
    const auto last = cell.find_last_not_of(" \t\r");
    const std::string text = cell.substr(first, last - first + 1);
    char* end = nullptr;
    std::strtod(text.c_str(), &end);
    if (end == text.c_str() + text.size()) return false;  // a number
    if (comma == std::string::npos) return true;
    begin = comma + 1;
  }
}

std::unique_ptr<InMemoryDataset> LoadCsvDataset(const CsvDatasetOptions& options) {
  const std::string& path = options.path;
  SP_CHECK(options.length >= 1, path, ": csv dataset needs length >= 1");
  SP_CHECK(options.num_classes >= 1, path, ": csv dataset needs num_classes >= 1");
  SP_CHECK(options.feature_dim > 0 || options.vocab_size > 0, path,
           ": csv dataset of token ids needs vocab_size >= 1");
  const std::string content = ReadFileMaybeGzip(path, options.limit);
  const int64_t inputs = options.feature_dim > 0 ? options.length * options.feature_dim
                                                 : options.length;
  DatasetInfo info;
  info.length = options.length;
  info.vocab_size = options.feature_dim > 0 ? 0 : options.vocab_size;
  info.feature_dim = options.feature_dim;
  info.num_classes = options.num_classes;
  std::vector<Example> examples;
  std::stringstream lines(content);
  std::string line;
  int64_t line_number = 0;
  bool first = true;
  int64_t header_columns = 0;  // 0: no header row
  while (std::getline(lines, line)) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (first && header_columns == 0 && IsCsvHeader(line)) {
      header_columns = CsvCellCount(line);
      continue;
    }
    const std::vector<double> values = ParseCsvNumbers(line, path, line_number);
    const int64_t count = static_cast<int64_t>(values.size());
    SP_CHECK(header_columns == 0 || count == header_columns, path, ":", line_number, ": ", count,
             " columns, but the header row names ", header_columns);
    const bool per_token = count == inputs + options.length;
    SP_CHECK(per_token || count == inputs + 1, path, ":", line_number, ": expected ",
             inputs + options.length, " columns (inputs and per-token targets) or ", inputs + 1,
             " (inputs and one label), got ", count);
    if (first) {
      info.per_token_targets = per_token;
      first = false;
    }
    SP_CHECK(per_token == info.per_token_targets, path, ":", line_number,
             ": rows mix per-token targets and single labels");
    Example ex;
    for (int64_t c = 0; c < inputs; ++c) {
      if (options.feature_dim > 0) {
        ex.features.push_back(values[c]);
      } else {
        ex.tokens.push_back(
            AsClass(values[c], options.vocab_size, false, path, line_number, c + 1, "token id"));
      }
    }
    for (int64_t c = inputs; c < count; ++c) {
      ex.targets.push_back(
          AsClass(values[c], options.num_classes, per_token, path, line_number, c + 1, "target"));
    }
    examples.push_back(std::move(ex));
  }
  SP_CHECK(!examples.empty(), path, ": no examples");
  return std::make_unique<InMemoryDataset>(info, std::move(examples));
}

}  // namespace stillpoint
