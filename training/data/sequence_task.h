// The synthetic sequence tasks' common part: their task.* keys and the
// loop that draws examples token by token from a seed, with a length knob so
// a model trained at one length can be evaluated at another (`--length`).
// Each task (reverse.cc, sort.cc, ...) gives its rule: how one example is
// drawn and which settings it cannot use.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "framework/option_fields.h"
#include "framework/random.h"
#include "training/data/task.h"
#include "training/data/dataset.h"

namespace stillpoint {

// task.* keys of the sequence tasks.
struct SequenceTaskOptions {
  int64_t length = 16;           // tokens per training example
  int64_t vocab_size = 16;       // symbols
  int64_t train_examples = 4096;
  int64_t test_examples = 512;

  static const OptionFields<SequenceTaskOptions>& Fields();
};

struct SequenceRule {
  // "" or what the task cannot do with (length, vocab_size) (nullptr: any).
  std::string (*check)(int64_t length, int64_t vocab_size) = nullptr;
  // Fills example.tokens and example.targets (both of `length`, targets
  // kIgnoreTarget) from rng. `vocab` is the input symbols.
  void (*draw)(Rng& rng, int64_t length, int64_t vocab, Example& example) = nullptr;
};

// `examples` examples of the rule at (length, vocab_size) from `seed`, one
// generator for all of them in order. Throws ConfigError when the rule
// refuses the settings.
std::unique_ptr<InMemoryDataset> DrawSequences(const SequenceRule& rule, int64_t length,
                                               int64_t vocab_size, int64_t examples,
                                               uint64_t seed);

// A task of the rule, with the keys of SequenceTaskOptions; `--length`
// changes the held-out set's length.
TaskDefinition DefineSequenceTask(std::string doc, const SequenceRule& rule);

// The held-out options with `--length` applied; refuses `--size`. For tasks
// whose scale is task.length.
template <typename Options>
Options WithTestLength(Options options, const DatasetRequest& request) {
  if (request.size_override > 0) throw ConfigError("has a length, not a size: use --length");
  if (request.length_override > 0) options.length = request.length_override;
  return options;
}

}  // namespace stillpoint
