// The process-wide pool behind every tensor's storage (64-byte-aligned
// buffers, bucketed by power-of-two size; framework/kernels/buffer.h holds
// the buffer itself). A freed buffer goes back to its bucket and is handed
// out again to the next request of that size class, so steady-state training
// steps (which create and free the same temporaries every step) make no
// system allocations. Thread-safe. Statistics let tests and benchmarks prove
// it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace stillpoint {

struct BufferPoolStats {
  int64_t system_allocations = 0;  // buffers obtained from the system allocator
  int64_t reuses = 0;              // requests served from a bucket
  int64_t bytes_in_use = 0;        // handed out and not yet returned
  int64_t bytes_cached = 0;        // held in buckets, ready for reuse
  int64_t peak_bytes_in_use = 0;
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
