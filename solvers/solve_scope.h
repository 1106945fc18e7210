// ForwardSolveScope and AdjointSolveScope: which forward fixed-point solve,
// and which adjoint solve, the code on this thread is inside of, so that a
// map (or a VJP) evaluated by a solver can tell successive evaluations of
// one solve apart from those of another.
//
// SolveImplicit opens one around its tape-off solver iterations, and
// re-enters it for the evaluation it records at z*. A map that
// nests a solve of its own (EnergyAttention: the inner solve of an energy
// attention inside a DEQ cell) reads Current() before it starts: the same
// id on two evaluations means they are iterations of the same outer solve,
// on the same batch, so the inner solve may start from the inner solution
// of the previous evaluation (warm start). The inner solve then opens its
// own scope, and the enclosing id is restored when it ends.
//
// SolveIft's backward opens an AdjointSolveScope around each adjoint solve.
// An implicit node nested in another layer's map (the inner solve of an
// energy attention) is passed through by every VJP of the outer adjoint
// solve; it reads AdjointSolveScope::Current() before it opens its own
// scope, and the same id on two passes means they are iterations of the
// same outer adjoint solve, so its adjoint solve may start from its previous
// solution (ImplicitOptions::nested_adjoint_warm_start).
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
  // Re-enters the scope of a solve that has ended (its id from Current()
  // while it ran), current until destroyed: SolveImplicit evaluates the map
  // once more at z*, with the tape on, as part of the same solve.
  explicit ForwardSolveScope(uint64_t resumed_id);
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

class AdjointSolveScope {
 public:
  // Opens a scope with a fresh id, current on this thread until destroyed.
  AdjointSolveScope();
  // Restores the enclosing scope's id (0 outside every scope).
  ~AdjointSolveScope();
  AdjointSolveScope(const AdjointSolveScope&) = delete;
  AdjointSolveScope& operator=(const AdjointSolveScope&) = delete;

  // The id of the innermost open adjoint scope on this thread; 0 outside
  // every scope.
  static uint64_t Current();

 private:
  uint64_t enclosing_;
};

}  // namespace stillpoint
