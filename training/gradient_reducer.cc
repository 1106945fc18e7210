#include "training/gradient_reducer.h"

#include <chrono>
#include <cstring>

#include "framework/check.h"
#include "training/distributed.h"

namespace stillpoint {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// MPI guarantees tags up to 32767; the chain's messages between two ranks
// arrive in the order sent anyway, the tag only labels them.
constexpr int kTagModulus = 32000;

}  // namespace

GradientReducer::GradientReducer(const VarList& parameters, int64_t local_shards,
                                 const GradientReducerOptions& options)
    : options_(options), local_shards_(local_shards) {
  SP_CHECK(local_shards >= 1, "gradient reducer: local_shards must be >= 1, got ", local_shards);
  SP_CHECK(options.bucket_bytes >= 1, "gradient reducer: bucket_bytes must be >= 1, got ",
           options.bucket_bytes);
  bucket_of_.assign(parameters.size(), 0);
  for (const Var& parameter : parameters) {
    shapes_.push_back(parameter.shape());
    dtypes_.push_back(parameter.dtype());
  }
  // The last parameters first: the backward pass reaches them first.
  for (std::size_t k = parameters.size(); k-- > 0;) {
    const int64_t bytes = static_cast<int64_t>(parameters[k].value().nbytes());
    if (buckets_.empty() ||
        (!buckets_.back().parameters.empty() &&
         buckets_.back().data_bytes + bytes > options.bucket_bytes)) {
      buckets_.emplace_back();
    }
    Bucket& bucket = buckets_.back();
    bucket_of_[k] = buckets_.size() - 1;
    bucket.parameters.push_back(k);
    bucket.offsets.push_back(bucket.data_bytes);
    // Each parameter's data starts 8-byte aligned.
    bucket.data_bytes += (bytes + 7) / 8 * 8;
  }
  for (Bucket& bucket : buckets_) {
    const int64_t flags = (static_cast<int64_t>(bucket.parameters.size()) + 7) / 8 * 8;
    bucket.buffer.assign(static_cast<std::size_t>(flags + bucket.data_bytes), 0);
    times_.bytes += bucket.data_bytes;
  }
  times_.buckets = static_cast<int64_t>(buckets_.size());
  terms_.assign(parameters.size(), std::vector<Tensor>(local_shards));
  missing_.assign(buckets_.size(), 0);
  ready_.assign(buckets_.size(), 0);
  thread_ = std::thread([this] { Run(); });
}

GradientReducer::~GradientReducer() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void GradientReducer::Begin() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    SP_CHECK(!active_, "gradient reducer: Begin twice without Finish");
    for (std::vector<Tensor>& terms : terms_) {
      for (Tensor& term : terms) term = Tensor();
    }
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      missing_[b] = static_cast<int64_t>(buckets_[b].parameters.size()) * local_shards_;
      ready_[b] = 0;
    }
    finishing_ = false;
    done_ = false;
    error_ = nullptr;
    communication_seconds_ = 0;
    active_ = true;
  }
  changed_.notify_all();
}

void GradientReducer::Ready(int64_t shard, std::size_t parameter, const Tensor& gradient) {
  bool notify = false;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (!active_ || parameter >= terms_.size() || shard < 0 || shard >= local_shards_) return;
    Tensor& slot = terms_[parameter][shard];
    if (slot.defined()) return;  // counted once
    slot = gradient;
    const std::size_t b = bucket_of_[parameter];
    notify = --missing_[b] == 0 && options_.overlap;
    if (notify) ready_[b] = 1;
  }
  if (notify) changed_.notify_all();
}

