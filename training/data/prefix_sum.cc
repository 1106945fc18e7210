// prefix_sum: x_t uniform in [0, m); y_t = (x_0 + ... + x_t) mod m, m =
// task.modulus. With m = 2 it is prefix_parity, draw for draw. Bansal et
// al. (2022) train recurrent networks on prefix sums of one length and
// solve longer ones by iterating longer.
#include "training/data/prefix_sum.h"

#include "training/data/dataset.h"
#include "training/data/sequence_task.h"
#include "training/data/task_list.h"

namespace stillpoint {
namespace {

// The task.* keys; kModulusKey: whether task.modulus is one of them (else
// the modulus is the task's own, set by DefinePrefixSumTask).
template <bool kModulusKey>
struct PrefixSumOptions {
  int64_t length = 16;
  int64_t modulus = 2;
  bool start_token = true;
  int64_t train_examples = 4096;
  int64_t test_examples = 512;

  static const OptionFields<PrefixSumOptions>& Fields() {
    using O = PrefixSumOptions;
    static const auto* fields = [] {
      auto* f = new OptionFields<O>;
      f->Int("length", &O::length, 2, 4096,
             "Digits per training sequence (after the start symbol with task.start_token)");
      if (kModulusKey) {
        f->Int("modulus", &O::modulus, 2, 1 << 16,
               "The modulus m of the running sums (the symbols of inputs and targets; 2 is "
               "parity)");
      }
      f->Bool("start_token", &O::start_token,
              "prefix_sum and prefix_parity: open every sequence with a start symbol (its "
              "target ignored) before its task.length digits, so that models with relative "
              "or no positions can tell the first tokens apart");
      ExampleCountFields(*f);
      return f;
    }();
    return *fields;
  }
};

// `examples` sequences from `seed`: the start symbol (the id `modulus`, no
// target) when asked for, then digits uniform in [0, modulus) with their
// running sums modulo `modulus` as targets.
std::unique_ptr<InMemoryDataset> DrawPrefixSums(int64_t length, int64_t modulus, bool start_token,
                                                int64_t examples, uint64_t seed) {
  const int64_t offset = start_token ? 1 : 0;
  DatasetInfo info;
  info.length = length + offset;
  info.vocab_size = modulus + offset;
  info.num_classes = modulus;
  Rng rng(seed);
  std::vector<Example> data(examples);
  for (Example& example : data) {
    example.tokens.resize(info.length);
    example.targets.resize(info.length);
    if (start_token) {
      example.tokens[0] = modulus;
      example.targets[0] = kIgnoreTarget;
    }
    int64_t sum = 0;
    for (int64_t t = offset; t < info.length; ++t) {
      example.tokens[t] = rng.UniformInt(modulus);
      sum = (sum + example.tokens[t]) % modulus;
      example.targets[t] = sum;
    }
  }
  return std::make_unique<InMemoryDataset>(info, std::move(data));
}

template <bool kModulusKey>
TaskDefinition DefineTask(std::string doc, int64_t fixed_modulus) {
  using O = PrefixSumOptions<kModulusKey>;
  const auto modulus = [fixed_modulus](const O& o) {
    return kModulusKey ? o.modulus : fixed_modulus;
  };
  return DefineSyntheticTask<O>(
      std::move(doc),
      [modulus](const O& o, int64_t examples, uint64_t seed) {
        return DrawPrefixSums(o.length, modulus(o), o.start_token, examples, seed);
      },
      [](O o, const DatasetRequest& request) { return WithTestLength(o, request); },
      [modulus](const O& o) {
        const int64_t offset = o.start_token ? 1 : 0;
        std::vector<std::string> keys = {"task.length", "task.start_token"};
        if (kModulusKey) keys.insert(keys.begin() + 1, "task.modulus");
        return TaskFootprint{.length = o.length + offset,
                             .vocab_size = modulus(o) + offset,
                             .keys = std::move(keys)};
      });
}

}  // namespace

TaskDefinition DefinePrefixSumTask(std::string doc, int64_t fixed_modulus) {
  return fixed_modulus == 0 ? DefineTask<true>(std::move(doc), 0)
                            : DefineTask<false>(std::move(doc), fixed_modulus);
}

TaskDefinition PrefixSumTask() {
  return DefinePrefixSumTask(
      "digits in [0, task.modulus), y_t = (x_0 + ... + x_t) mod task.modulus", 0);
}

}  // namespace stillpoint
