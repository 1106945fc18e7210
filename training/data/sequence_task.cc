#include "training/data/sequence_task.h"

namespace stillpoint {

const OptionFields<SequenceTaskOptions>& SequenceTaskOptions::Fields() {
  using O = SequenceTaskOptions;
  static const auto* fields = &ExampleCountFields(
      (new OptionFields<O>)
          ->Int("length", &O::length, 2, 4096, "Tokens per training sequence")
          .Int("vocab_size", &O::vocab_size, 2, 1 << 20, "Symbols of the sequences"));
  return *fields;
}

std::unique_ptr<InMemoryDataset> DrawSequences(const SequenceRule& rule, int64_t length,
                                               int64_t vocab_size, int64_t examples,
                                               uint64_t seed) {
  const std::string error = rule.check ? rule.check(length, vocab_size) : "";
  if (!error.empty()) throw ConfigError(error);
  DatasetInfo info;
  info.length = length;
  info.vocab_size = vocab_size;
  info.num_classes = vocab_size;
  info.per_token_targets = true;
  Rng rng(seed);
  std::vector<Example> data(examples);
  for (Example& example : data) {
    example.tokens.assign(length, 0);
    example.targets.assign(length, kIgnoreTarget);
    rule.draw(rng, length, vocab_size, example);
  }
  return std::make_unique<InMemoryDataset>(info, std::move(data));
}

TaskDefinition DefineSequenceTask(std::string doc, const SequenceRule& rule) {
  using O = SequenceTaskOptions;
  return DefineSyntheticTask<O>(
      std::move(doc),
      [rule](const O& o, int64_t examples, uint64_t seed) {
        return DrawSequences(rule, o.length, o.vocab_size, examples, seed);
      },
      [](O o, const DatasetRequest& request) { return WithTestLength(o, request); },
      [](const O& o) {
        return TaskFootprint{
            .length = o.length,
            .vocab_size = o.vocab_size,
            .keys = {"task.length", "task.vocab_size"}};
      });
}

}  // namespace stillpoint
