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
#include <memory>

#include "training/data/task.h"
#include "training/data/dataset.h"

namespace stillpoint {

struct PrefixSumSettings {
  int64_t length = 16;  // digits per sequence (the start symbol not counted)
  int64_t modulus = 2;
  bool start_token = true;
};

// `examples` sequences from `seed`: digits uniform in [0, modulus), targets
// their running sums modulo `modulus`.
std::unique_ptr<InMemoryDataset> DrawPrefixSums(const PrefixSumSettings& settings,
                                                int64_t examples, uint64_t seed);

// What a sequence of `settings` costs the memory estimate: its tokens and
// its vocabulary (the start symbol included), named by `keys`.
TaskFootprint PrefixSumFootprint(const PrefixSumSettings& settings,
                                 std::vector<std::string> keys);

}  // namespace stillpoint
