// Data-parallel training steps on one machine.
//
// A step's batch is cut into shards of whole rows (ShardRows). Each shard
// runs its forward pass, loss and backward pass on its own replica of the
// model: a module of the same structure whose parameters share the model's
// storage, so an optimizer step on the model's parameters updates every
// replica too. The shards run as the tasks of one ParallelFor, and the ops
// inside a task run on that task's thread: the threads meet once per step
// instead of at every op. On small models, whose ops are too short to split
// well over threads, that is most of what a second core can give (W1 of
// bench/SPEC.md; figures in bench/RESULTS.md).
//
// The training step (training/train_step.h) runs its shards through this:
//
//   DataParallel step(model, 2, [&] { return std::make_shared<SequenceModel>(options); });
//   optimizer->ZeroGrad();
//   const double loss = step.Backward(batch_rows, [&](Module& replica, ShardRange rows) {
//     auto& m = static_cast<SequenceModel&>(replica);
//     return mul_scalar(cross_entropy(m.Forward(ids of rows, ...), targets of rows),
//                       double(rows.size()) / double(batch_rows));
//   });
//   optimizer->Step();
//
// Results do not depend on the thread count: a shard computes the same
// values on any thread, and the shards' gradients are added in shard order.
// They do depend on the number of shards, because sums over the batch (the
// mean loss, a weight gradient X^T G) are then formed shard by shard: one
// shard gives exactly what a plain backward() gives, two shards agree with
// it to rounding.
//
// State that a module keeps about its last forward pass (an implicit
// layer's solver summaries, dropout masks) is per replica: the model's own
// describes shard 0. Each replica draws from its own generators, so a model
// with dropout draws different masks with shards > 1 than without.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "framework/autograd.h"
#include "framework/module.h"

namespace stillpoint {

// Rows [begin, end) of a batch: those of shard `shard` (its index among all
// the shards of the batch, those of other processes included).
struct ShardRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t shard = 0;
  int64_t size() const { return end - begin; }
};

// The rows of shard `shard` when `rows` rows are cut into `shards`
// contiguous shards in order, the first rows % shards of them one row
// longer. Throws unless 1 <= shards <= rows and 0 <= shard < shards.
ShardRange ShardRows(int64_t rows, int64_t shards, int64_t shard);

// out[j] = element begin + j of the sum of terms (two or more, of dtype
// T), added in their order, ((t0 + t1) + t2) ...: the one place the order
// of the shards' gradient sum is written (Backward, and the reduction
// across processes in training/gradient_reducer.h, give the same bits).
template <typename T>
void AddGradientTerms(std::span<const Tensor> terms, int64_t begin, int64_t end, T* out) {
  const int64_t n = end - begin;
  const T* first = terms[0].data<T>() + begin;
  const T* second = terms[1].data<T>() + begin;
  for (int64_t j = 0; j < n; ++j) out[j] = first[j] + second[j];
  for (std::size_t t = 2; t < terms.size(); ++t) {
    const T* more = terms[t].data<T>() + begin;
    for (int64_t j = 0; j < n; ++j) out[j] += more[j];
  }
}

// Sums the shards' gradients with those of the shards that other processes
// run (training/gradient_reducer.h), in place of DataParallel's own sum.
class ShardGradientReduction {
 public:
  virtual ~ShardGradientReduction() = default;
  // Before the shards of a step run.
  virtual void Begin() = 0;
  // On the thread of local shard `shard`'s backward pass: its gradient of
  // the model's parameter `parameter` (index into parameters()) is final.
  virtual void Ready(int64_t shard, std::size_t parameter, const Tensor& gradient) = 0;
  // After every local shard has finished (or one failed: `failed`): sets
  // the gradient of each of `parameters` (the model's) to the sum over all
  // shards of all processes, in shard order, as DataParallel sums its own.
  // Called on every process whether or not its shards failed, so that the
  // processes' exchanges stay matched; after a failure the sums are not set.
  virtual void Finish(const VarList& parameters, bool failed) = 0;
};

class DataParallel {
 public:
  using ReplicaFactory = std::function<std::shared_ptr<Module>()>;
  // The loss of one shard: the shard's share of the batch loss, a scalar
  // Var recorded on the replica's parameters (the shares add up to the
  // batch loss, e.g. a shard's mean scaled by its fraction of the rows).
  using ShardLoss = std::function<Var(Module& replica, ShardRange rows)>;

  // model: the module whose parameters the optimizer updates; shard 0 runs
  // on it. shards >= 1. make_replica builds a module of the same structure
  // (the same parameter names, shapes and dtypes: the error names the first
  // difference) and is called shards - 1 times, here; the replicas'
  // parameters are then pointed at the model's storage. As an optimizer
  // does, it takes the modules' parameter lists here: parameters
  // registered later are not summed.
  DataParallel(std::shared_ptr<Module> model, int64_t shards, const ReplicaFactory& make_replica);

  int64_t shards() const { return static_cast<int64_t>(replicas_.size()); }
  // Where this process's shards sit among all the shards of a batch: local
  // shard s is shard first_shard() + s of total_shards() (0 and shards()
  // unless set_layout, for a job of several processes; training/
  // distributed.h). ShardRange::shard is that global index.
  int64_t first_shard() const { return first_shard_; }
  int64_t total_shards() const { return total_shards_; }
  void set_layout(int64_t first_shard, int64_t total_shards);
  // Replaces the sum of the shards' gradients in Backward (nullptr: the
  // local sum); not owned.
  void set_reduction(ShardGradientReduction* reduction);
  // Each local shard's loss value in the last Backward.
  const std::vector<double>& shard_losses() const { return losses_; }
  // The module that runs shard s (shard 0: the model).
  Module& replica(int64_t shard) const;

  // For every shard, in parallel: loss = shard_loss(replica, rows of the
  // shard), then its backward pass. The model's parameters then hold, added
  // to the gradients they held before (as backward() accumulates), the sum
  // of the shards' gradients in shard order; the replicas' own gradients are
  // cleared. Returns the sum of the shards' loss values, in shard order.
  // Throws if rows < shards or a loss is not a scalar; an exception thrown
  // by a shard reaches the caller, and the model's gradients are then left
  // as they were.
  double Backward(int64_t rows, const ShardLoss& shard_loss);

 private:
  // The shards' losses summed in shard order, after each shard's forward
  // and backward pass (their gradients left where backward() put them).
  double RunShards(int64_t rows, const ShardLoss& shard_loss);
  // Per model parameter, the gradients its shards hold, in shard order.
  std::vector<std::vector<Tensor>> ShardGradientTerms() const;
  // Sets each of the model's parameters' gradients to the sum of its
  // shards' (in shard order) and clears the replicas'.
  void SumShardGradients();
  void ClearReplicaGradients(int64_t shard);

  std::vector<std::shared_ptr<Module>> replicas_;
  // Each shard's parameters, listed once at construction (walking a
  // module's tree at every step is a noticeable part of a small model's
  // step): parameters_[s][i] is the replica's copy of the model's i-th.
  std::vector<VarList> parameters_;
  int64_t first_shard_ = 0;
  int64_t total_shards_ = 0;
  ShardGradientReduction* reduction_ = nullptr;
  // Per shard, its parameters' graph nodes to their index (for Ready).
  std::vector<std::unordered_map<const void*, std::size_t>> parameter_index_;
  std::vector<double> losses_;
};

}  // namespace stillpoint
