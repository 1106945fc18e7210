// A lower bound of the memory a run needs, from its config alone, checked
// before anything is allocated: a config that cannot fit the machine is a
// ConfigError (exit code 2) giving the figure and the keys that drive it,
// instead of std::bad_alloc (or the kernel's OOM killer) halfway through
// building the model.
//
// The bound counts only what the run cannot do without: the cells' weight
// matrices (4 dim^2 for the attention projections, 2 dim hidden for the
// feed-forward block, per untied cell), the token embedding and the
// position table; their gradients and the optimizer's moments (two for
// adam/adamw, one for sgd with momentum); the activations a training step
// keeps for its backward pass (dim and hidden wide per token, per unrolled
// or explicit layer; one layer for an implicit model); and the forward
// solver's history (anderson or broyden: 2 m states of the batch); and the
// generated datasets of a synthetic sequence task (task.train_examples and
// task.test_examples sequences of task.length tokens and targets). Biases,
// layer norms, the head, attention scores and temporaries are left out, so
// a config the check refuses cannot fit, and one it passes may still not.
#pragma once

#include <cstdint>
#include <string>

#include "training/config/config.h"

namespace stillpoint {

struct MemoryEstimate {
  double parameters = 0;  // bytes
  double gradients = 0;
  double optimizer_state = 0;
  double activations = 0;
  double solver_history = 0;
  double dataset = 0;  // generated sequence tasks; data files are capped by task.max_file_mib

  double total() const {
    return parameters + gradients + optimizer_state + activations + solver_history + dataset;
  }
  // "parameters 256.0 GiB, gradients 256.0 GiB, ..."
  std::string Breakdown() const;
};

// training: a training run (gradients, optimizer state and a backward
// pass's activations) or an evaluation (parameters and one forward's
// activations, no solver history beyond the forward solve's).
MemoryEstimate EstimateMemory(const Config& config, bool training);

// The machine's physical memory in bytes (0 if unknown).
double PhysicalMemoryBytes();

// Throws ConfigError when EstimateMemory exceeds `available_bytes` (the
// machine's physical memory when 0), naming the figure, the machine's memory
// and the keys that drive the estimate with their values.
void CheckMemoryFits(const Config& config, bool training, double available_bytes = 0);

// Bytes as text: "512 B", "3.2 MiB", "1.5 GiB", "2.0 TiB".
std::string FormatBytes(double bytes);

}  // namespace stillpoint
