// An experiment: what one config describes before training starts — the
// datasets and the model built for them — and its evaluation on a held-out
// set. The trainer, `stillpoint eval` and `stillpoint compare` all start from
// here, so they agree on what a config means. How a batch becomes logits, a
// loss and an accuracy is training/batch_loss.h; the solver statistics,
// training/solver_stats.h.
#pragma once

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "layers/models.h"
#include "solvers/solver_summary.h"
#include "training/batch_loss.h"
#include "training/config/config.h"
#include "training/data/dataset.h"
#include "training/solver_stats.h"

namespace stillpoint {

struct Experiment {
  Config config;
  std::string config_path;  // "" when built from text
  std::unique_ptr<Dataset> train;
  std::unique_ptr<Dataset> test;
  std::shared_ptr<SequenceModel> model;
  // Builds another model of the same structure as `model`, with its own
  // dropout streams for each replica index: the replicas of a data-parallel
  // step (train.shards; training/data_parallel.h).
  std::function<std::shared_ptr<SequenceModel>(int64_t replica)> make_replica;
  DType dtype = DType::kFloat32;
  // What the dataset says about itself (DatasetSplit, dataset_registry.h).
  std::vector<std::string> class_names;
  bool language_model = false;
  int64_t test_unknown_symbols = 0;
  std::map<std::string, std::string> run_files;
  BatchAugment train_augment;  // of every training batch (empty: none)
};

// Builds datasets and model from a validated config. length_override > 0
// regenerates the held-out set at that sequence length (sequence tasks
// only), for length extrapolation. Relative task paths are resolved against
// the config file's directory. Throws ConfigError for settings that do not
// fit together (e.g. max_length below the task length).
// size_override > 0 does the same at that problem size (tasks with a size,
// e.g. a maze's cells per side).
Experiment BuildExperiment(const Config& config, const std::string& config_path,
                           int64_t length_override = 0, int64_t size_override = 0);

// A language model must not see the symbol it predicts: every attention
// (softmax, and each energy attention inside its own fixed point) gets the
// causal mask (model.attention_mask none becomes causal, a causal window is
// kept; local is a ConfigError).
void MakeCausal(const Config& config, ModelOptions* options);

struct EvalResult {
  double loss = 0;
  double accuracy = 0;        // per target (token, or example for classification)
  double solved_fraction = 0; // of the examples, those right at every target
  int64_t examples = 0;
  SolverStats forward;  // averaged over batches (max for maxima)
  // Implicit and energy models: the agreement of the fixed points reached
  // from zeros and from a random start (SequenceModel::ComparePaths) on the
  // first kPathIndependenceExamples examples; NaN for other kinds.
  PathIndependence path_independence;
  // Classification (one target per example): how often each class was
  // predicted for each true class, counts [target * classes + predicted],
  // from the same pass as the figures above (all ranks' batches); empty for
  // per-token targets.
  std::vector<int64_t> confusion;
};

// Examples of the path-independence probe of every evaluation, and the
// seed of its random starts (the same starts at every evaluation).
inline constexpr int64_t kPathIndependenceExamples = 64;
inline constexpr uint64_t kPathIndependenceSeed = 0x9a7417;

// The test-time depth for inputs of `tokens` tokens per example (0: the
// training inputs'), given the trained depth (the forward solver's budget of
// an implicit model, the unroll depth of a tied one): eval.max_iterations
// when set (`eval --iters`); else the budget rule: with
// eval.iterations_per_token r > 0, max(trained, ceil(r * tokens)); with r = 0
// the trained depth per training token, max(trained, ceil(trained * tokens /
// training tokens)). So a longer input gets a larger budget by default, and
// the training inputs the trained one.
int64_t EvalDepth(const Config& config, int64_t trained_depth, int64_t tokens);

// Applies EvalDepth to the model (explicit models have a fixed depth).
void SetEvalDepth(SequenceModel& model, const Config& config, int64_t tokens = 0);
// The model's depth now: the forward solver's budget (implicit), the unrolled
// steps (tied) or the layers (explicit).
int64_t TestTimeDepth(const SequenceModel& model);

// Evaluates in eval mode with the tape off (restores the mode after).
EvalResult Evaluate(SequenceModel& model, const Dataset& dataset, int64_t batch_size,
                    DType dtype);

}  // namespace stillpoint
