// What `stillpoint train --resume` checks and restores beyond the trainer's
// own state: that the checkpoint belongs to the run being continued, and the
// solvers' warm-start state.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "framework/module.h"
#include "layers/models.h"
#include "training/checkpoint.h"
#include "training/config/config.h"

namespace stillpoint {

// Keys a resumed run may change: the step budget and the cadence of
// evaluation, logging and checkpoints (train.steps, train.eval_every,
// train.log_every, train.checkpoint_every, eval.*, log.dir, log.progress,
// log.plots) and compare.* (not read by a training run). Every other key
// shapes the trajectory (seed, model, data, optimizer, solvers, threads).
bool MayChangeOnResume(const std::string& key);

// Loads the checkpoint a resume continues. A checkpoint that cannot be read
// (truncated, corrupted, another format) is a ConfigError: bad input, exit
// code 2, as for `stillpoint eval`. Its stored config is compared with
// `current`; keys that differ and may not change are a ConfigError listing
// each (key: stored value -> current value), unless `force`, when they are
// returned through *forced (one line each) for the caller to print.
CheckpointState LoadCheckpointForResume(const std::string& path,
                                        const Config& current,
                                        bool force,
                                        std::vector<std::string>* forced);

// The warm-start state of the implicit layers of `models` (the model and
// its data-parallel replicas), named "adjoint_warm_start/<index>": the
// previous adjoint solution of model.solver.backward.warm_start. Empty when
// no model keeps one.
NamedTensors WarmStartState(const std::vector<SequenceModel*>& models);
// The random streams of every Dropout of `models` (the model and its
// replicas), named "<index>.<module path>".
std::map<std::string, std::string> RandomStreamState(const std::vector<SequenceModel*>& models);
// Restores them. Returns false (and restores nothing) when `streams` does
// not name every Dropout of the models (a checkpoint written before the
// streams were kept); throws ConfigError naming `source` for a stream that
// does not parse or that no Dropout has a place for.
bool RestoreRandomStreamState(const std::map<std::string, std::string>& streams,
                              const std::vector<SequenceModel*>& models,
                              const std::string& source);
// Restores WarmStartState's tensors into the same models. Throws
// ConfigError naming `source` when the state does not fit them.
void RestoreWarmStartState(const NamedTensors& state,
                           const std::vector<SequenceModel*>& models,
                           const std::string& source);

}  // namespace stillpoint
