// associative_recall: T/2 - 1 (key, value) pairs of distinct keys from the
// lower half of the vocabulary and values from the upper half, then a query
// token (one of the keys) and a blank; only the last position has a target:
// the query's value.
#include <numeric>
#include <utility>

#include "training/data/sequence_task.h"
#include "training/data/task_list.h"

namespace stillpoint {

TaskDefinition AssociativeRecallTask() {
  SequenceRule rule;
  rule.check = [](int64_t length, int64_t vocab_size) -> std::string {
    if (length < 4 || length % 2 != 0) return "needs an even task.length >= 4";
    if (vocab_size / 2 - 1 < length / 2 - 1) {
      return "needs task.vocab_size >= 2 * (task.length / 2 - 1) + 2 for distinct keys";
    }
    return "";
  };
  rule.draw = [](Rng& rng, int64_t T, int64_t V, Example& ex) {
    const int64_t pairs = T / 2 - 1, half = V / 2, blank = V - 1;
    // Distinct keys from [0, half - 1), values from [half, V - 1).
    std::vector<int64_t> keys(half - 1);
    std::iota(keys.begin(), keys.end(), 0);
    for (int64_t i = 0; i < pairs; ++i) {
      std::swap(keys[i], keys[i + rng.UniformInt(static_cast<int64_t>(keys.size()) - i)]);
    }
    std::vector<int64_t> values(pairs);
    for (int64_t i = 0; i < pairs; ++i) {
      values[i] = half + rng.UniformInt(V - 1 - half);
      ex.tokens[2 * i] = keys[i];
      ex.tokens[2 * i + 1] = values[i];
    }
    const int64_t query = rng.UniformInt(pairs);
    ex.tokens[T - 2] = keys[query];
    ex.tokens[T - 1] = blank;
    ex.targets[T - 1] = values[query];
  };
  return DefineSequenceTask(
      "(key, value) pairs, then a query key: the last position's target is its value", rule);
}

}  // namespace stillpoint
