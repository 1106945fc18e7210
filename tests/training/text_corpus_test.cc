// The text task's reader (training/data/text_corpus.h): UTF-8 and byte symbols,
// the vocabulary and its file, the contiguous split, the windows, bits per
// character, and the errors a bad text gets.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <string>

#include "tests/error_text.h"
#include "framework/check.h"
#include "tests/scratch_path.h"
#include "training/data/text_corpus.h"

namespace stillpoint::text_corpus_test {
namespace {

using testing_support::ErrorOf;

std::vector<uint32_t> Utf8(const std::string& text) {
  return DecodeSymbols(text, TextEncoding::kUtf8, "text");
}

TEST(TextSymbolsTest, DecodesUtf8CodePointsAndBytes) {
  // "a", "é" (2 bytes), "─" (3 bytes, a box-drawing character), "😀" (4 bytes).
  const std::string text = "a\xC3\xA9\xE2\x94\x80\xF0\x9F\x98\x80";
  EXPECT_EQ(Utf8(text), (std::vector<uint32_t>{0x61, 0xE9, 0x2500, 0x1F600}));
  EXPECT_EQ(DecodeSymbols(text, TextEncoding::kBytes, "t").size(), text.size());
  for (uint32_t symbol : Utf8(text)) {
    EXPECT_EQ(Utf8(EncodeSymbol(symbol, TextEncoding::kUtf8)), std::vector<uint32_t>{symbol});
  }
}

TEST(TextSymbolsTest, MalformedUtf8AndNulAreNotTextAndSayWhere) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {std::string("ab\x80", 3), "at byte 2"},          // stray continuation byte
      {std::string("ab\xC3", 3), "at byte 2"},          // cut sequence
      {std::string("\xC0\xAF", 2), "at byte 0"},        // overlong "/"
      {std::string("x\xED\xA0\x80", 4), "at byte 1"},   // a surrogate
      {std::string("xy\xF4\x90\x80\x80", 6), "at byte 2"},  // beyond U+10FFFF
      {std::string("abc\0d", 5), "a NUL byte at byte 3"},
  };
  for (const auto& [text, where] : cases) {
    const std::string message =
        ErrorOf<Error>([&] { DecodeSymbols(text, TextEncoding::kUtf8, "book.txt"); });
    EXPECT_NE(message.find("book.txt: not"), std::string::npos) << message;
    EXPECT_NE(message.find(where), std::string::npos) << "wanted '" << where << "' in " << message;
    EXPECT_NE(message.find("task.encoding: bytes"), std::string::npos) << message;
    EXPECT_EQ(ErrorOf<Error>([&] { DecodeSymbols(text, TextEncoding::kBytes, "b"); }), "");
  }
}

TEST(VocabularyTest, IdsAreSortedSymbolsAfterTheUnknownAndUnknownsAreCounted) {
  const Vocabulary v = Vocabulary::Build(Utf8("banana"), TextEncoding::kUtf8);
  EXPECT_EQ(v.size(), 4);  // unknown, a, b, n
  EXPECT_EQ(v.Id('a'), 1);
  EXPECT_EQ(v.Id('b'), 2);
  EXPECT_EQ(v.Id('n'), 3);
  EXPECT_EQ(v.Id('z'), Vocabulary::kUnknown);
  int64_t unknown = 0;
  const std::vector<int64_t> ids = v.EncodeText("bazaar!", &unknown);
  EXPECT_EQ(ids, (std::vector<int64_t>{2, 1, 0, 1, 1, 0, 0}));
  EXPECT_EQ(unknown, 3);
  EXPECT_EQ(v.Decode({2, 1, 3}), "ban");
  EXPECT_EQ(v.Decode({0}), "\xEF\xBF\xBD");  // U+FFFD
  EXPECT_NE(ErrorOf<Error>([&] { v.Decode({4}); }).find("id 4 outside [0, 4)"), std::string::npos);
}

TEST(VocabularyTest, SavesAndRestoresExactly) {
  for (TextEncoding encoding : {TextEncoding::kUtf8, TextEncoding::kBytes}) {
    const std::string text = "\"quoted\"\n\\ tab\t \xE2\x94\x80";
    const Vocabulary v = Vocabulary::Build(DecodeSymbols(text, encoding, "t"), encoding);
    const Vocabulary back = Vocabulary::FromJson(v.ToJson(), "vocabulary.json");
    EXPECT_EQ(back.symbols(), v.symbols());
    EXPECT_EQ(back.encoding(), encoding);
    EXPECT_EQ(back.Decode(back.EncodeText(text, nullptr)), text);
  }
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"[1, 2]", "needs \"encoding\""},
      {R"({"encoding": "latin-1", "symbols": [65]})", "unknown encoding 'latin-1'"},
      {R"({"encoding": "bytes", "symbols": [65, 300]})", "symbol '300'"},
      {R"({"encoding": "utf-8", "symbols": [66, 65]})", "distinct and ascending"},
      {R"({"encoding": "utf-8", "symbols": ["x"]})", "symbol 'x'"},
      {"{unclosed", "not a vocabulary file"},
  };
  for (const auto& [json, wanted] : bad) {
    const std::string message = ErrorOf<Error>([&] { Vocabulary::FromJson(json, "v.json"); });
    EXPECT_NE(message.find("v.json"), std::string::npos) << message;
    EXPECT_NE(message.find(wanted), std::string::npos) << "wanted '" << wanted << "' in "
                                                       << message;
  }
}

