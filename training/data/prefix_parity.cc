// prefix_parity: x_t in {0, 1}; y_t = (x_0 + ... + x_t) mod 2. The same
// data as prefix_sum with task.modulus 2.
#include "training/data/sequence_task.h"
#include "training/data/task_list.h"

namespace stillpoint {

TaskDefinition PrefixParityTask() {
  SequenceRule rule;
  rule.symbols = [](int64_t) -> int64_t { return 2; };
  rule.draw = [](Rng& rng, int64_t T, int64_t, Example& ex) {
    int64_t parity = 0;
    for (int64_t t = 0; t < T; ++t) {
      ex.tokens[t] = rng.UniformInt(2);
      parity ^= ex.tokens[t];
      ex.targets[t] = parity;
    }
  };
  return DefineSequenceTask(
      "random bits, y_t = x_0 xor ... xor x_t, whatever task.vocab_size",
      rule);
}

}  // namespace stillpoint
