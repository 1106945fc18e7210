// Datasets: a finite, indexable list of examples, and a Batcher that draws
// seeded, shuffled batches from one and can save and restore its position.
//
// An example is either a token sequence (ids in [0, vocab_size)) or a
// sequence of feature vectors (e.g. image patches), with targets that are
// either one class per token (sequence tasks; kIgnoreTarget marks positions
// that carry no loss) or one class per example (classification).
//
// Here: the containers and the readers of the 8x8 digits images (as 2x2-patch
// tokens) and of CSV files of token ids or features. The tasks a config
// names (task.kind), synthetic or read from files, are under training/data/
// and listed in training/data/task_list.h.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "framework/random.h"
#include "framework/serialize.h"
#include "framework/tensor.h"

namespace stillpoint {

constexpr int64_t kIgnoreTarget = -1;

struct Example {
  std::vector<int64_t> tokens;    // [length] when the dataset has tokens
  std::vector<double> features;   // [length * feature_dim] when it has features
  std::vector<int64_t> targets;   // [length] (per token) or [1] (per example)
};

struct DatasetInfo {
  int64_t length = 0;        // tokens per example
  int64_t vocab_size = 0;    // > 0 for token inputs
  int64_t feature_dim = 0;   // > 0 for feature inputs
  int64_t num_classes = 0;   // size of the output layer
  bool per_token_targets = true;
  // Tokens that form a grid, row-major, this many columns wide (length =
  // rows x grid_width); 0: a sequence. The 2-D position schemes and the
  // local mask read it (layers/positions.h).
  int64_t grid_width = 0;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual const DatasetInfo& info() const = 0;
  virtual int64_t size() const = 0;
  virtual const Example& Get(int64_t index) const = 0;
};

// A dataset held in memory (all built-in datasets are).
class InMemoryDataset : public Dataset {
 public:
  InMemoryDataset(DatasetInfo info, std::vector<Example> examples);
  const DatasetInfo& info() const override { return info_; }
  int64_t size() const override { return static_cast<int64_t>(examples_.size()); }
  const Example& Get(int64_t index) const override;

 private:
  DatasetInfo info_;
  std::vector<Example> examples_;
};

// The first `count` examples of `whole`, or all of it when count is 0 or at
// least its size (eval.max_examples: a quick evaluation on part of a held-out
// set). The examples stay owned by `whole`, which the result keeps.
std::unique_ptr<Dataset> FirstExamples(std::unique_ptr<Dataset> whole, int64_t count);

// A batch in the layout models consume.
struct Batch {
  int64_t batch_size = 0;
  int64_t length = 0;
  std::vector<int64_t> tokens;  // [batch_size * length] (token datasets)
  Tensor features;              // [batch_size, length, feature_dim] (feature datasets)
  std::vector<int64_t> targets; // [batch_size * length] or [batch_size]
  int64_t grid_width = 0;        // the dataset's DatasetInfo::grid_width
};

// Stacks examples [indices] into a batch of the given dtype.
Batch MakeBatch(const Dataset& dataset, const std::vector<int64_t>& indices, DType dtype);
// Examples [begin, end) of a batch (its tokens and targets copied, its
// features a view). Throws unless 0 <= begin < end <= batch_size.
Batch SliceBatch(const Batch& batch, int64_t begin, int64_t end);

// Changes a training batch in place with random choices drawn from rng
// (e.g. image flips: training/data/image_augment.h).
using BatchAugment = std::function<void(Rng& rng, Batch* batch)>;

// Draws batches in a seeded random order, epoch after epoch; the position
// (epoch, offset within the epoch's permutation) can be saved and restored so
// a resumed run sees exactly the same batches. With an augment, each batch is
// passed through it with a generator seeded by the batch's position, so a
// restored position augments the same way too.
class Batcher {
 public:
  Batcher(const Dataset& dataset, int64_t batch_size, uint64_t seed, DType dtype,
          BatchAugment augment = nullptr);
  Batch Next();

  struct Position {
    int64_t epoch = 0;
    int64_t offset = 0;
  };
  Position position() const { return {epoch_, offset_}; }
  void Restore(const Position& position);

 private:
  void Shuffle();
  const Dataset& dataset_;
  int64_t batch_size_;
  uint64_t seed_;
  DType dtype_;
  BatchAugment augment_;
  int64_t epoch_ = 0;
  int64_t offset_ = 0;
  std::vector<int64_t> order_;
};

// ------------------------------------------------------ readers
//
// The tasks built on them (task.kind) are under training/data/.

// The 8x8 digits CSV (64 pixels in 0..16 then the label, per line) as 16
// tokens of 2x2 patches with 4 features each (pixel / 16). Errors name the
// file and line. Reads plain or gzip-compressed (.gz) files.
struct DigitsSplit {
  std::unique_ptr<InMemoryDataset> train;
  std::unique_ptr<InMemoryDataset> test;
};
DigitsSplit LoadDigits(const std::string& path, double test_fraction, uint64_t seed,
                       const ReadLimit& limit = ReadLimit());

// Whether a CSV line is a header row: every cell is a non-empty name that
// does not read as a number ("x0,x1,label"). Only a file's first non-blank
// line can be one; a line mixing names and numbers is data (and an error).
bool IsCsvHeader(const std::string& line);

// A user's CSV: one example per line, optionally after a header row of
// column names (IsCsvHeader; it must name as many columns as the rows
// have). With token inputs the first
// `length` columns are token ids; with features the first length *
// feature_dim columns are numbers. The remaining columns are targets: either
// `length` per-token classes (kIgnoreTarget allowed) or one class label.
// Errors name the file, line and column.
struct CsvDatasetOptions {
  std::string path;
  int64_t length = 0;
  int64_t feature_dim = 0;  // 0: token ids
  int64_t vocab_size = 0;   // required for token ids
  int64_t num_classes = 0;
  ReadLimit limit;  // of the file's decompressed bytes
};
std::unique_ptr<InMemoryDataset> LoadCsvDataset(const CsvDatasetOptions& options);

// Reads a whole file, transparently gunzipping a .gz file; throws an Error
// naming the path when it cannot, or when it (decompressed) holds more than
// limit.max_bytes (framework/serialize.h).
std::string ReadFileMaybeGzip(const std::string& path, const ReadLimit& limit = ReadLimit());

}  // namespace stillpoint
