#include "training/data_parallel.h"

#include <algorithm>
#include <exception>
#include <string>
#include <utility>

#include "framework/check.h"
#include "framework/leaf_gradient_observer.h"
#include "framework/ops.h"
#include "framework/parallel.h"

namespace stillpoint {

ShardRange ShardRows(int64_t rows, int64_t shards, int64_t shard) {
  SP_CHECK(shards >= 1 && shards <= rows, "data parallel: cannot cut a batch of ", rows,
           " rows into ", shards, " shards (need 1 <= shards <= rows)");
  SP_CHECK(shard >= 0 && shard < shards, "data parallel: shard ", shard, " of ", shards,
           " does not exist");
  const int64_t base = rows / shards;
  const int64_t longer = rows % shards;
  const int64_t begin = shard * base + std::min(shard, longer);
  return {begin, begin + base + (shard < longer ? 1 : 0), shard};
}

namespace {

// Fewest gradient elements per task when the shards' gradients are summed.
constexpr int64_t kGradientElementsPerTask = 4096;

// Points every parameter of `replica` at the storage of the model's
// parameter of the same name, after checking that the two modules have the
// same parameters.
void ShareParameters(const Module& model, Module& replica, int64_t shard) {
  const NamedVars own = model.named_parameters();
  const NamedVars copy = replica.named_parameters();
  SP_CHECK(own.size() == copy.size(), "data parallel: the replica for shard ", shard, " has ",
           copy.size(), " parameters, the model ", own.size());
  for (std::size_t i = 0; i < own.size(); ++i) {
    const auto& [name, parameter] = own[i];
    Var target = copy[i].second;
    SP_CHECK(copy[i].first == name, "data parallel: parameter ", i, " of the replica for shard ",
             shard, " is '", copy[i].first, "', the model's is '", name, "'");
    SP_CHECK(target.shape() == parameter.shape() && target.dtype() == parameter.dtype(),
             "data parallel: parameter '", name, "' of the replica for shard ", shard, " is ",
             target.shape(), " ", ToString(target.dtype()), ", the model's ", parameter.shape(),
             " ", ToString(parameter.dtype()));
    target.mutable_value() = parameter.value();
    target.set_requires_grad(parameter.requires_grad());
  }
}

}  // namespace

void DataParallel::ClearReplicaGradients(int64_t shard) {
  for (Var& parameter : parameters_[shard]) parameter.zero_grad();
}

std::vector<std::vector<Tensor>> DataParallel::ShardGradientTerms() const {
  const VarList& parameters = parameters_.front();
  // Per parameter, its gradients in shard order: the model's first (shard
  // 0's, added to what it held before), then each replica's.
  std::vector<std::vector<Tensor>> terms(parameters.size());
  for (const VarList& shard_parameters : parameters_) {
    for (std::size_t i = 0; i < parameters.size(); ++i) {
      if (shard_parameters[i].has_grad()) terms[i].push_back(shard_parameters[i].grad().value());
    }
  }
  return terms;
}

void DataParallel::SumShardGradients() {
  const VarList& parameters = parameters_.front();
  const std::vector<std::vector<Tensor>> terms = ShardGradientTerms();
  // A fresh tensor for each sum of two or more: a gradient tensor may be
  // shared with another parameter's, so none is added to in place.
  std::vector<Tensor> sums(parameters.size());
  std::vector<int64_t> offsets = {0};
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    if (terms[i].size() >= 2) sums[i] = Tensor(terms[i][0].shape(), terms[i][0].dtype());
    offsets.push_back(offsets.back() + (sums[i].defined() ? sums[i].numel() : 0));
  }
  // One parallel loop over the elements of all sums, not a pass over each
  // tensor in turn on one thread while the other waits: the same additions
  // in the same order, (g0 + g1) + g2 ..., as adding tensor by tensor.
  ParallelForSegments(offsets, kGradientElementsPerTask,
                      [&](std::size_t i, int64_t begin, int64_t end) {
                        DispatchDType(sums[i].dtype(), [&](auto zero) {
                          using T = decltype(zero);
                          AddGradientTerms(terms[i], begin, end, sums[i].data<T>() + begin);
                        });
                      });
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    Var parameter = parameters[i];
    if (sums[i].defined()) {
      parameter.set_grad(Var(sums[i]));
    } else if (terms[i].size() == 1 && !parameter.has_grad()) {
      parameter.set_grad(Var(terms[i][0]));  // one replica's gradient only
    }
  }
  for (int64_t shard = 1; shard < shards(); ++shard) ClearReplicaGradients(shard);
}