void GradientReducer::Run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    changed_.wait(lock, [&] { return stop_ || (active_ && !done_); });
    if (stop_) return;
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      changed_.wait(lock, [&] { return stop_ || ready_[b] || finishing_; });
      if (stop_) return;
      // The terms of a ready bucket no longer change: reduce it unlocked,
      // while the backward passes go on with the buckets after it.
      lock.unlock();
      const auto start = Clock::now();
      std::exception_ptr error;
      try {
        Reduce(buckets_[b], static_cast<int>(b % kTagModulus));
      } catch (...) {
        error = std::current_exception();
      }
      const double seconds = SecondsSince(start);
      lock.lock();
      communication_seconds_ += seconds;
      if (error && !error_) error_ = error;
    }
    lock.unlock();
    const auto start = Clock::now();
    std::exception_ptr error;
    try {
      FinishBroadcasts();
    } catch (...) {
      error = std::current_exception();
    }
    const double seconds = SecondsSince(start);
    lock.lock();
    communication_seconds_ += seconds;
    if (error && !error_) error_ = error;
    done_ = true;
    changed_.notify_all();
  }
}

void GradientReducer::Reduce(Bucket& bucket, int tag) {
  const int rank = WorldRank();
  const int size = WorldSize();
  const std::size_t count = bucket.parameters.size();
  char* flags = bucket.buffer.data();
  char* data = flags + (bucket.buffer.size() - static_cast<std::size_t>(bucket.data_bytes));
  if (rank > 0) {
    ReceiveBytes(bucket.buffer.data(), bucket.buffer.size(), rank - 1, tag);
  } else {
    std::memset(flags, 0, count);
  }
  // The partial sums so far, then this rank's shards in order: each step
  // out = out + term, as AddGradientTerms adds, so the bits are a single
  // process's.
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t p = bucket.parameters[i];
    for (const Tensor& term : terms_[p]) {
      if (!term.defined()) continue;
      char* out = data + bucket.offsets[i];
      const bool first = !flags[i];
      flags[i] = 1;
      DispatchDType(dtypes_[p], [&](auto zero) {
        using T = decltype(zero);
        T* sum = reinterpret_cast<T*>(out);
        const T* add = term.data<T>();
        const int64_t n = term.numel();
        if (first) {
          std::memcpy(sum, add, static_cast<std::size_t>(n) * sizeof(T));
        } else {
          for (int64_t j = 0; j < n; ++j) sum[j] = sum[j] + add[j];
        }
      });
    }
  }
  if (rank + 1 < size) SendBytes(bucket.buffer.data(), bucket.buffer.size(), rank + 1, tag);
  // Started, not awaited: the next bucket's chain runs while this one's
  // broadcast travels (Run waits for them all after the last bucket).
  StartBroadcastBytes(bucket.buffer.data(), bucket.buffer.size(), size - 1);
}

void GradientReducer::Finish(const VarList& parameters, bool failed) {
  const auto start = Clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  SP_CHECK(active_, "gradient reducer: Finish without Begin");
  finishing_ = true;
  changed_.notify_all();
  changed_.wait(lock, [&] { return done_; });
  active_ = false;
  times_.exposed_seconds = SecondsSince(start);
  times_.communication_seconds = communication_seconds_;
  for (std::vector<Tensor>& terms : terms_) {
    for (Tensor& term : terms) term = Tensor();
  }
  if (error_) std::rethrow_exception(error_);
  if (failed) return;
  SP_CHECK(parameters.size() == shapes_.size(), "gradient reducer: ", parameters.size(),
           " parameters, built for ", shapes_.size());
  for (const Bucket& bucket : buckets_) {
    const char* flags = bucket.buffer.data();
    const char* data =
        flags + (bucket.buffer.size() - static_cast<std::size_t>(bucket.data_bytes));
    for (std::size_t i = 0; i < bucket.parameters.size(); ++i) {
      if (!flags[i]) continue;
      const std::size_t p = bucket.parameters[i];
      Tensor sum(shapes_[p], dtypes_[p]);
      DispatchDType(dtypes_[p], [&](auto zero) {
        using T = decltype(zero);
        std::memcpy(sum.data<T>(), data + bucket.offsets[i], sum.nbytes());
      });
      Var parameter = parameters[p];
      parameter.set_grad(Var(sum));
    }
  }
}

}  // namespace stillpoint
