// ForwardSolveScope: which forward fixed-point solve the code on this thread
// is inside of, so that a map evaluated by a solver can tell successive
// evaluations of one solve apart from those of another.
//
// SolveImplicit opens one around its tape-off solver iterations. A map that
// nests a solve of its own (EnergyAttention: the inner solve of an energy
// attention inside a DEQ cell) reads Current() before it starts: the same
// id on two evaluations means they are iterations of the same outer solve,
// on the same batch, so the inner solve may start from the inner solution
// of the previous evaluation (warm start). The inner solve then opens its
// own scope, and the enclosing id is restored when it ends.
//
// Ids are unique in the process (a global counter); the current id is per
// thread (a data-parallel shard solves on its own thread and has its own).
#pragma once

#include <cstdint>

namespace stillpoint {

class ForwardSolveScope {
 public:
  // Opens a scope with a fresh id, current on this thread until destroyed.
  ForwardSolveScope();
  // Restores the enclosing scope's id (0 outside every scope).
  ~ForwardSolveScope();
  ForwardSolveScope(const ForwardSolveScope&) = delete;
  ForwardSolveScope& operator=(const ForwardSolveScope&) = delete;

  // The id of the innermost open scope on this thread; 0 outside every
  // scope.
  static uint64_t Current();

 private:
  uint64_t enclosing_;
};

}  // namespace stillpoint
