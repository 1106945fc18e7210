// Every solve of every implicit layer of a model, counted over a training
// step and over the whole run.
//
// The layers keep their own tallies (solvers/solve_tally.h); TrainStep takes
// them after each step's backward pass, so a step's counts cover its forward
// and adjoint solves on every shard, nested ones included (each inner
// adjoint of an energy attention at every VJP of the outer adjoint), and
// nothing else (evaluations and gradient checks are discarded). The
// families:
//
//   model      the model's own implicit layer: the cell of model.kind
//              implicit, the block of model.kind energy
//   attention  the energy attentions inside the model's cells
//              (model.attention), every inner solve
//   hopfield   the Hopfield pooling and lookup readouts in fixed-point mode
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "layers/models.h"
#include "solvers/solve_tally.h"

namespace stillpoint {

enum class SolveFamily { kModel, kAttention, kHopfield };
inline constexpr std::array<SolveFamily, 3> kSolveFamilies = {
    SolveFamily::kModel, SolveFamily::kAttention, SolveFamily::kHopfield};
// "model", "attention", "hopfield".
const char* ToString(SolveFamily family);

// One step's (or one evaluation's) solves, per family.
struct SolveCounts {
  std::array<ImplicitTally, 3> family;

  ImplicitTally& operator[](SolveFamily f) { return family[static_cast<int>(f)]; }
  const ImplicitTally& operator[](SolveFamily f) const { return family[static_cast<int>(f)]; }
  void Merge(const SolveCounts& other);
  // Whether an adjoint solve of any family left a sample above its
  // tolerance (INEXACT never counts): train.on_unconverged.
  bool AdjointUnconverged() const;
  // "the model's forward solve ended NON_FINITE 2, DIVERGED 1" for the
  // first family whose forward solve returned a state that is no fixed
  // point at all; empty when none did.
  std::string ForwardFailure() const;
  // "model 3/32, attention 41/2048" unconverged adjoint samples per family
  // with any; empty when none.
  std::string AdjointMisses() const;
};

// The counts of every implicit layer of `model` since the last call (or
// construction); the layers start counting afresh.
SolveCounts TakeSolveCounts(const SequenceModel& model);

// The whole run's: every step's counts added, and the steps in which a
// family's forward (or adjoint) solve left a sample unconverged.
struct RunSolveCounts {
  SolveCounts solves;
  std::array<int64_t, 3> forward_unconverged_steps{};
  std::array<int64_t, 3> backward_unconverged_steps{};
  // Steps that ran the family's solves at all (implicit steps; pretraining's
  // unrolled steps run none of the model's).
  std::array<int64_t, 3> steps_with_solves{};

  void AddStep(const SolveCounts& step);
  int64_t forward_unconverged(SolveFamily f) const {
    return forward_unconverged_steps[static_cast<int>(f)];
  }
  int64_t backward_unconverged(SolveFamily f) const {
    return backward_unconverged_steps[static_cast<int>(f)];
  }
};

}  // namespace stillpoint
