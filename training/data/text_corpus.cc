#include "training/data/text_corpus.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "framework/check.h"

namespace stillpoint {

const char* ToString(TextEncoding encoding) {
  return encoding == TextEncoding::kUtf8 ? "utf-8" : "bytes";
}

bool StringToTextEncoding(const std::string& text, TextEncoding* encoding) {
  if (text == "utf-8") {
    *encoding = TextEncoding::kUtf8;
  } else if (text == "bytes") {
    *encoding = TextEncoding::kBytes;
  } else {
    return false;
  }
  return true;
}

namespace {

// The code point of the UTF-8 sequence at text[*offset], advancing *offset;
// -1 when the bytes there are not well-formed UTF-8 (a stray continuation
// byte, a cut sequence, an overlong form, a surrogate, beyond U+10FFFF).
int64_t NextCodePoint(std::string_view text, std::size_t* offset) {
  const auto byte = [&](std::size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t lead = byte(*offset);
  int length = 0;
  uint32_t code = 0, minimum = 0;
  if (lead < 0x80) {
    ++*offset;
    return lead;
  } else if ((lead & 0xE0) == 0xC0) {
    length = 2, code = lead & 0x1F, minimum = 0x80;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3, code = lead & 0x0F, minimum = 0x800;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4, code = lead & 0x07, minimum = 0x10000;
  } else {
    return -1;
  }
  if (*offset + length > text.size()) return -1;
  for (int i = 1; i < length; ++i) {
    const uint8_t next = byte(*offset + i);
    if ((next & 0xC0) != 0x80) return -1;
    code = (code << 6) | (next & 0x3F);
  }
  if (code < minimum || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return -1;
  *offset += length;
  return code;
}

}  // namespace

std::vector<uint32_t> DecodeSymbols(std::string_view text, TextEncoding encoding,
                                    const std::string& name) {
  std::vector<uint32_t> symbols;
  symbols.reserve(text.size());
  if (encoding == TextEncoding::kBytes) {
    for (char c : text) symbols.push_back(static_cast<uint8_t>(c));
    return symbols;
  }
  std::size_t offset = 0;
  while (offset < text.size()) {
    const std::size_t start = offset;
    const int64_t code = NextCodePoint(text, &offset);
    SP_CHECK(code >= 0, name, ": not UTF-8 text (malformed UTF-8 at byte ", start,
             "); set task.encoding: bytes to model a file's bytes");
    SP_CHECK(code != 0, name, ": not text (a NUL byte at byte ", start,
             "); set task.encoding: bytes to model a binary file's bytes");
    symbols.push_back(static_cast<uint32_t>(code));
  }
  return symbols;
}

std::string EncodeSymbol(uint32_t symbol, TextEncoding encoding) {
  std::string out;
  if (encoding == TextEncoding::kBytes || symbol < 0x80) {
    out.push_back(static_cast<char>(symbol));
  } else if (symbol < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (symbol >> 6)));
    out.push_back(static_cast<char>(0x80 | (symbol & 0x3F)));
  } else if (symbol < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (symbol >> 12)));
    out.push_back(static_cast<char>(0x80 | ((symbol >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (symbol & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (symbol >> 18)));
    out.push_back(static_cast<char>(0x80 | ((symbol >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((symbol >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (symbol & 0x3F)));
  }
  return out;
}

// ------------------------------------------------------------ vocabulary

Vocabulary Vocabulary::Build(const std::vector<uint32_t>& symbols, TextEncoding encoding) {
  Vocabulary v;
  v.encoding_ = encoding;
  v.symbols_ = symbols;
  std::sort(v.symbols_.begin(), v.symbols_.end());
  v.symbols_.erase(std::unique(v.symbols_.begin(), v.symbols_.end()), v.symbols_.end());
  return v;
}

int64_t Vocabulary::Id(uint32_t symbol) const {
  const auto it = std::lower_bound(symbols_.begin(), symbols_.end(), symbol);
  if (it == symbols_.end() || *it != symbol) return kUnknown;
  return 1 + (it - symbols_.begin());
}

std::vector<int64_t> Vocabulary::Encode(const std::vector<uint32_t>& symbols,
                                        int64_t* unknown) const {
  std::vector<int64_t> ids;
  ids.reserve(symbols.size());
  for (uint32_t symbol : symbols) {
    ids.push_back(Id(symbol));
    if (ids.back() == kUnknown && unknown != nullptr) ++*unknown;
  }
  return ids;
}

std::vector<int64_t> Vocabulary::EncodeText(std::string_view text, int64_t* unknown) const {
  return Encode(DecodeSymbols(text, encoding_, "the text"), unknown);
}

std::string Vocabulary::Decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (int64_t id : ids) {
    SP_CHECK(id >= 0 && id < size(), "Vocabulary::Decode: id ", id, " outside [0, ", size(), ")");
    if (id == kUnknown) {
      out += encoding_ == TextEncoding::kUtf8 ? "\xEF\xBF\xBD" : "?";
    } else {
      out += EncodeSymbol(symbols_[id - 1], encoding_);
    }
  }
  return out;
}

std::string Vocabulary::ToJson() const {
  std::ostringstream out;
  out << "{\"encoding\": \"" << ToString(encoding_) << "\", \"unknown_id\": " << kUnknown
      << ", \"symbols\": [";
  for (std::size_t i = 0; i < symbols_.size(); ++i) out << (i ? ", " : "") << symbols_[i];
  out << "]}\n";
  return out.str();
}

Vocabulary Vocabulary::FromJson(const std::string& json, const std::string& name) {
  Vocabulary v;
  YAML::Node root;
  try {
    root = YAML::Load(json);
  } catch (const YAML::Exception& e) {
    SP_CHECK(false, name, ": not a vocabulary file: ", e.what());
  }
  SP_CHECK(root.IsMap() && root["encoding"] && root["symbols"] && root["symbols"].IsSequence(),
           name, ": not a vocabulary file (needs \"encoding\" and a \"symbols\" list)");
  const std::string encoding = root["encoding"].Scalar();
  SP_CHECK(StringToTextEncoding(encoding, &v.encoding_), name, ": unknown encoding '", encoding,
           "' (utf-8 or bytes)");
  const uint32_t limit = v.encoding_ == TextEncoding::kBytes ? 0xFF : 0x10FFFF;
  for (const YAML::Node& item : root["symbols"]) {
    int64_t symbol = -1;
    try {
      symbol = item.as<int64_t>();
    } catch (const YAML::Exception&) {
    }
    SP_CHECK(symbol >= 0 && symbol <= limit, name, ": symbol '", item.Scalar(),
             "' is not a code in [0, ", limit, "]");
    SP_CHECK(v.symbols_.empty() || static_cast<uint32_t>(symbol) > v.symbols_.back(), name,
             ": symbols must be distinct and ascending");
    v.symbols_.push_back(static_cast<uint32_t>(symbol));
  }
  return v;
}

// --------------------------------------------------------------- windows

TextWindows::TextWindows(std::vector<int64_t> ids, int64_t context, int64_t vocab_size)
    : ids_(std::move(ids)) {
  SP_CHECK(context >= 1 && static_cast<int64_t>(ids_.size()) > context,
           "TextWindows: needs more than ", context, " symbols, got ", ids_.size());
  info_.length = context;
  info_.vocab_size = vocab_size;
  info_.num_classes = vocab_size;
  info_.per_token_targets = true;
}

int64_t TextWindows::size() const { return static_cast<int64_t>(ids_.size()) - info_.length; }

const Example& TextWindows::Get(int64_t index) const {
  SP_CHECK(index >= 0 && index < size(), "TextWindows::Get: index ", index, " out of range [0, ",
           size(), ")");
  // One slot per thread: MakeBatch copies an example before the next Get.
  thread_local Example slot;
  const auto begin = ids_.begin() + index;
  slot.tokens.assign(begin, begin + info_.length);
  slot.targets.assign(begin + 1, begin + info_.length + 1);
  return slot;
}

// ----------------------------------------------------------------- split

TextSplit SplitText(const std::vector<uint32_t>& symbols, const TextSplitOptions& options,
                    const std::string& name) {
  SP_CHECK(options.context >= 1, name, ": task.context must be >= 1");
  SP_CHECK(options.validation_fraction > 0 && options.validation_fraction < 1, name,
           ": task.validation_fraction must be in (0, 1), got ", options.validation_fraction);
  const int64_t total = static_cast<int64_t>(symbols.size());
  const int64_t held = static_cast<int64_t>(
      std::floor(options.validation_fraction * static_cast<double>(total)));
  const int64_t train = total - held;
  SP_CHECK(train > options.context, name, ": the training part (", train, " of ", total,
           " symbols) is shorter than one window of task.context ", options.context,
           " symbols and its next symbol; use a longer text or a shorter context");
  SP_CHECK(held >= 2, name, ": the held-out part (task.validation_fraction ",
           options.validation_fraction, " of ", total, " symbols) has ", held,
           " symbols; it needs at least 2 (one to predict from, one to predict)");
  TextSplit split;
  split.train_symbols = train;
  split.test_symbols = held;
  const std::vector<uint32_t> train_part(symbols.begin(), symbols.begin() + train);
  const std::vector<uint32_t> test_part(symbols.begin() + train, symbols.end());
  split.vocabulary = Vocabulary::Build(train_part, options.encoding);
  const int64_t vocab = split.vocabulary.size();
  split.train = std::make_unique<TextWindows>(split.vocabulary.Encode(train_part, nullptr),
                                              options.context, vocab);
  const std::vector<int64_t> test_ids = split.vocabulary.Encode(test_part, &split.test_unknown);
  // Consecutive windows; position t of window w reads test_ids[w * C + t]
  // and predicts the next symbol, when there is one.
  const int64_t C = options.context;
  DatasetInfo info = split.train->info();
  std::vector<Example> windows;
  for (int64_t begin = 0; begin + 1 < held; begin += C) {
    Example ex;
    ex.tokens.assign(C, 0);
    ex.targets.assign(C, kIgnoreTarget);
    for (int64_t t = 0; t < C && begin + t < held; ++t) {
      ex.tokens[t] = test_ids[begin + t];
      if (begin + t + 1 < held) ex.targets[t] = test_ids[begin + t + 1];
    }
    windows.push_back(std::move(ex));
  }
  split.test = std::make_unique<InMemoryDataset>(info, std::move(windows));
  return split;
}

TextSplit LoadTextSplit(const TextSplitOptions& options) {
  const std::string path = options.path.empty() ? kJargonFile : options.path;
  if (!std::filesystem::exists(path)) {
    SP_CHECK(!options.path.empty(), "text: '", path, "' does not exist; Debian's package ",
             kJargonPackage, " provides it (sudo apt-get install ", kJargonPackage,
             ", or bash scripts/setup.sh), or set task.path to a text file");
    SP_CHECK(false, "text: '", path, "' does not exist");
  }
  const std::string content = ReadFileMaybeGzip(path, options.limit);
  return SplitText(DecodeSymbols(content, options.encoding, path), options, path);
}

double BitsPerSymbol(double nats) { return nats / std::log(2.0); }

}  // namespace stillpoint
