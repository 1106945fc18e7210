// An experiment: what one config describes before training starts — the
// datasets, the model built for them, and how a batch becomes logits, a loss
// and an accuracy. The trainer, `stillpoint eval` and `stillpoint compare`
// all start from here, so they agree on what a config means.
#pragma once

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "layers/models.h"
#include "solvers/summary.h"
#include "training/config.h"
#include "training/dataset.h"

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

// Forward-solver statistics of the last Forward of an implicit model (all
// zero for explicit and tied models).
struct SolverStats {
  double iterations_mean = 0;
  double iterations_max = 0;
  // Relative residual, max over samples; NaN when none was measured (the
  // inexact backward modes jfb, phantom and unrolled).
  double residual_max = 0;
  // The relative tolerance the residual had to meet (the forward solver's
  // relative_tolerance in stop_mode relative, the adjoint's tolerance); 0
  // when there was none (a fixed budget, an inexact mode, or a forward solve
  // judged by its absolute tolerance).
  double tolerance = 0;
  int64_t converged = 0;      // samples
  int64_t not_converged = 0;  // samples that missed their tolerance or failed
  int64_t inexact = 0;        // samples ended INEXACT: an approximation by design
  // Samples per termination status ("CONVERGED", "MAX_ITERATIONS", ...),
  // only the statuses that occurred.
  std::map<std::string, int64_t> status_counts;
  std::string brief;        // the summary's BriefReport()

  // Whether residual_max was measured.
  bool HasResidual() const { return !std::isnan(residual_max); }
  // Whether a tolerance was set and the worst residual is above it.
  bool ToleranceMissed() const {
    return tolerance > 0 && HasResidual() && residual_max > tolerance;
  }
  // Adds another batch's (or shard's) statistics: sums the counts, takes
  // maxima of the maxima (a measured residual wins over an unmeasured one)
  // and weighs the means by sample count; keeps this brief unless empty.
  void Merge(const SolverStats& other);
};
SolverStats ForwardStats(const SequenceModel& model);
SolverStats BackwardStats(const SequenceModel& model);
// The inner solves of the model's energy attentions (energy_attention.h),
// each as its last Forward left it, combined (mean of the iteration means,
// worst maxima and residuals, sample counts added); empty without them.
SolverStats AttentionForwardStats(const SequenceModel& model);
SolverStats AttentionBackwardStats(const SequenceModel& model);

// The worst residual beside its tolerance, for tables and summaries:
// "3.10e-09 <= 1e-05", "5.80e-03 > 1e-05 NOT MET", "5.80e-03" (no
// tolerance), "n/a" (not measured: an inexact mode), "-" (no solve).
std::string ResidualCell(const SolverStats& stats);
// Samples per status: "CONVERGED 30, MAX_ITERATIONS 2"; "-" (no solve).
std::string StatusCell(const SolverStats& stats);

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
