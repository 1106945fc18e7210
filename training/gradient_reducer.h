// Sums data-parallel gradients across the ranks of a job (training/
// distributed.h) in a fixed order, overlapped with the backward pass.
//
// The sum is the one a single process forms over the same shards: for each
// gradient element, ((g0 + g1) + g2) + ... in global shard order (the order
// AddGradientTerms writes down). So a job of P ranks with S shards each
// trains bitwise as one process with P x S shards. An MPI_Allreduce cannot
// promise that (its reduction tree, and so its rounding, depends on the rank
// count and the library), so the sum travels along the ranks instead: rank 0
// adds its shards' terms, sends the partial sums to rank 1, which adds its
// own in order and sends them on, ...; the last rank then broadcasts the
// sums (without waiting: the next bucket's chain starts while the broadcast
// travels). Each rank sends and receives each gradient element about twice
// (once in the chain, once in the broadcast), as a ring allreduce does; the
// latency grows with the rank count (docs/scale.md has the model).
//
// Overlap: the parameters are cut into buckets of about bucket_bytes, the
// last parameters first (a backward pass finishes them first). A bucket is
// reduced, on a communication thread, as soon as every local shard's
// backward pass has finished each of its parameters, while the backward
// pass of the parameters before it still runs (as PyTorch's
// DistributedDataParallel does). Buckets go through the chain in bucket
// order on every rank, so the order of the additions never changes; with
// overlap off every bucket waits for the end of the backward pass (the
// reference the overlap is measured against in `stillpoint bench`).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "training/data_parallel.h"

namespace stillpoint {

struct GradientReducerOptions {
  // Bytes of gradient per bucket (at least one parameter per bucket). 1 MiB
  // keeps the per-message latency small beside the transfer on loopback and
  // on cluster networks, while W1's model still splits into a few buckets.
  int64_t bucket_bytes = 1 << 20;
  // Reduce each bucket as soon as it is ready (true), or all of them after
  // the whole backward pass (false).
  bool overlap = true;
};

// Where the last step's reduction spent its time.
struct GradientReductionTimes {
  // Wall time the communication thread spent on the buckets (receive, add,
  // send, broadcast), waiting for the other ranks included.
  double communication_seconds = 0;
  // Wall time the caller waited in Finish after its backward pass: the part
  // of the reduction not hidden behind the backward pass.
  double exposed_seconds = 0;
  int64_t buckets = 0;
  int64_t bytes = 0;  // gradient bytes each rank reduced
};

class GradientReducer : public ShardGradientReduction {
 public:
  // parameters: the model's (DataParallel's order); local_shards: how many
  // shards this rank runs (each calls Ready for each parameter it reaches).
  GradientReducer(const VarList& parameters, int64_t local_shards,
                  const GradientReducerOptions& options = {});
  ~GradientReducer() override;
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  void Begin() override;
  void Ready(int64_t shard, std::size_t parameter, const Tensor& gradient) override;
  // Waits for every bucket, then gives each parameter that any shard of any
  // rank had a gradient for the sum of those gradients (a new tensor).
  // Rethrows an error of the communication thread.
  void Finish(const VarList& parameters, bool failed) override;

  const GradientReductionTimes& last_times() const { return times_; }
  int64_t buckets() const { return static_cast<int64_t>(buckets_.size()); }

 private:
  struct Bucket {
    std::vector<std::size_t> parameters;  // in the order their bytes are laid out
    std::vector<int64_t> offsets;         // byte offset of each in the data
    int64_t data_bytes = 0;
    std::vector<char> buffer;  // one flag byte per parameter, then the data
  };
  void Run();
  void Reduce(Bucket& bucket, int tag);

  GradientReducerOptions options_;
  int64_t local_shards_;
  std::vector<Shape> shapes_;
  std::vector<DType> dtypes_;
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> bucket_of_;  // per parameter

  std::mutex mutex_;
  std::condition_variable changed_;
  // Per step, guarded by mutex_: each parameter's terms by local shard.
  std::vector<std::vector<Tensor>> terms_;
  std::vector<int64_t> missing_;  // per bucket: Ready calls still to come
  std::vector<char> ready_;       // per bucket
  bool active_ = false;     // a step is between Begin and Finish
  bool finishing_ = false;  // the backward passes are over: every bucket may go
  bool done_ = false;       // the communication thread has reduced every bucket
  bool stop_ = false;
  std::exception_ptr error_;
  double communication_seconds_ = 0;
  GradientReductionTimes times_;
  std::thread thread_;
};

}  // namespace stillpoint
