#include "solvers/solve_scope.h"

#include <atomic>

namespace stillpoint {
namespace {

std::atomic<uint64_t> next_id{1};
thread_local uint64_t current_id = 0;
thread_local uint64_t current_adjoint_id = 0;

}  // namespace

ForwardSolveScope::ForwardSolveScope() : enclosing_(current_id) {
  current_id = next_id.fetch_add(1, std::memory_order_relaxed);
}

ForwardSolveScope::ForwardSolveScope(uint64_t resumed_id) : enclosing_(current_id) {
  current_id = resumed_id;
}

ForwardSolveScope::~ForwardSolveScope() { current_id = enclosing_; }

uint64_t ForwardSolveScope::Current() { return current_id; }

AdjointSolveScope::AdjointSolveScope() : enclosing_(current_adjoint_id) {
  current_adjoint_id = next_id.fetch_add(1, std::memory_order_relaxed);
}

AdjointSolveScope::~AdjointSolveScope() { current_adjoint_id = enclosing_; }

uint64_t AdjointSolveScope::Current() { return current_adjoint_id; }

}  // namespace stillpoint
