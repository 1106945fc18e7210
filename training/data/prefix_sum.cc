// prefix_sum: x_t uniform in [0, m); y_t = (x_0 + ... + x_t) mod m, m =
// task.modulus. With m = 2 it is prefix_parity, draw for draw. Bansal et
// al. (2022) train recurrent networks on prefix sums of one length and
// solve longer ones by iterating longer.
#include "training/data/sequence_task.h"
#include "training/data/task_list.h"

namespace stillpoint {
namespace {

struct PrefixSumOptions {
  int64_t length = 16;
  int64_t modulus = 2;
  int64_t train_examples = 4096;
  int64_t test_examples = 512;

  static const OptionFields<PrefixSumOptions>& Fields() {
    using O = PrefixSumOptions;
    static const auto* fields =
        &(new OptionFields<O>)
             ->Int("length", &O::length, 2, 4096, "Tokens per training sequence")
             .Int("modulus", &O::modulus, 2, 1 << 16,
                  "The modulus m of the running sums (the symbols of inputs and targets; 2 is "
                  "parity)")
             .Int("train_examples", &O::train_examples, 1, 1 << 24, "Training sequences generated")
             .Int("test_examples", &O::test_examples, 1, 1 << 24,
                  "Held-out sequences generated with another seed");
    return *fields;
  }
};

std::unique_ptr<InMemoryDataset> DrawPrefixSums(const PrefixSumOptions& o, int64_t examples,
                                                uint64_t seed) {
  const int64_t m = o.modulus;
  DatasetInfo info;
  info.length = o.length;
  info.vocab_size = info.num_classes = m;
  Rng rng(seed);
  std::vector<Example> data(examples);
  for (Example& example : data) {
    example.tokens.resize(o.length);
    example.targets.resize(o.length);
    int64_t sum = 0;
    for (int64_t t = 0; t < o.length; ++t) {
      example.tokens[t] = rng.UniformInt(m);
      sum = (sum + example.tokens[t]) % m;
      example.targets[t] = sum;
    }
  }
  return std::make_unique<InMemoryDataset>(info, std::move(data));
}

}  // namespace

TaskDefinition PrefixSumTask() {
  using O = PrefixSumOptions;
  return DefineSyntheticTask<O>(
      "digits in [0, task.modulus), y_t = (x_0 + ... + x_t) mod task.modulus", DrawPrefixSums,
      [](O o, const DatasetRequest& request) { return WithTestLength(o, request); },
      [](const O& o) { return TaskFootprint{
          .length = o.length, .vocab_size = o.modulus, .keys = {"task.length", "task.modulus"}}; });
}

}  // namespace stillpoint
