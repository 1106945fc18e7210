#include "training/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <numeric>

#include "framework/autograd.h"
#include "training/checkpoint.h"
#include "training/config_schema.h"
#include "training/experiment.h"
#include "training/generate_step.h"

namespace stillpoint {
namespace {

// A run's vocabulary.json: a few thousand symbols at most; anything larger
// is not one.
ReadLimit VocabularyLimit() {
  ReadLimit limit;
  limit.max_bytes = uint64_t{1} << 24;
  return limit;
}

}  // namespace

bool GenerateOptions::IsValid(std::string* error) const {
  auto fail = [&](const std::string& message) {
    if (error) *error = message;
    return false;
  };
  if (tokens < 1) return fail("--tokens must be >= 1, got " + std::to_string(tokens));
  if (!(temperature > 0) || !std::isfinite(temperature)) {
    return fail("--temperature must be a finite number > 0, got " + std::to_string(temperature));
  }
  if (top_k < 0) return fail("--top-k must be >= 0 (0: all), got " + std::to_string(top_k));
  return true;
}

double GenerateResult::IterationsMean() const {
  if (iterations.empty()) return 0.0;
  return std::accumulate(iterations.begin(), iterations.end(), 0.0) /
         static_cast<double>(iterations.size());
}

int64_t SampleSymbol(const std::vector<double>& logits, double temperature, int64_t top_k,
                     Rng& rng) {
  const int64_t n = static_cast<int64_t>(logits.size());
  SP_CHECK(n >= 2, "SampleSymbol: needs the unknown id and at least one symbol");
  // Candidates: every id but the unknown one, the top_k largest first.
  std::vector<int64_t> ids(n - 1);
  std::iota(ids.begin(), ids.end(), 1);
  std::stable_sort(ids.begin(), ids.end(),
                   [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  if (top_k > 0 && top_k < static_cast<int64_t>(ids.size())) ids.resize(top_k);
  const double top = logits[ids[0]] / temperature;
  std::vector<double> weights;
  double total = 0;
  for (int64_t id : ids) {
    weights.push_back(std::exp(logits[id] / temperature - top));
    total += weights.back();
  }
  double u = rng.Uniform() * total;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    u -= weights[i];
    if (u < 0) return ids[i];
  }
  return ids.back();
}

TextGenerator::TextGenerator(std::shared_ptr<SequenceModel> model, Vocabulary vocabulary,
                             int64_t context)
    : model_(std::move(model)), vocabulary_(std::move(vocabulary)), context_(context) {
  SP_CHECK(model_ != nullptr, "TextGenerator: no model");
  SP_CHECK(context_ >= 1, "TextGenerator: context must be >= 1");
}

void TextGenerator::CheckOptions(const GenerateOptions& options) const {
  std::string error;
  SP_CHECK(options.IsValid(&error), error);
  SP_CHECK(options.keep == 0 || (options.keep >= 1 && options.keep < context_),
           "--keep must be in [1, ", context_, ") (task.context ", context_,
           "), or 0 for half of it; got ", options.keep);
}

GenerateResult TextGenerator::Generate(const std::string& prompt,
                                       const GenerateOptions& options) {
  CheckOptions(options);
  GenerateResult result;
  std::vector<int64_t> ids = vocabulary_.EncodeText(prompt, &result.prompt_unknown);
  SP_CHECK(!ids.empty(), "the prompt is empty; give at least one character (--prompt)");
  result.prompt_symbols = static_cast<int64_t>(ids.size());
  result.prompt_dropped = std::max<int64_t>(0, result.prompt_symbols - context_);
  const auto start = std::chrono::steady_clock::now();
  const bool was_training = model_->is_training();
  model_->Eval();
  NoGrad no_grad;
  Rng rng(options.seed);
  const std::size_t prompt_end = ids.size();
  const bool incremental =
      options.incremental && StepDecoder::Supports(*model_, &result.full_window_reason);
  if (incremental) {
    GenerateIncremental(ids, options, rng, result);
  } else {
    if (!options.incremental) result.full_window_reason = "asked for (incremental off)";
    GenerateFullWindow(ids, options, rng, result);
  }
  model_->Train(was_training);
  result.text = vocabulary_.Decode(std::vector<int64_t>(ids.begin() + prompt_end, ids.end()));
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

void TextGenerator::GenerateIncremental(std::vector<int64_t>& ids, const GenerateOptions& options,
                                        Rng& rng, GenerateResult& result) {
  result.mode = "incremental";
  const bool implicit = model_->options().kind == ModelKind::kImplicit;
  const int64_t keep = options.keep > 0 ? options.keep : std::max<int64_t>(1, context_ / 2);
  StepDecoder decoder(*model_, options.warm_start);
  const int64_t first = static_cast<int64_t>(ids.size()) - std::min<int64_t>(context_, ids.size());
  std::vector<double> logits = decoder.Push(std::vector<int64_t>(ids.begin() + first, ids.end()));
  result.positions += decoder.length();
  for (int64_t k = 0; k < options.tokens; ++k) {
    if (implicit) result.iterations.push_back(static_cast<double>(decoder.last_iterations()));
    const int64_t next = SampleSymbol(logits, options.temperature, options.top_k, rng);
    ids.push_back(next);
    if (k + 1 == options.tokens) break;  // nothing samples from the last symbol's logits
    if (decoder.length() == context_) {
      // Learned positions are absolute: a new window from the last `keep`
      // symbols before `next`, at positions 0..keep-1.
      decoder.Slide(keep);
      ++result.restarts;
      result.positions += keep;
    }
    logits = decoder.Push(next);
    ++result.positions;
  }
}

void TextGenerator::GenerateFullWindow(std::vector<int64_t>& ids, const GenerateOptions& options,
                                       Rng& rng, GenerateResult& result) {
  result.mode = "full_window";
  const bool implicit = model_->options().kind == ModelKind::kImplicit;
  const int64_t vocab = vocabulary_.size();
  Tensor previous;  // the last window's fixed point [1, T, d]
  bool slid = false;
  for (int64_t k = 0; k < options.tokens; ++k) {
    const int64_t length = std::min<int64_t>(context_, static_cast<int64_t>(ids.size()));
    const std::vector<int64_t> window(ids.end() - length, ids.end());
    if (implicit && options.warm_start && previous.defined()) {
      // The previous fixed point, shifted when the window slid; the new last
      // position starts where the previous last one ended.
      const int64_t d = previous.dim(2), T = previous.dim(1);
      const std::vector<double> z = previous.ToVector();
      std::vector<double> z0;
      z0.insert(z0.end(), z.begin() + (slid ? d : 0), z.end());
      z0.insert(z0.end(), z.end() - d, z.end());
      SP_CHECK(static_cast<int64_t>(z0.size()) == length * d, "generate: warm start of ", T,
               " positions for a window of ", length);
      model_->SetNextInitialState(Tensor::FromVector(Shape{1, length, d}, z0, previous.dtype()));
    }
    const Var logits = model_->Forward(window, Shape{1, length});
    result.positions += length;
    if (implicit) {
      previous = model_->FixedPoint().Clone();
      result.iterations.push_back(
          static_cast<double>(model_->implicit()->forward_summary().sample_iterations.at(0)));
    }
    const std::vector<double> all = logits.value().ToVector();
    const std::vector<double> last(all.end() - vocab, all.end());
    ids.push_back(SampleSymbol(last, options.temperature, options.top_k, rng));
    slid = static_cast<int64_t>(ids.size()) > context_;
  }
}

TextGenerator LoadTextGenerator(const std::string& run) {
  namespace fs = std::filesystem;
  const std::string checkpoint_path =
      fs::is_directory(run) ? (fs::path(run) / "checkpoint.ckpt").string() : run;
  if (!fs::exists(checkpoint_path)) {
    throw ConfigError(checkpoint_path + ": no checkpoint (is '" + run +
                      "' the run directory of a finished `stillpoint train`?)");
  }
  const CheckpointState state = LoadCheckpoint(checkpoint_path);
  Config config = Config::FromYaml(StillpointSchema(), state.config_yaml,
                                   checkpoint_path + " (stored config)");
  if (config.GetString("task.kind") != "text") {
    throw ConfigError(checkpoint_path + ": a run of task.kind " + config.GetString("task.kind") +
                      "; generate needs a character-level language model (task.kind text)");
  }
  const std::string vocabulary_path =
      (fs::path(checkpoint_path).parent_path() / kVocabularyFile).string();
  if (!fs::exists(vocabulary_path)) {
    throw ConfigError(vocabulary_path + ": missing; the run's vocabulary is written there by "
                      "`stillpoint train`");
  }
  Vocabulary vocabulary =
      Vocabulary::FromJson(ReadFileMaybeGzip(vocabulary_path, VocabularyLimit()), vocabulary_path);
  // The model as the trainer built it (experiment.h), without reading the
  // text again: the vocabulary gives its size.
  ModelOptions options = ModelOptionsFromConfig(config);
  options.vocab_size = options.num_classes = vocabulary.size();
  options.feature_dim = 0;
  MakeCausal(config, &options);  // as BuildExperiment builds language models
  auto model = std::make_shared<SequenceModel>(options);
  try {
    model->LoadParameters(state.model);
  } catch (const Error& e) {
    throw ConfigError(checkpoint_path + ": does not fit the vocabulary in " + vocabulary_path +
                      ": " + e.what());
  }
  return TextGenerator(std::move(model), std::move(vocabulary), config.GetInt("task.context"));
}

}  // namespace stillpoint