DataParallel::DataParallel(std::shared_ptr<Module> model,
                           int64_t shards,
                           const ReplicaFactory& make_replica) {
  SP_CHECK(model != nullptr, "data parallel: no model");
  SP_CHECK(shards >= 1, "data parallel: shards must be >= 1, got ", shards);
  SP_CHECK(shards == 1 || make_replica, "data parallel: ", shards,
           " shards need a replica factory");
  parameters_.push_back(model->parameters());
  replicas_.push_back(std::move(model));
  for (int64_t shard = 1; shard < shards; ++shard) {
    std::shared_ptr<Module> replica = make_replica();
    SP_CHECK(replica != nullptr, "data parallel: the replica factory returned no module");
    SP_CHECK(replica != replicas_.front(),
             "data parallel: the replica factory returned the model itself");
    ShareParameters(*replicas_.front(), *replica, shard);
    parameters_.push_back(replica->parameters());
    replicas_.push_back(std::move(replica));
  }
  total_shards_ = shards;
  for (const VarList& shard_parameters : parameters_) {
    std::unordered_map<const void*, std::size_t> index;
    for (std::size_t i = 0; i < shard_parameters.size(); ++i) {
      index.emplace(shard_parameters[i].node(), i);
    }
    parameter_index_.push_back(std::move(index));
  }
}

void DataParallel::set_layout(int64_t first_shard, int64_t total_shards) {
  SP_CHECK(first_shard >= 0 && first_shard + shards() <= total_shards,
           "data parallel: shards ", first_shard, "..", first_shard + shards() - 1,
           " do not fit in ", total_shards, " shards");
  first_shard_ = first_shard;
  total_shards_ = total_shards;
}

void DataParallel::set_reduction(ShardGradientReduction* reduction) { reduction_ = reduction; }

Module& DataParallel::replica(int64_t shard) const {
  SP_CHECK(shard >= 0 && shard < shards(), "data parallel: shard ", shard, " of ", shards(),
           " does not exist");
  return *replicas_[shard];
}

double DataParallel::RunShards(int64_t rows, const ShardLoss& shard_loss) {
  const int64_t count = shards();
  // Checked before any work, so a bad batch leaves everything as it was.
  ShardRows(rows, total_shards_, first_shard_);
  const VarList& parameters = parameters_.front();
  // Shard 0 accumulates into the model's own gradients; these restore them
  // if a shard fails.
  VarList previous(parameters.size());
  for (std::size_t i = 0; i < parameters.size(); ++i) previous[i] = parameters[i].grad();

  std::vector<double> losses(count, 0.0);
  // With a reduction, each shard's finished gradients go to it during the
  // backward pass (on the shard's thread), so it can send them on early.
  const auto observe = [&](int64_t shard) {
    return ScopedLeafGradientObserver::Observer([this, shard](const Var& leaf) {
      const auto it = parameter_index_[shard].find(leaf.node());
      if (it != parameter_index_[shard].end()) reduction_->Ready(shard, it->second, leaf.grad().value());
    });
  };
  if (reduction_) reduction_->Begin();
  try {
    // One task per shard; ops inside a task run on its thread (nested
    // ParallelFor calls run inline).
    ParallelFor(0, count, 1, [&](int64_t begin, int64_t end) {
      for (int64_t shard = begin; shard < end; ++shard) {
        Module& module = *replicas_[shard];
        if (shard > 0) ClearReplicaGradients(shard);
        const Var loss =
            shard_loss(module, ShardRows(rows, total_shards_, first_shard_ + shard));
        SP_CHECK(loss.defined() && loss.numel() == 1, "data parallel: the loss of shard ", shard,
                 " must be a scalar, got ", loss.defined() ? loss.shape().ToString() : "none");
        losses[shard] = loss.item();
        const ScopedLeafGradientObserver::Observer observer =
            reduction_ ? observe(shard) : ScopedLeafGradientObserver::Observer();
        const ScopedLeafGradientObserver scope(reduction_ ? &observer : nullptr);
        backward(loss);
      }
    });
  } catch (...) {
    if (reduction_) reduction_->Finish(parameters, /*failed=*/true);
    for (std::size_t i = 0; i < parameters.size(); ++i) {
      Var parameter = parameters[i];
      parameter.set_grad(previous[i]);
    }
    for (int64_t shard = 1; shard < count; ++shard) ClearReplicaGradients(shard);
    throw;
  }
  losses_ = losses;
  double total = 0.0;
  for (const double loss : losses) total += loss;
  return total;
}

double DataParallel::Backward(int64_t rows, const ShardLoss& shard_loss) {
  const double loss = RunShards(rows, shard_loss);
  if (reduction_) {
    reduction_->Finish(parameters_.front(), /*failed=*/false);
    for (int64_t shard = 1; shard < shards(); ++shard) ClearReplicaGradients(shard);
  } else {
    SumShardGradients();
  }
  return loss;
}

}  // namespace stillpoint
