// Character-level language modelling over a text file.
//
// The file (plain or .gz) is read as symbols: Unicode code points of UTF-8
// text (encoding utf-8; malformed UTF-8 or a NUL byte is an error naming the
// file and byte offset: a binary file is not text), or its bytes (encoding
// bytes; anything goes). The last validation_fraction of the symbols is held
// out (a contiguous split, so no held-out window overlaps a training one).
// The vocabulary is built from the training part alone: id 0 is the unknown
// symbol, ids 1.. the distinct training symbols in ascending code order.
// Held-out symbols the training part lacks map to id 0 and are counted.
//
// Training examples are windows of `context` symbols at every start offset
// (the Batcher's shuffle makes them random windows); the target of position
// t is the symbol at t + 1. The held-out part is evaluated whole: cut into
// consecutive windows of `context` symbols, every held-out symbol after the
// first is a target exactly once (the last window is padded; padding has no
// target and, under causal attention, no influence).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "training/data/dataset.h"

namespace stillpoint {

enum class TextEncoding { kUtf8, kBytes };
const char* ToString(TextEncoding encoding);  // "utf-8", "bytes"
bool StringToTextEncoding(const std::string& text, TextEncoding* encoding);

inline constexpr const char* kJargonFile = "/usr/share/doc/jargon-text/jargon.txt.gz";
inline constexpr const char* kJargonPackage = "jargon-text";

// The symbols of `text`: code points (utf-8) or bytes. `name` names the text
// in errors.
std::vector<uint32_t> DecodeSymbols(std::string_view text, TextEncoding encoding,
                                    const std::string& name);
// A symbol as text: its UTF-8 bytes (utf-8) or the byte itself (bytes).
std::string EncodeSymbol(uint32_t symbol, TextEncoding encoding);

class Vocabulary {
 public:
  static constexpr int64_t kUnknown = 0;

  Vocabulary() = default;
  // The distinct symbols of `symbols`, sorted, after the unknown id.
  static Vocabulary Build(const std::vector<uint32_t>& symbols, TextEncoding encoding);

  TextEncoding encoding() const { return encoding_; }
  // Ids, the unknown one included.
  int64_t size() const { return static_cast<int64_t>(symbols_.size()) + 1; }
  const std::vector<uint32_t>& symbols() const { return symbols_; }
  // The id of a symbol; kUnknown when it is not in the vocabulary.
  int64_t Id(uint32_t symbol) const;
  // Ids of symbols; adds the number mapped to kUnknown to *unknown.
  std::vector<int64_t> Encode(const std::vector<uint32_t>& symbols, int64_t* unknown) const;
  // Ids of a text (decoded with the vocabulary's encoding).
  std::vector<int64_t> EncodeText(std::string_view text, int64_t* unknown) const;
  // The text of ids; kUnknown reads as U+FFFD (utf-8) or '?' (bytes).
  std::string Decode(const std::vector<int64_t>& ids) const;

  // {"encoding": "utf-8", "symbols": [10, 32, ...]}: code points, so the
  // file is plain ASCII whatever the text holds.
  std::string ToJson() const;
  // Throws Error naming `name` when the JSON is not such a vocabulary.
  static Vocabulary FromJson(const std::string& json, const std::string& name);

 private:
  TextEncoding encoding_ = TextEncoding::kUtf8;
  std::vector<uint32_t> symbols_;  // sorted, distinct
};

// The name of the vocabulary file in a run directory.
inline constexpr const char* kVocabularyFile = "vocabulary.json";

// Windows of `context` symbols at every start offset of ids (size: ids -
// context). Examples are built on request: Get's reference is valid until
// the next Get on the same thread.
class TextWindows : public Dataset {
 public:
  TextWindows(std::vector<int64_t> ids, int64_t context, int64_t vocab_size);
  const DatasetInfo& info() const override { return info_; }
  int64_t size() const override;
  const Example& Get(int64_t index) const override;

 private:
  DatasetInfo info_;
  std::vector<int64_t> ids_;
};

struct TextSplitOptions {
  std::string path;                        // "" : kJargonFile
  TextEncoding encoding = TextEncoding::kUtf8;
  int64_t context = 64;                    // symbols per window
  double validation_fraction = 0.1;        // held out, from the end
  ReadLimit limit;                         // of the file's decompressed bytes
};

struct TextSplit {
  Vocabulary vocabulary;
  std::unique_ptr<TextWindows> train;
  std::unique_ptr<InMemoryDataset> test;  // consecutive windows
  int64_t train_symbols = 0;
  int64_t test_symbols = 0;
  int64_t test_unknown = 0;  // held-out symbols outside the vocabulary
};

// Reads, decodes and splits a text. Errors (stillpoint::Error, naming the
// file): a missing file (the default one names the Debian package that
// provides it), text that is not UTF-8 under encoding utf-8, a training
// part shorter than one window plus one symbol, a held-out part of fewer
// than two symbols.
TextSplit LoadTextSplit(const TextSplitOptions& options);
// The same over symbols already decoded (name names them in errors).
TextSplit SplitText(const std::vector<uint32_t>& symbols, const TextSplitOptions& options,
                    const std::string& name);

// Loss in nats per symbol as bits per symbol.
double BitsPerSymbol(double nats);

}  // namespace stillpoint
