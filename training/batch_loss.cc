#include "training/batch_loss.h"

#include <algorithm>
#include <vector>

#include "framework/check.h"
#include "framework/ops.h"

namespace stillpoint {

Var ForwardBatch(SequenceModel& model, const Batch& batch) {
  model.SetGridWidth(batch.grid_width);
  Var logits = batch.features.defined()
                   ? model.ForwardFeatures(constant(batch.features))
                   : model.Forward(batch.tokens, Shape{batch.batch_size, batch.length});
  const int64_t classes = logits.dim(-1);
  return reshape(logits, Shape{logits.numel() / classes, classes});
}

Var EmbedBatch(const SequenceModel& model, const Batch& batch) {
  return batch.features.defined()
             ? model.EmbedFeatures(constant(batch.features))
             : model.Embed(batch.tokens, Shape{batch.batch_size, batch.length});
}

Var BatchLoss(const Var& logits, const Batch& batch) {
  return cross_entropy(logits, batch.targets, kIgnoreTarget);
}

namespace {

// The argmax over classes of each row of logits [rows, classes] (the first
// of equal maxima).
std::vector<int64_t> PredictedClasses(const Tensor& logits) {
  const int64_t rows = logits.dim(0), classes = logits.dim(1);
  const std::vector<double> values = logits.ToVector();
  std::vector<int64_t> predicted(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const auto begin = values.begin() + r * classes;
    predicted[r] = std::max_element(begin, begin + classes) - begin;
  }
  return predicted;
}

}  // namespace

std::pair<int64_t, int64_t> CountCorrect(const Tensor& logits, const Batch& batch) {
  const int64_t rows = logits.dim(0);
  SP_CHECK(rows == static_cast<int64_t>(batch.targets.size()), "CountCorrect: ", rows,
           " rows of logits for ", batch.targets.size(), " targets");
  const std::vector<int64_t> predicted = PredictedClasses(logits);
  int64_t correct = 0, counted = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (batch.targets[r] == kIgnoreTarget) continue;
    correct += predicted[r] == batch.targets[r];
    ++counted;
  }
  return {correct, counted};
}

void CountConfusion(const Tensor& logits, const Batch& batch, std::vector<int64_t>& counts) {
  const int64_t rows = logits.dim(0), classes = logits.dim(1);
  SP_CHECK(rows == static_cast<int64_t>(batch.targets.size()) &&
               static_cast<int64_t>(counts.size()) == classes * classes,
           "CountConfusion: ", rows, " rows of logits for ", batch.targets.size(),
           " targets, ", counts.size(), " counts for ", classes, " classes");
  const std::vector<int64_t> predicted = PredictedClasses(logits);
  for (int64_t r = 0; r < rows; ++r) {
    if (batch.targets[r] == kIgnoreTarget) continue;
    ++counts[batch.targets[r] * classes + predicted[r]];
  }
}

std::pair<int64_t, int64_t> CountSolved(const Tensor& logits, const Batch& batch) {
  const int64_t rows = logits.dim(0);
  SP_CHECK(rows == static_cast<int64_t>(batch.targets.size()) && batch.batch_size > 0 &&
               rows % batch.batch_size == 0,
           "CountSolved: ", rows, " rows of logits for ", batch.targets.size(), " targets of ",
           batch.batch_size, " examples");
  const int64_t per_example = rows / batch.batch_size;
  const std::vector<int64_t> predicted = PredictedClasses(logits);
  int64_t solved = 0, counted = 0;
  for (int64_t e = 0; e < batch.batch_size; ++e) {
    bool any = false, right = true;
    for (int64_t r = e * per_example; r < (e + 1) * per_example && right; ++r) {
      if (batch.targets[r] == kIgnoreTarget) continue;
      any = true;
      right = predicted[r] == batch.targets[r];
    }
    // An example judged wrong early has a target, so it is counted.
    counted += any || !right;
    solved += any && right;
  }
  return {solved, counted};
}

}  // namespace stillpoint
