// copy: the first half random symbols, the second half a blank symbol;
// y_t = x_{t - T/2} on the second half, ignored on the first.
#include "training/data/sequence_task.h"
#include "training/data/task_list.h"

namespace stillpoint {

TaskDefinition CopyTask() {
  SequenceRule rule;
  rule.check = [](int64_t, int64_t vocab_size) -> std::string {
    return vocab_size < 3 ? "needs task.vocab_size >= 3 (one symbol is the blank)" : "";
  };
  rule.draw = [](Rng& rng, int64_t T, int64_t V, Example& ex) {
    const int64_t blank = V - 1, half = T / 2;
    for (int64_t t = 0; t < T; ++t) ex.tokens[t] = t < half ? rng.UniformInt(V - 1) : blank;
    for (int64_t t = half; t < T; ++t) {
      ex.targets[t] = t - half < half ? ex.tokens[t - half] : kIgnoreTarget;
    }
  };
  return DefineSequenceTask(
      "the first half's symbols, to be repeated on the second half (blanks), which alone has "
      "targets",
      rule);
}

}  // namespace stillpoint
