// A batch's path through a training step and an evaluation: its logits, its
// loss and its count of right answers. TrainStep (training/train_step.h) and
// Evaluate (training/experiment.h) both run a batch through these.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "framework/autograd.h"
#include "layers/models.h"
#include "training/data/dataset.h"

namespace stillpoint {

// The logits of a batch, flattened to [rows, classes] in target order.
Var ForwardBatch(SequenceModel& model, const Batch& batch);
// The injection u [B, T, d] of a batch: its features or its tokens embedded.
Var EmbedBatch(const SequenceModel& model, const Batch& batch);
// Mean cross-entropy over the batch's non-ignored targets.
Var BatchLoss(const Var& logits, const Batch& batch);
// (correct, counted) predictions of the argmax over classes.
std::pair<int64_t, int64_t> CountCorrect(const Tensor& logits, const Batch& batch);
// (solved, counted) examples: an example is solved when the argmax is right
// at every one of its targets; examples without a target are not counted.
std::pair<int64_t, int64_t> CountSolved(const Tensor& logits, const Batch& batch);
// Adds the batch's argmax predictions to counts [target * classes + predicted]
// (classes: the logits' columns; targets ignored by the loss are skipped).
void CountConfusion(const Tensor& logits, const Batch& batch, std::vector<int64_t>& counts);

}  // namespace stillpoint
