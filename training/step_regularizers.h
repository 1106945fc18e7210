// The terms a training step adds to its task loss, composed before the loop
// and handed to TrainStep::Run as its ExtraLoss (training/train_step.h):
//
//   progressive loss   train.progressive_loss.* (tied and implicit models):
//                      every step
//   attention radius   model.regularization.attention_spectral_radius_*: every
//                      step, at the inner fixed points of the cells' energy
//                      attentions (explicit, tied and implicit models)
//   Jacobian penalty   model.regularization.jacobian_*: after pretraining, at
//                      a drawn fraction of the steps, its weight ramped in
//   spectral radius    model.regularization.spectral_radius_*: after
//                      pretraining, at a drawn fraction of the steps
//   correction loss    model.regularization.correction_*: after pretraining
//
// The other regularisers are taken at the model's own fixed point, so they
// apply only to a model with an implicit layer. The terms are summed in that
// order. A term whose weight is 0 is off and takes no draw, so a run without
// it keeps the random stream it had before the term existed.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "framework/random.h"
#include "layers/models.h"
#include "solvers/solver_summary.h"
#include "training/train_step.h"
#include "training/trainer_options.h"

namespace stillpoint {

// One term of a step's loss besides the task loss.
class StepLossTerm {
 public:
  virtual ~StepLossTerm() = default;
  // Whether the term is added to step `step` (0-based); a term that is on
  // only at some steps draws that from `rng` here.
  virtual bool AppliesAt(int64_t step, Rng& rng) = 0;
  // Its value on `rows`, scaled by `scale` (ExtraLoss).
  virtual Var Loss(SequenceModel& model, const Batch& rows, Rng& draws, double scale) const = 0;
};

// The `count` samples of a forward solve that were slowest to converge, in
// that order: the most iterations first, ties to the larger relative
// residual (NaN counts as the largest), then to the lower index. Where a
// solve needed the most iterations its map contracts least, so a
// spectral-radius penalty on a few rows does the most for the solves'
// convergence there (model.regularization.spectral_radius_rows: slowest).
// Throws when count is outside [0, the solve's samples].
std::vector<int64_t> SlowestSamples(const SolverSummary& solve, int64_t count);

class StepRegularizers {
 public:
  // The terms that are on for `model` (its kind, its implicit layer and
  // unroll steps) under these options.
  StepRegularizers(const RegularizationOptions& regularization,
                   const TrainerOptions& trainer,
                   const SequenceModel& model);
  StepRegularizers(const StepRegularizers&) = delete;
  StepRegularizers& operator=(const StepRegularizers&) = delete;
  ~StepRegularizers();

  // The task loss's weight in the step's loss (TrainStepOptions::
  // task_loss_weight): 1 - the progressive loss's weight when that is on.
  double task_loss_weight() const { return task_loss_weight_; }

  // The extra loss of step `step` (nullptr: none), its draws taken from
  // `rng` now. It refers to this object, which must outlive its use.
  ExtraLoss At(int64_t step, Rng& rng);

 private:
  std::vector<std::unique_ptr<StepLossTerm>> terms_;
  double task_loss_weight_ = 1.0;
};

}  // namespace stillpoint
