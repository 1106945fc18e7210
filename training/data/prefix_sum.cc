// prefix_sum: x_t uniform in [0, m); y_t = (x_0 + ... + x_t) mod m, m =
// task.modulus. With m = 2 it is prefix_parity, draw for draw. Bansal et
// al. (2022) train recurrent networks on prefix sums of one length and
// solve longer ones by iterating longer.
#include "training/data/prefix_sum.h"
#include "training/data/sequence_task.h"
#include "training/data/task_list.h"

namespace stillpoint {

std::unique_ptr<InMemoryDataset> DrawPrefixSums(const PrefixSumSettings& settings,
                                                int64_t examples, uint64_t seed) {
  const int64_t m = settings.modulus;
  const int64_t offset = settings.start_token ? 1 : 0;
  DatasetInfo info;
  info.length = settings.length + offset;
  info.vocab_size = m + offset;
  info.num_classes = m;
  Rng rng(seed);
  std::vector<Example> data(examples);
  for (Example& example : data) {
    example.tokens.resize(info.length);
    example.targets.resize(info.length);
    if (settings.start_token) {
      example.tokens[0] = m;
      example.targets[0] = kIgnoreTarget;
    }
    int64_t sum = 0;
    for (int64_t t = offset; t < info.length; ++t) {
      example.tokens[t] = rng.UniformInt(m);
      sum = (sum + example.tokens[t]) % m;
      example.targets[t] = sum;
    }
  }
  return std::make_unique<InMemoryDataset>(info, std::move(data));
}

TaskFootprint PrefixSumFootprint(const PrefixSumSettings& settings,
                                 std::vector<std::string> keys) {
  const int64_t offset = settings.start_token ? 1 : 0;
  return TaskFootprint{.length = settings.length + offset,
                       .vocab_size = settings.modulus + offset,
                       .keys = std::move(keys)};
}

namespace {

struct PrefixSumOptions {
  int64_t length = 16;
  int64_t modulus = 2;
  bool start_token = true;
  int64_t train_examples = 4096;
  int64_t test_examples = 512;

  PrefixSumSettings Settings() const { return {length, modulus, start_token}; }

  static const OptionFields<PrefixSumOptions>& Fields() {
    using O = PrefixSumOptions;
    static const auto* fields =
        &(new OptionFields<O>)
             ->Int("length", &O::length, 2, 4096,
                  "Digits per training sequence (after the start symbol with task.start_token)")
             .Int("modulus", &O::modulus, 2, 1 << 16,
                  "The modulus m of the running sums (the symbols of inputs and targets; 2 is "
                  "parity)")
             .Bool("start_token", &O::start_token,
                   "prefix_sum and prefix_parity: open every sequence with a start symbol (its "
                   "target ignored) before its task.length digits, so that models with relative "
                   "or no positions can tell the first tokens apart")
             .Int("train_examples", &O::train_examples, 1, 1 << 24, "Training sequences generated")
             .Int("test_examples", &O::test_examples, 1, 1 << 24,
                  "Held-out sequences generated with another seed");
    return *fields;
  }
};

}  // namespace

TaskDefinition PrefixSumTask() {
  using O = PrefixSumOptions;
  return DefineSyntheticTask<O>(
      "digits in [0, task.modulus), y_t = (x_0 + ... + x_t) mod task.modulus",
      [](const O& o, int64_t examples, uint64_t seed) {
        return DrawPrefixSums(o.Settings(), examples, seed);
      },
      [](O o, const DatasetRequest& request) { return WithTestLength(o, request); },
      [](const O& o) {
        return PrefixSumFootprint(o.Settings(),
                                  {"task.length", "task.modulus", "task.start_token"});
      });
}

}  // namespace stillpoint
