// A process-wide pool of 64-byte-aligned buffers, bucketed by power-of-two
// size. A freed buffer goes back to its bucket and is handed out again to the
// next request of that size class, so steady-state training steps (which
// create and free the same temporaries every step) make no system
// allocations. Thread-safe. Statistics let tests and benchmarks prove it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace stillpoint {

struct BufferPoolStats {
  int64_t system_allocations = 0;  // buffers obtained from the system allocator
  int64_t reuses = 0;              // requests served from a bucket
  int64_t bytes_in_use = 0;        // handed out and not yet returned
  int64_t bytes_cached = 0;        // held in buckets, ready for reuse
  int64_t peak_bytes_in_use = 0;
};

// A block of raw storage owned by a Tensor (shared between views).
class Buffer {
 public:
  explicit Buffer(std::size_t bytes);
  // Storage the pool does not own (a NumPy array's, for the Python
  // bindings): `owner` keeps `data` alive and is released with the Buffer;
  // nothing goes back to the pool.
  Buffer(void* data, std::size_t bytes, std::shared_ptr<const void> owner);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  // Whether the storage belongs to an outside owner (the second constructor).
  bool external() const { return external_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;     // requested
  std::size_t capacity_ = 0;  // size class
  bool external_ = false;
  std::shared_ptr<const void> owner_;
};

BufferPoolStats GetBufferPoolStats();
// Zeroes the counters (not the cache); peak restarts from bytes in use.
void ResetBufferPoolStats();
// Returns every cached buffer to the system.
void ReleaseCachedBuffers();
// Freed buffers are cached per thread (up to 8 slots; threads beyond that
// share), and a request takes its own thread's most recently freed buffer of
// its size class first, then any other thread's, then the system's. This is
// the calling thread's slot, for tests and diagnostics.
int BufferPoolThreadSlot();

// Upper bound on cached bytes (default 1 GiB); beyond it freed buffers go back
// to the system.
void SetBufferPoolCacheLimit(std::size_t bytes);

}  // namespace stillpoint
