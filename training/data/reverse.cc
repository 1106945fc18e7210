// reverse: y_t = x_{T-1-t}.
#include "training/data/sequence_task.h"
#include "training/data/task_list.h"

namespace stillpoint {

TaskDefinition ReverseTask() {
  SequenceRule rule;
  rule.draw = [](Rng& rng, int64_t T, int64_t V, Example& ex) {
    for (int64_t t = 0; t < T; ++t) ex.tokens[t] = rng.UniformInt(V);
    for (int64_t t = 0; t < T; ++t) ex.targets[t] = ex.tokens[T - 1 - t];
  };
  return DefineSequenceTask("the input reversed: y_t = x_{T-1-t}", rule);
}

}  // namespace stillpoint
