// What training does differently when a job has several ranks (training/
// distributed.h): which shards of each batch a rank runs, the values the
// ranks agree on after every step, and the per-shard state a checkpoint
// keeps, named by global shard so that it does not depend on the rank count.
//
// A job of P ranks with train.shards = S cuts every batch into P x S shards
// (ShardRows); rank r runs shards r*S .. r*S + S - 1 on S threads' worth of
// replicas. Every rank draws the same batches from the shared seed and
// keeps the same parameters (the summed gradients are the same bits on
// every rank, training/gradient_reducer.h), so only gradients and a few
// numbers per step cross the network, never data.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "layers/models.h"
#include "training/checkpoint.h"
#include "training/config/config.h"
#include "training/solver_stats.h"

namespace stillpoint {

// This rank's shards among all the shards of a batch.
struct RankShards {
  int64_t first = 0;  // global index of this rank's first shard
  int64_t count = 1;  // shards this rank runs (train.shards)
  int64_t total = 1;  // shards of the job (ranks x train.shards)
};
RankShards RankShardsOf(int64_t shards_per_rank);

// What every rank knows after a step's shards have run.
struct StepTotals {
  double loss = 0;  // every shard's loss, added in shard order
  int64_t correct = 0;
  int64_t counted = 0;
  SolverStats forward;   // merged over the ranks in rank order
  SolverStats backward;
  // The lowest rank with a non-finite shard loss, or -1.
  int nonfinite_rank = -1;
};

// Collective, once per step on every rank after its shards ran (or failed:
// `failure` non-empty). Throws RankFailure on every rank if any rank
// failed. Also spreads a stop request (SIGINT, SIGTERM; training/signals.h)
// that reached any rank to all of them, so every rank stops after the same
// step.
//
// For testing the fault handling, the environment variable STILLPOINT_FAULT
// = "RANK:STEP:KIND" makes rank RANK fail at step STEP (counted from 1) in
// the way KIND says: "error" (an exception in the step), "nonfinite" (a NaN
// loss) or "kill" (SIGKILL, as a crashed or killed process). Unset, nothing
// happens; it is read once.
StepTotals ExchangeStepTotals(int64_t step, const std::string& failure,
                              const std::vector<double>& shard_losses,
                              std::pair<int64_t, int64_t> correct_counted,
                              const SolverStats& forward, const SolverStats& backward);

// The stop request (training/signals.h) the ranks agreed on at the last
// ExchangeStepTotals; StopRequested() itself in a job of one rank. A signal
// reaches the ranks at different moments: deciding on the agreed value
// makes every rank stop after the same step.
int AgreedStopRequest();

// Runs `work` (the run directory's lock and checks) on rank 0 alone, then
// shares its outcome: a ConfigError (bad input) it threw is thrown on every
// rank with the same message, and an Error as an Error. Collective.
void OnMainRank(const std::function<void()>& work);

// The checkpoint's per-shard state (adjoint warm starts, dropout streams)
// of every rank, named by global shard index: `models` are this rank's
// shard replicas in order (local shard s is global shard first + s).
// Collective. One rank: the same as WarmStartState / RandomStreamState.
void GatherShardState(const std::vector<SequenceModel*>& models, int64_t first,
                      NamedTensors* solver_state, std::map<std::string, std::string>* streams);
// The part of a checkpoint's per-shard state that belongs to this rank's
// shards [first, first + count), renamed to local indices 0 .. count - 1
// (the outputs may be the inputs).
void SelectShardState(const NamedTensors& solver_state,
                      const std::map<std::string, std::string>& streams, int64_t first,
                      int64_t count, NamedTensors* local_solver_state,
                      std::map<std::string, std::string>* local_streams);

// The config a checkpoint stores: train.shards is the job's total shard
// count, what decides the trajectory, so a checkpoint of `mpirun -np 2 ...
// train.shards=1` is the checkpoint of `train.shards=2` and either resumes
// the other.
Config CheckpointConfig(const Config& config, const RankShards& shards);

}  // namespace stillpoint
