#include "framework/parallel.h"

#include <tbb/task_arena.h>
#include <tbb/task_group.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "framework/autograd.h"
#include "framework/check.h"

// ThreadSanitizer builds (scripts/sanitize.sh tsan): oneTBB's scheduler is a
// prebuilt library without ThreadSanitizer instrumentation, so the moments a
// task is handed to a worker and reported done happen where the sanitizer
// cannot see them. ParallelFor tells it about both (TsanHandoff below) rather
// than suppressing every report from a oneTBB thread, which would hide races
// in the loop bodies as well.
#if defined(__SANITIZE_THREAD__)
#define STILLPOINT_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define STILLPOINT_TSAN 1
#endif
#endif
#ifdef STILLPOINT_TSAN
#include <sanitizer/tsan_interface.h>
#endif

namespace stillpoint {
namespace {

std::atomic<int> g_num_threads{1};
thread_local int t_parallel_depth = 0;

std::mutex g_arena_mutex;
std::unique_ptr<tbb::task_arena> g_arena;
int g_arena_threads = 0;

tbb::task_arena& Arena(int num_threads) {
  std::lock_guard<std::mutex> lock(g_arena_mutex);
  if (!g_arena || g_arena_threads != num_threads) {
    g_arena = std::make_unique<tbb::task_arena>(num_threads);
    g_arena_threads = num_threads;
  }
  return *g_arena;
}

// Marks the calling thread as inside a ParallelFor task, so nested calls run
// inline, until it goes out of scope (also when fn throws).
class NestedRegion {
 public:
  NestedRegion() { ++t_parallel_depth; }
  ~NestedRegion() { --t_parallel_depth; }
  NestedRegion(const NestedRegion&) = delete;
  NestedRegion& operator=(const NestedRegion&) = delete;
};

// The chunks of one ParallelFor in one lane per thread: lane t holds chunks
// [chunks t / threads, chunks (t + 1) / threads). Thread t of the arena
// takes its own lane's chunks from the front, then what is left of the
// other lanes from their backs. So while the cores keep pace, consecutive
// loops over the same rows give each thread the same rows, still in its
// core's cache, and a core that falls behind has its remaining chunks taken
// by the others. Each lane is one atomic (next, end) pair, so every chunk is
// taken exactly once. (Against chunks handed out in index order to
// whichever thread is free, a small gain: bench/RESULTS.md.)
class ChunkLanes {
 public:
  ChunkLanes(int64_t chunks, int threads) : lanes_(threads) {
    for (int t = 0; t < threads; ++t) {
      lanes_[t].range.store(Pack(chunks * t / threads, chunks * (t + 1) / threads),
                            std::memory_order_relaxed);
    }
  }
  // The lane's first chunk not yet taken, or -1 when none is left.
  int64_t TakeFront(int lane) { return Take(lane, /*front=*/true); }
  // The lane's last chunk not yet taken, or -1 when none is left.
  int64_t TakeBack(int lane) { return Take(lane, /*front=*/false); }

 private:
  // Its own cache line each, so threads taking from their own lanes do not
  // contend.
  struct alignas(64) Lane {
    std::atomic<uint64_t> range{0};
  };
  // Chunk indices are below 16 * threads, so 32 bits each suffice.
  static uint64_t Pack(int64_t next, int64_t end) {
    return (static_cast<uint64_t>(next) << 32) | static_cast<uint64_t>(end);
  }
  int64_t Take(int lane, bool front) {
    std::atomic<uint64_t>& range = lanes_[lane].range;
    uint64_t packed = range.load(std::memory_order_relaxed);
    for (;;) {
      const int64_t next = static_cast<int64_t>(packed >> 32);
      const int64_t end = static_cast<int64_t>(packed & 0xffffffffu);
      if (next >= end) return -1;
      const uint64_t rest = front ? Pack(next + 1, end) : Pack(next, end - 1);
      if (range.compare_exchange_weak(packed, rest, std::memory_order_acq_rel)) {
        return front ? next : end - 1;
      }
    }
  }
  std::vector<Lane> lanes_;
};

#ifdef STILLPOINT_TSAN
// The copy of fn that task_group::run stores in its task. Its copy
// constructor runs on the calling thread before the task is published and
// releases at the copy's own address; the worker acquires there before it
// reads anything, so the caller's writes before the loop happen before the
// task in the sanitizer's eyes. Each run, also one that throws, ends with a
// release at `done`, which the caller acquires once the group has been
// waited for.
template <typename Fn>
class TsanHandoff {
 public:
  TsanHandoff(const Fn& fn, char* done) : fn_(fn), done_(done) {}
  TsanHandoff(const TsanHandoff& other) : fn_(other.fn_), done_(other.done_) {
    __tsan_release(this);
  }
  TsanHandoff& operator=(const TsanHandoff&) = delete;
  void operator()() const {
    __tsan_acquire(const_cast<TsanHandoff*>(this));
    struct ReleaseAtEnd {
      char* done;
      ~ReleaseAtEnd() { __tsan_release(done); }
    } release_at_end{done_};
    fn_();
  }

