#include "training/step_regularizers.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "framework/ops.h"
#include "solvers/regularizers.h"
#include "training/batch_loss.h"

namespace stillpoint {
namespace {

// The mean cross-entropy of logits [..., classes] over the rows' targets.
Var RowsLoss(const Var& logits, const Batch& rows) {
  const int64_t classes = logits.dim(-1);
  return BatchLoss(reshape(logits, Shape{logits.numel() / classes, classes}), rows);
}

// Bansal et al.'s progressive loss: n detached steps of the cell, n uniform
// in [0, N - k), then k with gradient (the rest of the weight is the task
// loss's, TrainStepOptions::task_loss_weight).
class ProgressiveTerm : public StepLossTerm {
 public:
  ProgressiveTerm(const TrainerOptions& trainer, int64_t unroll_steps)
      : trainer_(trainer),
        total_(trainer.progressive_loss_iterations > 0 ? trainer.progressive_loss_iterations
                                                       : unroll_steps) {}
  bool AppliesAt(int64_t, Rng&) override { return true; }
  Var Loss(SequenceModel& model, const Batch& rows, Rng& draws, double scale) const override {
    const int64_t k = trainer_.progressive_loss_steps;
    const int64_t n = draws.UniformInt(total_ - k);
    model.SetGridWidth(rows.grid_width);
    const Var logits = model.ProgressiveLogits(EmbedBatch(model, rows), n, k);
    return mul_scalar(RowsLoss(logits, rows), trainer_.progressive_loss_weight * scale);
  }

 private:
  TrainerOptions trainer_;
  int64_t total_;
};

// A regulariser at the model's fixed point: on from the end of pretraining.
class FixedPointTerm : public StepLossTerm {
 public:
  explicit FixedPointTerm(int64_t pretrain_steps) : pretrain_steps_(pretrain_steps) {}
  bool AppliesAt(int64_t step, Rng& rng) override {
    return step >= pretrain_steps_ && AppliesAfterPretraining(step - pretrain_steps_, rng);
  }

 protected:
  // `step` counted from the end of pretraining.
  virtual bool AppliesAfterPretraining(int64_t step, Rng& rng) = 0;

 private:
  int64_t pretrain_steps_;
};

// The Jacobian penalty at a fraction of the steps, its weight ramped in over
// jacobian_ramp_steps.
class JacobianTerm : public FixedPointTerm {
 public:
  JacobianTerm(const RegularizationOptions& options, int64_t pretrain_steps)
      : FixedPointTerm(pretrain_steps), options_(options) {}
  Var Loss(SequenceModel& model, const Batch& rows, Rng& draws, double scale) const override {
    return mul_scalar(
        model.FixedPointJacobianPenalty(EmbedBatch(model, rows),
                                        static_cast<int>(options_.jacobian_probes), draws),
        options_.jacobian_weight * ramp_ * scale);
  }

 protected:
  bool AppliesAfterPretraining(int64_t step, Rng& rng) override {
    if (!(rng.Uniform() < options_.jacobian_frequency)) return false;
    const int64_t ramp = options_.jacobian_ramp_steps;
    ramp_ =
        ramp == 0 ? 1.0 : std::min(1.0, static_cast<double>(step + 1) / static_cast<double>(ramp));
    return true;
  }

 private:
  RegularizationOptions options_;
  double ramp_ = 1.0;  // the fraction of jacobian_weight at the step being taken
};

// The spectral-radius penalty at a fraction of the steps, on
// spectral_radius_samples rows of the batch (all of them: none named): drawn
// without replacement, or the step's slowest forward solves.
class SpectralRadiusTerm : public FixedPointTerm {
 public:
  SpectralRadiusTerm(const RegularizationOptions& options, int64_t pretrain_steps)
      : FixedPointTerm(pretrain_steps), options_(options) {
    estimate_.max_iterations = static_cast<int>(options.spectral_radius_iterations);
    estimate_.tolerance = 1e-3;
  }
  Var Loss(SequenceModel& model, const Batch& rows, Rng& draws, double scale) const override {
    return mul_scalar(
        model.FixedPointSpectralRadiusPenalty(EmbedBatch(model, rows),
                                              options_.spectral_radius_target, estimate_,
                                              PenalisedRows(model, rows.batch_size, draws)),
        options_.spectral_radius_weight * scale);
  }

 protected:
  bool AppliesAfterPretraining(int64_t, Rng& rng) override {
    return rng.Uniform() < options_.spectral_radius_frequency;
  }

 private:
  std::vector<int64_t> PenalisedRows(const SequenceModel& model, int64_t batch, Rng& draws) const {
    const int64_t wanted = options_.spectral_radius_samples;
    if (wanted == 0 || wanted >= batch) return {};
    if (options_.spectral_radius_rows == "slowest") {
      return SlowestSamples(model.implicit()->last_result().forward, wanted);
    }
    std::vector<int64_t> rows(static_cast<std::size_t>(batch));
    for (int64_t i = 0; i < batch; ++i) rows[static_cast<std::size_t>(i)] = i;
    // The first `wanted` places of a Fisher-Yates shuffle.
    for (int64_t i = 0; i < wanted; ++i) {
      const int64_t j = i + draws.UniformInt(batch - i);
      std::swap(rows[static_cast<std::size_t>(i)], rows[static_cast<std::size_t>(j)]);
    }
    rows.resize(static_cast<std::size_t>(wanted));
    return rows;
  }