TEST(TextSplitTest, ContiguousSplitVocabularyFromTrainingAndEveryHeldOutSymbolOnce) {
  // 40 symbols: 30 for training ("ab" repeated), 10 held out with a 'z'
  // the training part lacks.
  std::string text;
  for (int i = 0; i < 15; ++i) text += "ab";
  text += "abzabababa";
  TextSplitOptions options;
  options.context = 4;
  options.validation_fraction = 0.25;
  const TextSplit split = SplitText(Utf8(text), options, "t");
  EXPECT_EQ(split.train_symbols, 30);
  EXPECT_EQ(split.test_symbols, 10);
  EXPECT_EQ(split.vocabulary.size(), 3);  // unknown, a, b: 'z' is held-out only
  EXPECT_EQ(split.test_unknown, 1);
  // Training windows start at every offset; targets are the next symbols.
  EXPECT_EQ(split.train->size(), 30 - 4);
  const Example& window = split.train->Get(1);
  EXPECT_EQ(window.tokens, (std::vector<int64_t>{2, 1, 2, 1}));   // "baba"
  EXPECT_EQ(window.targets, (std::vector<int64_t>{1, 2, 1, 2}));  // "abab"
  // Held out: ceil(9 / 4) = 3 windows; every symbol after the first is a
  // target exactly once, in order.
  ASSERT_EQ(split.test->size(), 3);
  std::vector<int64_t> targets;
  for (int64_t w = 0; w < split.test->size(); ++w) {
    for (int64_t t : split.test->Get(w).targets) {
      if (t != kIgnoreTarget) targets.push_back(t);
    }
  }
  const std::vector<int64_t> held =
      split.vocabulary.Encode(Utf8(text.substr(31)), nullptr);  // "bzabababa"
  EXPECT_EQ(targets, held);
  // The last window is padded: its positions past the text have no target.
  EXPECT_EQ(split.test->Get(2).targets[1], kIgnoreTarget);
}

TEST(TextSplitTest, TooShortTextsAndEmptySplitsAreErrors) {
  TextSplitOptions options;
  options.context = 9;
  options.validation_fraction = 0.1;
  std::string message = ErrorOf<Error>([&] { SplitText(Utf8("short text"), options, "tiny.txt"); });
  EXPECT_NE(message.find("tiny.txt: the training part (9 of 10 symbols) is shorter than one "
                         "window of task.context 9"),
            std::string::npos)
      << message;
  options.context = 4;
  message = ErrorOf<Error>([&] { SplitText(Utf8("abcdefghijklmnop"), options, "t.txt"); });
  EXPECT_NE(message.find("the held-out part (task.validation_fraction 0.1 of 16 symbols) has 1"),
            std::string::npos)
      << message;
}

class TextFileTest : public testing_support::ScratchDirTest {
 protected:
  TextFileTest() : ScratchDirTest("text") {}
};

TEST_F(TextFileTest, ReadsAFileAndRefusesABinaryOneUnderUtf8) {
  const std::string path = (dir_ / "book.txt").string();
  {
    std::ofstream out(path, std::ios::binary);
    for (int i = 0; i < 50; ++i) out << "the quick brown fox. ";
  }
  TextSplitOptions options;
  options.path = path;
  options.context = 16;
  const TextSplit split = LoadTextSplit(options);
  EXPECT_EQ(split.train_symbols + split.test_symbols, 50 * 21);
  const std::string binary = (dir_ / "image.bin").string();
  {
    std::ofstream out(binary, std::ios::binary);
    for (int i = 0; i < 512; ++i) out.put(static_cast<char>(i * 37));
  }
  options.path = binary;
  const std::string message = ErrorOf<Error>([&] { LoadTextSplit(options); });
  EXPECT_NE(message.find("image.bin: not"), std::string::npos) << message;
  options.encoding = TextEncoding::kBytes;
  EXPECT_EQ(LoadTextSplit(options).train_symbols + LoadTextSplit(options).test_symbols, 512);
  options.path = (dir_ / "missing.txt").string();
  EXPECT_NE(ErrorOf<Error>([&] { LoadTextSplit(options); }).find("missing.txt' does not exist"),
            std::string::npos);
}

TEST(TextSplitTest, BitsPerCharacterIsNatsOverLnTwo) {
  EXPECT_DOUBLE_EQ(BitsPerSymbol(std::log(2.0)), 1.0);
  // A uniform guess over 256 bytes costs 8 bits.
  EXPECT_NEAR(BitsPerSymbol(std::log(256.0)), 8.0, 1e-12);
}

}  // namespace
}  // namespace stillpoint::text_corpus_test
