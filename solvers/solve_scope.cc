#include "solvers/solve_scope.h"

#include <atomic>

namespace stillpoint {
namespace {

std::atomic<uint64_t> next_id{1};
thread_local uint64_t current_id = 0;

}  // namespace

ForwardSolveScope::ForwardSolveScope() : enclosing_(current_id) {
  current_id = next_id.fetch_add(1, std::memory_order_relaxed);
}

ForwardSolveScope::~ForwardSolveScope() { current_id = enclosing_; }

uint64_t ForwardSolveScope::Current() { return current_id; }

}  // namespace stillpoint
