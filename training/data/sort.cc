// sort: y = x sorted ascending.
#include <algorithm>

#include "training/data/sequence_task.h"
#include "training/data/task_list.h"

namespace stillpoint {

TaskDefinition SortTask() {
  SequenceRule rule;
  rule.draw = [](Rng& rng, int64_t T, int64_t V, Example& ex) {
    for (int64_t t = 0; t < T; ++t) ex.tokens[t] = rng.UniformInt(V);
    ex.targets = ex.tokens;
    std::sort(ex.targets.begin(), ex.targets.end());
  };
  return DefineSequenceTask("the input sorted ascending", rule);
}

}  // namespace stillpoint