 private:
  Fn fn_;
  char* done_;
};
#endif

}  // namespace

void SetNumThreads(int num_threads) {
  SP_CHECK(num_threads >= 1, "SetNumThreads: need at least one thread, got ", num_threads);
  g_num_threads = num_threads;
}

int NumThreads() { return g_num_threads; }

bool ParallelForRunsInline() { return g_num_threads == 1 || t_parallel_depth > 0; }

void ParallelFor(int64_t begin,
                 int64_t end,
                 int64_t min_chunk,
                 const std::function<void(int64_t, int64_t)>& fn) {
  if (end <= begin) return;
  const int threads = g_num_threads;
  const int64_t count = end - begin;
  min_chunk = std::max<int64_t>(min_chunk, 1);
  if (ParallelForRunsInline() || count <= min_chunk) {
    fn(begin, end);
    return;
  }
  // A fixed number of chunks whose bounds depend only on the range and the
  // thread count, so each chunk's work depends only on its indices. Each
  // thread starts on its own lane of chunks (ChunkLanes), but a thread that
  // runs out takes what is left of the others: on a shared (virtual) machine
  // one core often runs slower for a while, and a static split made the other
  // wait for it at every join. Up to sixteen chunks per thread keep that
  // wait to a fraction of a region; sixteen give the 32 (sequence, head)
  // units of W2's attention one chunk each (bench/RESULTS.md).
  const int64_t max_chunks = std::max<int64_t>(1, count / min_chunk);
  const int64_t chunks = std::min<int64_t>(max_chunks, int64_t{16} * threads);
  const int64_t chunk_size = (count + chunks - 1) / chunks;
  ChunkLanes lanes(chunks, threads);
  std::atomic<bool> failed{false};
  // Grad mode is per thread: the tasks take the caller's.
  const bool grad_mode = GradModeEnabled();
  auto run_lanes = [&] {
    const GradModeGuard caller_grad_mode(grad_mode);
    const NestedRegion nested;
    const int own = std::clamp(tbb::this_task_arena::current_thread_index(), 0, threads - 1);
    auto run = [&](int64_t chunk) {
      const int64_t lo = begin + chunk * chunk_size;
      const int64_t hi = std::min(end, lo + chunk_size);
      if (lo >= hi) return;
      try {
        fn(lo, hi);
      } catch (...) {
        failed = true;  // the other threads take no more chunks
        throw;
      }
    };
    for (int64_t chunk; !failed && (chunk = lanes.TakeFront(own)) >= 0;) run(chunk);
    for (int other = 1; other < threads; ++other) {
      const int lane = (own + other) % threads;
      for (int64_t chunk; !failed && (chunk = lanes.TakeBack(lane)) >= 0;) run(chunk);
    }
  };
#ifdef STILLPOINT_TSAN
  char done = 0;
  const TsanHandoff<decltype(run_lanes)> task(run_lanes, &done);
  // Acquires what each task released at `done` when the wait is over.
  auto wait = [&](tbb::task_group& group) {
    struct AcquireAtEnd {
      char* done;
      ~AcquireAtEnd() { __tsan_acquire(done); }
    } acquire_at_end{&done};
    group.wait();
  };
#else
  const auto& task = run_lanes;
  auto wait = [](tbb::task_group& group) { group.wait(); };
#endif
  Arena(threads).execute([&] {
    tbb::task_group group;
    for (int t = 1; t < threads; ++t) group.run(task);
    try {
      run_lanes();  // a chunk that throws has already set failed
    } catch (...) {
      wait(group);  // the others' running chunks still use this frame
      throw;
    }
    wait(group);  // rethrows another thread's exception
  });
}

void ParallelForSegments(const std::vector<int64_t>& offsets,
                         int64_t min_chunk,
                         const std::function<void(std::size_t, int64_t, int64_t)>& fn) {
  SP_CHECK(!offsets.empty() && offsets.front() == 0,
           "ParallelForSegments: offsets must start at 0");
  const std::size_t segments = offsets.size() - 1;
  ParallelFor(0, offsets.back(), min_chunk, [&](int64_t lo, int64_t hi) {
    // The last segment that starts at or before lo, then each one starting
    // before hi.
    std::size_t s = std::upper_bound(offsets.begin(), offsets.end(), lo) - offsets.begin() - 1;
    for (; s < segments && offsets[s] < hi; ++s) {
      const int64_t begin = std::max(lo, offsets[s]) - offsets[s];
      const int64_t end = std::min(hi, offsets[s + 1]) - offsets[s];
      if (begin < end) fn(s, begin, end);
    }
  });
}

ScopedNumThreads::ScopedNumThreads(int num_threads) : previous_(NumThreads()) {
  SetNumThreads(num_threads);
}

ScopedNumThreads::~ScopedNumThreads() { SetNumThreads(previous_); }

}  // namespace stillpoint
