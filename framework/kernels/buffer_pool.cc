// The pool behind kernels/buffer.h's Buffer, and its public statistics and
// limits (framework/buffer_pool.h).
#include "framework/buffer_pool.h"
#include "framework/kernels/buffer.h"

#include <array>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

namespace stillpoint {
namespace {

constexpr std::size_t kAlignment = 64;
constexpr int kNumClasses = 48;  // 64 B .. 2^53 B

// Freed buffers are cached per thread slot, and a request looks in its own
// thread's slot first. A buffer a thread just freed is likely still in that
// core's cache; handing it to another thread instead makes that thread's
// first writes fetch the lines from the other core (with two data-parallel
// shards and one shared cache the memory-bound ops of a step slow down:
// bench/RESULTS.md). A request whose own slot is empty
// takes a buffer from any other slot before asking the system, so the pool
// never holds more than one shared cache would.
constexpr int kThreadSlots = 8;

int ThisThreadSlot() {
  static std::atomic<int> next{0};
  thread_local const int slot = next.fetch_add(1, std::memory_order_relaxed) % kThreadSlots;
  return slot;
}

int SizeClass(std::size_t bytes) {
  std::size_t capacity = kAlignment;
  int index = 0;
  while (capacity < bytes) {
    capacity <<= 1;
    ++index;
  }
  return index;
}

std::size_t ClassCapacity(int index) { return kAlignment << index; }

class Pool {
 public:
  void* Acquire(std::size_t bytes, std::size_t* capacity) {
    const int index = SizeClass(bytes);
    *capacity = ClassCapacity(index);
    const int own_slot = ThisThreadSlot();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (int i = 0; i < kThreadSlots; ++i) {
        auto& bucket = buckets_[(own_slot + i) % kThreadSlots][index];
        if (bucket.empty()) continue;
        void* data = bucket.back();
        bucket.pop_back();
        stats_.reuses++;
        stats_.bytes_cached -= static_cast<int64_t>(*capacity);
        NoteInUse(static_cast<int64_t>(*capacity));
        return data;
      }
      stats_.system_allocations++;
      NoteInUse(static_cast<int64_t>(*capacity));
    }
    void* data = std::aligned_alloc(kAlignment, *capacity);
    if (data == nullptr) throw std::bad_alloc();
    return data;
  }

  void Release(void* data, std::size_t capacity) {
    const int index = SizeClass(capacity);
    const int own_slot = ThisThreadSlot();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stats_.bytes_in_use -= static_cast<int64_t>(capacity);
      if (stats_.bytes_cached + static_cast<int64_t>(capacity) <= cache_limit_) {
        buckets_[own_slot][index].push_back(data);
        stats_.bytes_cached += static_cast<int64_t>(capacity);
        return;
      }
    }
    std::free(data);
  }

  BufferPoolStats Stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  void ResetStats() {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.system_allocations = 0;
    stats_.reuses = 0;
    stats_.peak_bytes_in_use = stats_.bytes_in_use;
  }

  void ReleaseCached() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& slot : buckets_) {
      for (auto& bucket : slot) {
        for (void* data : bucket) std::free(data);
        bucket.clear();
      }
    }
    stats_.bytes_cached = 0;
  }

  void SetLimit(std::size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    cache_limit_ = static_cast<int64_t>(bytes);
  }

 private:
  void NoteInUse(int64_t bytes) {
    stats_.bytes_in_use += bytes;
    if (stats_.bytes_in_use > stats_.peak_bytes_in_use) {
      stats_.peak_bytes_in_use = stats_.bytes_in_use;
    }
  }

  std::mutex mutex_;
  // buckets_[thread slot][size class]
  std::array<std::array<std::vector<void*>, kNumClasses>, kThreadSlots> buckets_;
  BufferPoolStats stats_;
  int64_t cache_limit_ = int64_t{1} << 30;
};

// Intentionally leaked: tensors with static storage duration may release
// their buffers after a function-local static pool would have been destroyed.
Pool& GlobalPool() {
  static Pool* pool = new Pool();
  return *pool;
}

}  // namespace

void* AcquirePooledBuffer(std::size_t bytes, std::size_t* capacity) {
  return GlobalPool().Acquire(bytes, capacity);
}

void ReleasePooledBuffer(void* data, std::size_t capacity) {
  GlobalPool().Release(data, capacity);
}

BufferPoolStats GetBufferPoolStats() { return GlobalPool().Stats(); }
void ResetBufferPoolStats() { GlobalPool().ResetStats(); }
void ReleaseCachedBuffers() { GlobalPool().ReleaseCached(); }
void SetBufferPoolCacheLimit(std::size_t bytes) { GlobalPool().SetLimit(bytes); }
int BufferPoolThreadSlot() { return ThisThreadSlot(); }

}  // namespace stillpoint