  RegularizationOptions options_;
  SpectralRadiusOptions estimate_;
};

// The spectral-radius penalty of the cells' energy attentions at every step,
// on every sample, at the inner solutions of the step's forward.
class AttentionSpectralRadiusTerm : public StepLossTerm {
 public:
  explicit AttentionSpectralRadiusTerm(const RegularizationOptions& options)
      : options_(options) {
    estimate_.max_iterations = static_cast<int>(options.attention_spectral_radius_iterations);
    estimate_.tolerance = 1e-3;
  }
  bool AppliesAt(int64_t, Rng&) override { return true; }
  Var Loss(SequenceModel& model, const Batch&, Rng&, double scale) const override {
    return mul_scalar(model.AttentionSpectralRadiusPenalty(
                          options_.attention_spectral_radius_target, estimate_),
                      options_.attention_spectral_radius_weight * scale);
  }

 private:
  RegularizationOptions options_;
  SpectralRadiusOptions estimate_;
};

// The fixed-point correction loss: the task loss on the solve's iterates.
class CorrectionTerm : public FixedPointTerm {
 public:
  CorrectionTerm(const RegularizationOptions& options, int64_t pretrain_steps)
      : FixedPointTerm(pretrain_steps), weight_(options.correction_weight) {
    correction_.steps = static_cast<int>(options.correction_steps);
    correction_.tau = options.correction_tau;
    correction_.gamma = options.correction_gamma;
  }
  Var Loss(SequenceModel& model, const Batch& rows, Rng&, double scale) const override {
    const auto task_loss = [&rows](const Var& logits) { return RowsLoss(logits, rows); };
    return mul_scalar(
        model.FixedPointCorrectionLoss(EmbedBatch(model, rows), task_loss, correction_),
        weight_ * scale);
  }

 protected:
  bool AppliesAfterPretraining(int64_t, Rng&) override { return true; }

 private:
  double weight_;
  FixedPointCorrectionOptions correction_;
};

// A non-finite solve's NaN residual orders as the largest, so the order
// stays a strict weak ordering and that sample comes first.
double ResidualKey(double residual) {
  return std::isnan(residual) ? std::numeric_limits<double>::infinity() : residual;
}

}  // namespace

std::vector<int64_t> SlowestSamples(const SolverSummary& solve, int64_t count) {
  const auto samples = static_cast<int64_t>(solve.sample_iterations.size());
  SP_CHECK(static_cast<int64_t>(solve.sample_rel_residual.size()) == samples,
           "SlowestSamples: the solve has ", samples, " iteration counts but ",
           solve.sample_rel_residual.size(), " residuals");
  SP_CHECK(count >= 0 && count <= samples, "SlowestSamples: ", count,
           " samples asked of a solve of ", samples);
  std::vector<int64_t> rows(static_cast<std::size_t>(samples));
  for (int64_t i = 0; i < samples; ++i) rows[static_cast<std::size_t>(i)] = i;
  const auto slower = [&solve](int64_t a, int64_t b) {
    const auto i = static_cast<std::size_t>(a);
    const auto j = static_cast<std::size_t>(b);
    if (solve.sample_iterations[i] != solve.sample_iterations[j]) {
      return solve.sample_iterations[i] > solve.sample_iterations[j];
    }
    return ResidualKey(solve.sample_rel_residual[i]) > ResidualKey(solve.sample_rel_residual[j]);
  };
  std::stable_sort(rows.begin(), rows.end(), slower);
  rows.resize(static_cast<std::size_t>(count));
  return rows;
}

StepRegularizers::StepRegularizers(const RegularizationOptions& regularization,
                                   const TrainerOptions& trainer,
                                   const SequenceModel& model) {
  // A comparison's variants of other kinds ignore the progressive loss.
  const ModelKind kind = model.options().kind;
  if (trainer.progressive_loss_weight > 0.0 &&
      (kind == ModelKind::kTied || kind == ModelKind::kImplicit)) {
    terms_.push_back(std::make_unique<ProgressiveTerm>(trainer, model.options().unroll_steps));
    task_loss_weight_ = 1.0 - trainer.progressive_loss_weight;
  }
  if (regularization.attention_spectral_radius_weight > 0 && kind != ModelKind::kEnergy) {
    terms_.push_back(std::make_unique<AttentionSpectralRadiusTerm>(regularization));
  }
  if (model.implicit() == nullptr) return;
  const int64_t pretrain = trainer.pretrain_steps;
  if (regularization.jacobian_weight > 0) {
    terms_.push_back(std::make_unique<JacobianTerm>(regularization, pretrain));
  }
  if (regularization.spectral_radius_weight > 0) {
    terms_.push_back(std::make_unique<SpectralRadiusTerm>(regularization, pretrain));
  }
  if (regularization.correction_weight > 0) {
    terms_.push_back(std::make_unique<CorrectionTerm>(regularization, pretrain));
  }
}

StepRegularizers::~StepRegularizers() = default;

ExtraLoss StepRegularizers::At(int64_t step, Rng& rng) {
  std::vector<const StepLossTerm*> on;
  for (const auto& term : terms_) {
    if (term->AppliesAt(step, rng)) on.push_back(term.get());
  }
  if (on.empty()) return nullptr;
  return [on](SequenceModel& model, const Batch& rows, Rng& draws, double scale) {
    Var total = on.front()->Loss(model, rows, draws, scale);
    for (size_t i = 1; i < on.size(); ++i) {
      total = add(total, on[i]->Loss(model, rows, draws, scale));
    }
    return total;
  };
}

}  // namespace stillpoint
