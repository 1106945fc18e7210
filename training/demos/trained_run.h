// A trained run, loaded for inference by the demos and `stillpoint correct`:
// its stored config, datasets and model with the checkpoint's parameters
// (what `stillpoint eval` loads).
#pragma once

#include <string>

#include "training/config/config.h"
#include "training/experiment.h"

namespace stillpoint {

// run: a run directory (its checkpoint.ckpt) or a .ckpt file. Throws a
// ConfigError (bad input, exit code 2) naming the path when it is missing,
// unreadable or corrupt, or its stored config no longer validates.
Experiment LoadTrainedRun(const std::string& run);

// The batch of examples [0, count) of the held-out set (fewer if it is
// smaller).
Batch FirstTestExamples(const Experiment& experiment, int64_t count);

}  // namespace stillpoint
