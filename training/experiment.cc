#include "training/experiment.h"
#include "training/weights_file.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>

#include "framework/ops.h"
#include "training/config_schema.h"
#include "training/data/dataset_registry.h"
#include "training/distributed.h"
#include "training/trainer_options.h"

namespace stillpoint {
namespace {

// The key that names `type` as a forward solver: the primary type, else the
// fallback chain, else "" (not used).
std::string KeyUsing(const ImplicitOptions& options, ForwardSolverType type) {
  if (options.forward.type == type) return "model.solver.forward.type";
  for (ForwardSolverType t : options.forward.fallback_chain) {
    if (t == type) return "model.solver.forward.fallback_chain";
  }
  return "";
}

// Forward solvers that cannot run on this model are refused here, while the
// config is validated (exit 2), not at the first step after the run
// directory exists. `length`: the longest sequence, so a sample's state is
// at most length x dim values.
void ValidateForwardSolvers(const Config& config, const ModelOptions& model, int64_t length) {
  if (model.kind != ModelKind::kImplicit && model.kind != ModelKind::kEnergy) return;
  const std::string lbfgs = KeyUsing(model.implicit, ForwardSolverType::kCeresLbfgs);
  if (!lbfgs.empty() && model.kind != ModelKind::kEnergy) {
    throw ConfigError(config.Origin(lbfgs) + ": " + lbfgs +
                      " names ceres_lbfgs, which minimises the layer's energy, but model.kind " +
                      config.GetString("model.kind") +
                      " has no energy (only model.kind energy does); choose another forward "
                      "solver");
  }
  const std::string trust = KeyUsing(model.implicit, ForwardSolverType::kCeresTrustRegion);
  const int64_t state_size = length * model.dim;
  const int64_t limit = model.implicit.forward.ceres_max_state_size;
  if (!trust.empty() && state_size > limit) {
    throw ConfigError(config.Origin(trust) + ": " + trust +
                      " names ceres_trust_region, which assembles a dense n x n Jacobian per "
                      "sample, but a sample's state here has n = " +
                      std::to_string(length) + " tokens x model.dim " + std::to_string(model.dim) +
                      " = " + std::to_string(state_size) + " values, above its limit of " +
                      std::to_string(limit) + "; choose another forward solver");
  }
}

}  // namespace

Experiment BuildExperiment(const Config& config, const std::string& config_path,
                           int64_t length_override, int64_t size_override) {
  Experiment e{config, config_path, nullptr, nullptr, nullptr, nullptr, DType::kFloat32};
  StringToDType(config.GetString("dtype"), &e.dtype);
  const uint64_t seed = static_cast<uint64_t>(config.GetInt("seed"));
  DatasetRequest request{&config, config_path, length_override, seed, size_override};
  DatasetSplit split = MakeTaskSplit(request);
  e.train = std::move(split.train);
  e.test = FirstExamples(std::move(split.test), EvalOptions::FromConfig(config).max_examples);
  const int64_t vocab = split.vocab_size, classes = split.num_classes;
  const int64_t feature_dim = split.feature_dim, longest = split.longest;
  const bool per_token = split.per_token_targets;
  e.class_names = std::move(split.class_names);
  e.language_model = split.language_model;
  e.test_unknown_symbols = split.test_unknown_symbols;
  e.run_files = std::move(split.run_files);
  e.train_augment = std::move(split.train_augment);

  ModelOptions options = ModelOptionsFromConfig(config);
  if (split.language_model) MakeCausal(config, &options);
  if (options.positions == PositionScheme::kLearned && longest > options.max_length) {
    throw ConfigError(config.Origin("model.max_length") + ": model.max_length (" +
                      std::to_string(options.max_length) + ") is shorter than the sequences (" +
                      std::to_string(longest) +
                      " tokens); the learned positions cover model.max_length tokens (raise it, "
                      "or use model.positions none, alibi or rotary, which have no limit)");
  }
  ValidateForwardSolvers(config, options, longest);
  if (per_token && options.pooling != "mean") {
    throw ConfigError(config.Origin("model.pooling") + ": model.pooling " + options.pooling +
                      " needs a classification task (one target per sequence, e.g. digits); "
                      "this task has a target per token, so nothing is pooled");
  }
  options.vocab_size = std::max<int64_t>(vocab, 1);
  options.feature_dim = feature_dim;
  options.num_classes = classes;
  auto make = [per_token](const ModelOptions& o) -> std::shared_ptr<SequenceModel> {
    if (per_token) return std::make_shared<SequenceModel>(o);
    return std::make_shared<SequenceClassifier>(o);
  };
  e.model = make(options);
  const std::string init_from = ResolvePath(config.GetString("model.init_from"), config_path);
  if (!init_from.empty()) {
    try {
      e.model->LoadParameters(ReadWeightsFile(init_from));
    } catch (const Error& error) {
      throw ConfigError(config.Origin("model.init_from") + ": model.init_from: " + error.what());
    }
  }
  e.make_replica = [make, options](int64_t replica) {
    ModelOptions o = options;
    // Distinct dropout masks per replica (each cell draws from seed, seed + 1).
    o.cell_options.dropout_seed += static_cast<uint64_t>(replica) * 1000003u;
    return make(o);
  };
  return e;
}

void MakeCausal(const Config& config, ModelOptions* options) {
  if (options->attention_mask == AttentionMaskKind::kLocal) {
    throw ConfigError(config.Origin("model.attention_mask") +
                      ": model.attention_mask local lets a position see later symbols; a "
                      "language model (task.kind text) needs causal (or none, which means causal "
                      "here)");
  }
  options->attention_mask = AttentionMaskKind::kCausal;
}

int64_t EvalDepth(const Config& config, int64_t trained_depth, int64_t tokens) {
  const int64_t fixed = config.GetInt("eval.max_iterations");
  if (fixed > 0) return fixed;
  const int64_t training_tokens = TaskFootprintOf(config).length;
  if (tokens <= 0 || training_tokens <= 0) return trained_depth;
  const double per_token = config.GetDouble("eval.iterations_per_token");
  const double rule = per_token > 0 ? per_token * static_cast<double>(tokens)
                                    : static_cast<double>(trained_depth) *
                                          static_cast<double>(tokens) /
                                          static_cast<double>(training_tokens);
  // Within the budget a config may set at all (eval.max_iterations' range).
  return std::clamp<int64_t>(static_cast<int64_t>(std::ceil(rule - 1e-9)), trained_depth,
                             int64_t{1} << 20);
}

void SetEvalDepth(SequenceModel& model, const Config& config, int64_t tokens) {
  if (Implicit* layer = model.mutable_implicit()) {
    layer->mutable_options().forward.max_iterations = static_cast<int>(
        EvalDepth(config, config.GetInt("model.solver.forward.max_iterations"), tokens));
  } else if (model.options().kind == ModelKind::kTied) {
    const int64_t trained = config.GetInt("model.unroll_steps");
    const int64_t depth = EvalDepth(config, trained, tokens);
    model.SetDepthOverride(depth == trained ? 0 : depth);
  }
}

int64_t TestTimeDepth(const SequenceModel& model) {
  if (const Implicit* layer = model.implicit()) return layer->options().forward.max_iterations;
  if (model.options().kind == ModelKind::kTied) {
    return model.depth_override() > 0 ? model.depth_override() : model.options().unroll_steps;
  }
  return model.options().num_layers;
}

EvalResult Evaluate(SequenceModel& model, const Dataset& dataset, int64_t batch_size,
                    DType dtype) {
  const bool was_training = model.is_training();
  model.Eval();
  NoGrad no_grad;
  // Under mpirun the batches are dealt to the ranks in turn (batch k to rank
  // k mod ranks); each batch's figures are then combined on every rank in
  // batch order, so the result is the bits one process gets.
  constexpr int kFields = 10;
  std::vector<double> mine;  // kFields per batch this rank evaluated
  const int rank = WorldRank();
  const int ranks = WorldSize();
  // The path-independence probe first, so that the model's last solve stays
  // the last batch's. Every rank computes it on the same rows.
  PathIndependence path_independence;
  if (model.implicit() != nullptr && model.depth_override() == 0 && dataset.size() > 0) {
    std::vector<int64_t> probe;
    for (int64_t i = 0; i < std::min(dataset.size(), kPathIndependenceExamples); ++i) {
      probe.push_back(i);
    }
    const Batch batch = MakeBatch(dataset, probe, dtype);
    model.SetGridWidth(batch.grid_width);
    Rng rng(kPathIndependenceSeed);
    path_independence = model.ComparePaths(EmbedBatch(model, batch), rng);
  }
  const DatasetInfo& info = dataset.info();
  std::vector<int64_t> confusion;  // this rank's batches
  if (!info.per_token_targets) confusion.assign(info.num_classes * info.num_classes, 0);
  int64_t batches = 0;
  for (int64_t begin = 0; begin < dataset.size(); begin += batch_size, ++batches) {
    if (batches % ranks != rank) continue;
    std::vector<int64_t> indices;
    for (int64_t i = begin; i < std::min(dataset.size(), begin + batch_size); ++i) {
      indices.push_back(i);
    }
    const Batch batch = MakeBatch(dataset, indices, dtype);
    const Var logits = ForwardBatch(model, batch);
    const auto [c, n] = CountCorrect(logits.value(), batch);
    const auto [solved, judged] = CountSolved(logits.value(), batch);
    if (!confusion.empty()) CountConfusion(logits.value(), batch, confusion);
    const SolverStats stats = ForwardStats(model);
    mine.insert(mine.end(),
                {n > 0 ? BatchLoss(logits, batch).item() * static_cast<double>(n) : 0.0,
                 static_cast<double>(c), static_cast<double>(n), stats.iterations_mean,
                 stats.iterations_max, stats.residual_max, static_cast<double>(stats.converged),
                 static_cast<double>(stats.not_converged), static_cast<double>(solved),
                 static_cast<double>(judged)});
  }
  model.Train(was_training);
  std::vector<std::vector<double>> parts = {mine};
  if (ranks > 1) {
    parts.clear();
    for (const std::string& bytes : AllGatherStrings(
             std::string(reinterpret_cast<const char*>(mine.data()), mine.size() * sizeof(double)))) {
      std::vector<double> part(bytes.size() / sizeof(double));
      std::memcpy(part.data(), bytes.data(), part.size() * sizeof(double));
      parts.push_back(std::move(part));
    }
  }
  if (ranks > 1 && !confusion.empty()) {
    std::vector<int64_t> total(confusion.size(), 0);
    for (const std::string& bytes : AllGatherStrings(std::string(
             reinterpret_cast<const char*>(confusion.data()), confusion.size() * sizeof(int64_t)))) {
      SP_CHECK(bytes.size() == total.size() * sizeof(int64_t),
               "Evaluate: a rank sent a confusion matrix of another size");
      std::vector<int64_t> part(total.size());
      std::memcpy(part.data(), bytes.data(), bytes.size());
      for (std::size_t i = 0; i < total.size(); ++i) total[i] += part[i];
    }
    confusion = std::move(total);
  }
  EvalResult result;
  result.path_independence = path_independence;
  result.confusion = std::move(confusion);
  double loss_sum = 0, iterations_sum = 0;
  int64_t correct = 0, counted = 0, solved = 0, judged = 0;
  for (int64_t k = 0; k < batches; ++k) {
    const double* f = parts[k % ranks].data() + (k / ranks) * kFields;
    loss_sum += f[0];
    correct += static_cast<int64_t>(f[1]);
    counted += static_cast<int64_t>(f[2]);
    iterations_sum += f[3];
    result.forward.iterations_max = std::max(result.forward.iterations_max, f[4]);
    result.forward.residual_max = std::max(result.forward.residual_max, f[5]);
    result.forward.converged += static_cast<int64_t>(f[6]);
    result.forward.not_converged += static_cast<int64_t>(f[7]);
    solved += static_cast<int64_t>(f[8]);
    judged += static_cast<int64_t>(f[9]);
  }
  result.examples = dataset.size();
  result.loss = counted > 0 ? loss_sum / static_cast<double>(counted) : 0.0;
  result.accuracy = counted > 0 ? static_cast<double>(correct) / counted : 0.0;
  result.solved_fraction = judged > 0 ? static_cast<double>(solved) / judged : 0.0;
  result.forward.iterations_mean = batches > 0 ? iterations_sum / batches : 0.0;
  return result;
}

}  // namespace stillpoint
