// Sampling text from a trained character-level model (task.kind text):
// `stillpoint generate RUN --prompt TEXT --tokens N` and, through the Python
// bindings, stillpoint.generate.
//
// Each step feeds the last task.context symbols (the prompt and what was
// generated so far) to the model and samples the next symbol from the last
// position's logits: divided by the temperature, restricted to the top_k
// most likely (0: all), never the unknown symbol. An implicit model starts
// each solve from the previous window's fixed point (shifted by one
// position when the window slides, the new position starting from the
// previous last one), so a solve begins close to its answer; the solver's
// iterations per generated symbol are reported.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "layers/models.h"
#include "training/data/text_corpus.h"

namespace stillpoint {

struct GenerateOptions {
  int64_t tokens = 200;       // symbols to generate, >= 1
  double temperature = 1.0;   // > 0; below 1 sharpens the distribution
  int64_t top_k = 0;          // sample among the k most likely symbols; 0: all
  uint64_t seed = 0;
  bool warm_start = true;     // implicit models: start from the previous fixed point

  bool IsValid(std::string* error) const;
};

struct GenerateResult {
  std::string text;                 // the continuation (without the prompt)
  int64_t prompt_symbols = 0;
  int64_t prompt_unknown = 0;       // prompt symbols outside the vocabulary (read as unknown)
  int64_t prompt_dropped = 0;       // prompt symbols before the last window (not seen)
  // Forward-solver iterations of each generated symbol's solve (implicit
  // models; empty otherwise).
  std::vector<double> iterations;
  double seconds = 0;

  double IterationsMean() const;
};

class TextGenerator {
 public:
  // context: the window the model was trained on (task.context).
  TextGenerator(std::shared_ptr<SequenceModel> model, Vocabulary vocabulary, int64_t context);

  // Throws Error for bad options or an empty prompt; prompt symbols outside
  // the vocabulary are read as the unknown symbol and counted.
  GenerateResult Generate(const std::string& prompt, const GenerateOptions& options);

  const Vocabulary& vocabulary() const { return vocabulary_; }
  SequenceModel& model() { return *model_; }

 private:
  std::shared_ptr<SequenceModel> model_;
  Vocabulary vocabulary_;
  int64_t context_;
};

// The generator of a run directory of a text task (its checkpoint.ckpt,
// config and vocabulary.json), or of a checkpoint file in such a directory.
// Errors (ConfigError: bad input) name the file: a run that is not a text
// task, a missing vocabulary.
TextGenerator LoadTextGenerator(const std::string& run);

// The index of the symbol sampled from logits (one row): the unknown id
// excluded, logits / temperature, the top_k largest kept (0: all). Exposed
// for tests.
int64_t SampleSymbol(const std::vector<double>& logits, double temperature, int64_t top_k,
                     Rng& rng);

}  // namespace stillpoint
