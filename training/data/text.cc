// text: character-level language modelling over a text file
// (training/data/text_corpus.h); every attention of the model is causal.
#include "training/data/task_list.h"
#include "training/data/dataset_registry.h"
#include "training/data/text_corpus.h"

namespace stillpoint {
namespace {

struct TextTaskOptions {
  std::string path;  // "": kJargonFile
  std::string encoding = "utf-8";
  int64_t context = 64;
  double validation_fraction = 0.1;

  static const OptionFields<TextTaskOptions>& Fields() {
    using O = TextTaskOptions;
    static const auto* fields =
        &(new OptionFields<O>)
             ->String("path", &O::path,
                      "The text, plain or .gz (default: the Jargon File, "
                      "/usr/share/doc/jargon-text/jargon.txt.gz, Debian's jargon-text); relative "
                      "to the config file")
             .Choice("encoding", &O::encoding, {"utf-8", "bytes"},
                     "Symbols are the text's Unicode characters (utf-8; a file that is not UTF-8 "
                     "text is an error) or its bytes")
             .Int("context", &O::context, 1, 1 << 16,
                  "Symbols per training window (the model's sequence length; model.max_length "
                  "must be at least this)")
             .Double("validation_fraction", &O::validation_fraction, OptionBounds::Open(0, 1),
                     "The fraction at the end of the text held out (a contiguous split), "
                     "evaluated whole");
    return *fields;
  }
};

DatasetSplit MakeText(const TextTaskOptions& o, const DatasetRequest& request) {
  RefuseOverrides(request);
  TextSplitOptions options;
  options.path = ResolvePath(o.path, request.config_path);
  SP_CHECK(StringToTextEncoding(o.encoding, &options.encoding), "task.encoding: unknown '",
           o.encoding, "'");
  options.context = o.context;
  options.validation_fraction = o.validation_fraction;
  options.limit = DataReadLimit(*request.config);
  TextSplit text = LoadTextSplit(options);
  DatasetSplit split;
  split.vocab_size = split.num_classes = text.vocabulary.size();
  split.longest = options.context;
  split.language_model = true;
  split.test_unknown_symbols = text.test_unknown;
  split.run_files[kVocabularyFile] = text.vocabulary.ToJson();
  split.train = std::move(text.train);
  split.test = std::move(text.test);
  return split;
}

}  // namespace

TaskDefinition TextTask() {
  return DefineTask<TextTaskOptions>(
      "character-level language modelling over a text file (the Jargon File by default)",
      MakeText, [](const TextTaskOptions& o) {
        // The vocabulary is known only once the text is read; a few hundred
        // rows is typical of a book.
        return TaskFootprint{o.context, 256, {"task.context"}};
      });
}

}  // namespace stillpoint
