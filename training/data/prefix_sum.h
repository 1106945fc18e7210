// The running-sum tasks' common part: prefix_sum (digits below task.modulus)
// and prefix_parity (its modulus-2 case, without the key) draw the same
// examples from one generator.
//
// With task.start_token (the default) every sequence opens with a start
// symbol (the id `modulus`, its target ignored) before its task.length
// digits. Without it, a model whose positions are relative (ALiBi, rotary)
// or absent cannot solve the task at all: on an input that opens with a run
// of equal digits, the first tokens look alike to every attention (same
// keys, same values), so their states are equal, while their running sums
// differ. A recurrent reading of the task (each token attends to the one
// before it) needs the sequence's start to be visible, as an RNN's initial
// state is.
#pragma once

#include <cstdint>
#include <string>

#include "training/data/task.h"

namespace stillpoint {

// The running-sum task with the keys task.length, task.start_token,
// task.train_examples and task.test_examples, and task.modulus when
// `fixed_modulus` is 0 (prefix_sum); prefix_parity fixes it at 2 and has no
// such key. `doc` is the task's one line.
TaskDefinition DefinePrefixSumTask(std::string doc, int64_t fixed_modulus);

}  // namespace stillpoint
