// The built-in tasks, one line each. Everything that names them is made
// from this list, so a task is its own file plus one line here:
//   - the names task.kind accepts, with did-you-mean, in the registry
//     (DatasetRegistry(), training/data/dataset_registry.cc) and through it the
//     schema's task.kind, docs/config.md and the CLI's `config --doc`,
//     `config --json-schema` and the Python module's sequence_task;
//   - the task.* keys, from each task's Options (the schema merges keys that
//     several tasks share and says which tasks read each);
//   - the memory estimate's view of an example (TaskFootprint).
//
// SP_TASKS(X) calls X(Name, "name") per task:
//   Name    the task's definition is `TaskDefinition NameTask()`, defined in
//           its own file under training/data/ (see training/data/task.h)
//   "name"  its spelling in task.kind
//
// The first task is task.kind's default. tests/training/task_list_test.cc
// fails when another file copies the names by hand.
#pragma once

#include "training/data/task.h"

#define SP_TASKS(X)                               \
  X(Reverse, "reverse")                           \
  X(Sort, "sort")                                 \
  X(Copy, "copy")                                 \
  X(PrefixParity, "prefix_parity")                \
  X(AssociativeRecall, "associative_recall")      \
  X(Digits, "digits")                             \
  X(FashionMnist, "fashion_mnist")                \
  X(Text, "text")                                 \
  X(Csv, "csv")                                   \
  X(PrefixSum, "prefix_sum")                      \
  X(Maze, "maze")

namespace stillpoint {

#define SP_DECLARE_TASK(Name, name) TaskDefinition Name##Task();
SP_TASKS(SP_DECLARE_TASK)
#undef SP_DECLARE_TASK

}  // namespace stillpoint
