// `stillpoint bench` under mpirun (training/distributed.h).
//
// Training workloads: any workload whose steps run through a TrainStep
// hands it to RankBench::Attach; the step then runs this rank's shards of
// the job's (ranks x --shards) and sums the gradients across ranks with a
// GradientReducer, and RankBench reports, beside the workload's own figures,
// the time the reduction took (communication thread, waiting for the other
// ranks included), the part of it the caller waited for after its backward
// pass (exposed), and the overlap 1 - exposed / communication. --no-overlap
// reduces after the whole backward pass instead: the reference the overlap
// is measured against. One rank: nothing changes and nothing is printed.
//
// `stillpoint bench allreduce`: the reduction alone (RunReduceBench): for
// message sizes from 8 bytes to 64 MiB, the median time of the fixed-order
// sum of one float32 gradient per rank (the trainer's reduction), half the
// time of a round trip between ranks 0 and 1 (one-way), and the bandwidths
// they imply.
#pragma once

#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "training/train_step.h"
#include "training/gradient_reducer.h"

namespace stillpoint {

class RankBench {
 public:
  explicit RankBench(const GradientReducerOptions& options);
  ~RankBench();

  // Whether this is a job of several ranks.
  bool active() const;
  // Makes the `shards` shards of step this rank's share of the job's shards,
  // with a GradientReducer over `parameters` (the model's) and the
  // trainer's exchange of the step's totals (training/
  // distributed_training.h), so the step is the one `stillpoint train`
  // runs under mpirun. Throws Error when the batch of `rows` rows has fewer
  // rows than the job has shards. Nothing with one rank.
  void Attach(TrainStep& step, int64_t shards, const VarList& parameters, int64_t rows);
  // After each timed step: keeps the reduction's times.
  void Record();

  // " ranks 2 (overlap on, 3 buckets, 0.15 MiB): allreduce median ... ms"
  // lines and JSON fields (", \"ranks\": 2, ..."); empty with one rank.
  void PrintText(std::ostream& out) const;
  void PrintJsonFields(std::ostream& out) const;

 private:
  GradientReducerOptions options_;
  std::unique_ptr<GradientReducer> reducer_;
  int64_t steps_ = 0;  // steps run, for ExchangeStepTotals
  std::vector<double> communication_, exposed_, overlap_;
};

// `stillpoint bench allreduce`: see the top. `steps` timed repetitions per
// size after `warmup`; prints a table (or one JSON object per size).
void RunReduceBench(int64_t steps, int64_t warmup, bool json, std::ostream& out);

}  // namespace stillpoint
