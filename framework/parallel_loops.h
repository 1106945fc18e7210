// Elementwise loops on raw arrays spread over threads with ParallelFor
// (framework/parallel.h), for code outside the ops that works on tensors'
// storage directly (the solvers' per-sample updates). Every index is computed
// on its own, so results are bitwise identical for any thread count; the
// compiler vectorises the loop bodies.
#pragma once

#include <algorithm>
#include <cstdint>

#include "framework/parallel.h"

namespace stillpoint {

// Below this many elements a loop is not worth splitting across threads.
inline constexpr int64_t kMinParallelElements = 16384;

// The min_chunk of a ParallelFor over indices of entries_per_index elements
// each (rows of a row op, blocks of a copy): enough indices for
// kMinParallelElements elements, so small inputs run inline, and at least one.
inline int64_t MinChunk(int64_t entries_per_index) {
  return std::max<int64_t>(1, kMinParallelElements / std::max<int64_t>(1, entries_per_index));
}

// ParallelFor, except that a range of at most min_chunk indices runs inline
// without building a std::function (small tensors pay no dispatch cost).
template <typename Fn>
void ParallelRange(int64_t begin, int64_t end, int64_t min_chunk, const Fn& fn) {
  if (end - begin <= std::max<int64_t>(min_chunk, 1)) {
    if (end > begin) fn(begin, end);
    return;
  }
  ParallelFor(begin, end, min_chunk, fn);
}

// out[i] = fn(x[i]) for i in [0, n).
template <typename T, typename Fn>
void ParallelUnaryLoop(const T* x, T* out, int64_t n, Fn fn) {
  ParallelRange(0, n, kMinParallelElements, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) out[i] = fn(x[i]);
  });
}

// out[i] = fn(a[i], b[i]) for i in [0, n).
template <typename T, typename Fn>
void ParallelBinaryLoop(const T* a, const T* b, T* out, int64_t n, Fn fn) {
  ParallelRange(0, n, kMinParallelElements, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) out[i] = fn(a[i], b[i]);
  });
}

namespace internal {
// The spellings the framework's kernels and ops use
// (framework/kernels/elementwise_kernels.h): the same loops.
inline constexpr int64_t kMinChunk = kMinParallelElements;
using stillpoint::ParallelRange;
template <typename T, typename Fn>
void UnaryLoop(const T* x, T* out, int64_t n, Fn fn) {
  ParallelUnaryLoop(x, out, n, fn);
}
template <typename T, typename Fn>
void BinaryLoop(const T* a, const T* b, T* out, int64_t n, Fn fn) {
  ParallelBinaryLoop(a, b, out, n, fn);
}
}  // namespace internal

}  // namespace stillpoint
