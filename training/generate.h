// Sampling text from a trained character-level model (task.kind text):
// `stillpoint generate RUN --prompt TEXT --tokens N` and, through the Python
// bindings, stillpoint.generate.
//
// Each step samples the next symbol from the logits of the last position
// read: divided by the temperature, restricted to the top_k most likely (0:
// all), never the unknown symbol. The model sees at most task.context
// symbols (the prompt and what was generated so far), in one of two ways:
//
//   incremental (the default where StepDecoder supports the model: explicit,
//     tied and implicit models with softmax attention and learned or no
//     positions; training/generate_step.h): each symbol is read once, at
//     the next position, reusing the earlier positions' keys and values (an
//     implicit model solves the new position alone, from the previous
//     position's fixed point). When the window is full, the positions would
//     all shift (learned positions are absolute), so the generator starts a
//     new window from the last `keep` symbols (default context / 2), read
//     again at positions 0..keep-1, and goes on from there: the model then
//     sees between keep + 1 and context symbols, and each step's logits are
//     those of a full forward pass over exactly that window. keep =
//     context - 1 gives the full_window path's windows (every step past the
//     window then re-reads context - 1 symbols).
//   full_window (every other model, or incremental = false): each step is a
//     forward pass over the last min(context, length) symbols; an implicit
//     model starts each solve from the previous window's fixed point
//     (shifted by one position when the window slid, the new position
//     starting from the previous last one).
//
// The solver's iterations per generated symbol (implicit models) are
// reported: those of the solve whose logits the symbol was sampled from.
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
  bool incremental = true;    // read each symbol once where the model allows (see above)
  int64_t keep = 0;           // incremental: symbols kept when the window is full,
                              // [1, context); 0: context / 2

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
  // "incremental" or "full_window", and why not incremental when the model
  // does not allow it (empty otherwise).
  std::string mode;
  std::string full_window_reason;
  // Positions the model computed (prompt included): the work done. A full
  // window counts each of its positions.
  int64_t positions = 0;
  // Incremental: windows restarted from the last `keep` symbols.
  int64_t restarts = 0;
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

  // Throws Error when options are out of range for this model (IsValid, and
  // keep within [1, context) or 0). Generate checks them too.
  void CheckOptions(const GenerateOptions& options) const;

  const Vocabulary& vocabulary() const { return vocabulary_; }
  int64_t context() const { return context_; }
  SequenceModel& model() { return *model_; }

 private:
  // The two ways of reading the window (see above); ids: the prompt's
  // symbols, then the generated ones are appended.
  void GenerateIncremental(std::vector<int64_t>& ids, const GenerateOptions& options, Rng& rng,
                           GenerateResult& result);
  void GenerateFullWindow(std::vector<int64_t>& ids, const GenerateOptions& options, Rng& rng,
                          GenerateResult& result);

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
