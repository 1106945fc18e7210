// The one place stillpoint runs work in parallel. Every parallel loop in the
// project goes through ParallelFor, which cuts the range into chunks whose
// bounds depend only on the range and the thread count (so each index is
// handled by exactly one task, and results that are computed per index are
// bitwise identical run to run). Each of oneTBB's threads first takes the
// chunks of its own share of the range, then helps with what the others have
// left; it runs inline on the calling thread when the thread count is 1.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace stillpoint {

// Sets the number of worker threads for every later ParallelFor (>= 1).
// Default: 1, so a program is deterministic and single-threaded until it
// asks for more (the trainer sets it from the `threads` config key).
// The most worker threads a command or config may ask for (`threads`,
// --threads): more than any machine stillpoint runs on has cores.
inline constexpr int kMaxThreads = 256;
void SetNumThreads(int num_threads);
int NumThreads();

// Calls fn(begin, end) on disjoint chunks that cover [begin, end). Chunks
// hold at least min_chunk indices; fn must not write shared state except at
// its own indices. Nested calls run inline. The tasks run with the
// caller's grad mode (GradModeEnabled, autograd.h). When fn throws, no
// further chunks are started and the exception reaches the caller once the
// chunks already running have returned.
void ParallelFor(int64_t begin,
                 int64_t end,
                 int64_t min_chunk,
                 const std::function<void(int64_t, int64_t)>& fn);

// Whether a ParallelFor called here and now runs inline on this thread: the
// thread count is 1, or this is inside a task of another ParallelFor. Work
// meant to be cut for several threads can then be cut coarser; the results
// must not depend on the cut.
bool ParallelForRunsInline();

// ParallelFor over the concatenation of segments (the elements of several
// tensors seen as one flat range): segment s holds the flat indices
// [offsets[s], offsets[s + 1]), offsets starting at 0 and non-decreasing.
// Each chunk of the flat range is handed to fn as its overlaps with the
// segments, fn(s, begin, end) with [begin, end) in segment s's own indices.
// The chunks have about equal element counts whatever the segment sizes,
// and two calls with the same offsets cut them the same way.
void ParallelForSegments(const std::vector<int64_t>& offsets,
                         int64_t min_chunk,
                         const std::function<void(std::size_t, int64_t, int64_t)>& fn);

// Sets the thread count for the lifetime of the guard, then restores it.
class ScopedNumThreads {
 public:
  explicit ScopedNumThreads(int num_threads);
  ~ScopedNumThreads();
  ScopedNumThreads(const ScopedNumThreads&) = delete;
  ScopedNumThreads& operator=(const ScopedNumThreads&) = delete;

 private:
  int previous_;
};

}  // namespace stillpoint
