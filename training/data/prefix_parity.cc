// prefix_parity: x_t in {0, 1}; y_t = (x_0 + ... + x_t) mod 2. The same
// data as prefix_sum with task.modulus 2, draw for draw (prefix_sum.h).
#include "training/data/prefix_sum.h"
#include "training/data/sequence_task.h"
#include "training/data/task_list.h"

namespace stillpoint {
namespace {

struct PrefixParityOptions {
  int64_t length = 16;
  bool start_token = true;
  int64_t train_examples = 4096;
  int64_t test_examples = 512;

  PrefixSumSettings Settings() const { return {length, 2, start_token}; }

  static const OptionFields<PrefixParityOptions>& Fields() {
    using O = PrefixParityOptions;
    static const auto* fields =
        &(new OptionFields<O>)
             ->Int("length", &O::length, 2, 4096,
                  "Digits per training sequence (after the start symbol with task.start_token)")
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

TaskDefinition PrefixParityTask() {
  using O = PrefixParityOptions;
  return DefineSyntheticTask<O>(
      "random bits, y_t = x_0 xor ... xor x_t (prefix_sum with task.modulus 2)",
      [](const O& o, int64_t examples, uint64_t seed) {
        return DrawPrefixSums(o.Settings(), examples, seed);
      },
      [](O o, const DatasetRequest& request) { return WithTestLength(o, request); },
      [](const O& o) {
        return PrefixSumFootprint(o.Settings(), {"task.length", "task.start_token"});
      });
}

}  // namespace stillpoint
