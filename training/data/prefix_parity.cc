// prefix_parity: x_t in {0, 1}; y_t = (x_0 + ... + x_t) mod 2. The same
// data as prefix_sum with task.modulus 2, draw for draw (prefix_sum.h).
#include "training/data/prefix_sum.h"
#include "training/data/task_list.h"

namespace stillpoint {

TaskDefinition PrefixParityTask() {
  return DefinePrefixSumTask(
      "random bits, y_t = x_0 xor ... xor x_t (prefix_sum with task.modulus 2)", 2);
}

}  // namespace stillpoint
