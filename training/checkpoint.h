// Training checkpoints: everything needed to continue a run exactly.
//
// A checkpoint holds the model parameters, the optimizer state, the step,
// the data position, the RNG state and the resolved config. It is one file:
//
//   "STILLCKP"  magic (8 bytes)
//   uint32      format version (= 2; version 1 files, without the solver
//               state record, are still read)
//   uint64      total length of the file in bytes
//   uint32      metadata length M, then M bytes of YAML (step, data position,
//               rng state, the dropout layers' random streams, config)
//   record      model parameters (framework/serialize.h tensor record)
//   record      optimizer state (same format)
//   record      solver state (version 2): warm-start tensors, e.g. the
//               previous adjoint solution of backward.warm_start
//   uint64      FNV-1a checksum over every byte before it
//
// Files are written atomically (temporary file, fsync, rename), so a crash or
// a kill during a save never leaves a broken checkpoint and never destroys
// the previous one. Loading verifies length and checksum before trusting
// anything; a truncated or corrupted file is an Error that says which.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "framework/module.h"

namespace stillpoint {

inline constexpr uint32_t kCheckpointFormatVersion = 2;

struct CheckpointState {
  int64_t step = 0;
  int64_t data_epoch = 0;
  int64_t data_offset = 0;
  std::string rng_state;    // Rng::SaveState()
  std::string config_yaml;  // the resolved config of the run
  NamedTensors model;
  NamedTensors optimizer;
  NamedTensors solver_state;  // empty in version 1 files
  // Named random streams besides rng_state (the dropout layers' masks), as
  // Rng::SaveState text; empty in files written before they were kept.
  std::map<std::string, std::string> random_streams;
};

std::string SerializeCheckpoint(const CheckpointState& state);
CheckpointState DeserializeCheckpoint(const std::string& bytes, const std::string& source);

void SaveCheckpoint(const std::string& path, const CheckpointState& state);
CheckpointState LoadCheckpoint(const std::string& path);

}  // namespace stillpoint
