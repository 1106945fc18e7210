#include "training/demos/correction_demo.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <ostream>
#include <sstream>

#include "framework/check.h"
#include "framework/ops.h"
#include "framework/random.h"
#include "layers/linear.h"
#include "training/config/config.h"
#include "training/config_schema.h"
#include "training/demos/demo_output.h"
#include "training/demos/trained_run.h"
#include "training/experiment.h"
#include "training/optimizer.h"
#include "training/svg_plot.h"
#include "training/trainer.h"

#ifndef STILLPOINT_DATA_DIR
#define STILLPOINT_DATA_DIR "examples/data"
#endif

namespace stillpoint {
namespace {

namespace fs = std::filesystem;

// Clears a layer's test-time inference when it goes out of scope.
class TestTimeScope {
 public:
  TestTimeScope(const ProbabilisticAttention& layer,
                const ProbabilisticAttention::TestTimeInference& inference)
      : layer_(layer) {
    layer_.SetTestTimeInference(inference);
  }
  ~TestTimeScope() { layer_.ClearTestTimeInference(); }
  TestTimeScope(const TestTimeScope&) = delete;
  TestTimeScope& operator=(const TestTimeScope&) = delete;

 private:
  const ProbabilisticAttention& layer_;
};

std::vector<int64_t> Argmax(const Tensor& logits) {
  const int64_t classes = logits.dim(-1);
  const std::vector<double> v = logits.ToVector();
  std::vector<int64_t> out;
  for (std::size_t r = 0; r < v.size() / classes; ++r) {
    const auto first = v.begin() + static_cast<std::ptrdiff_t>(r * classes);
    out.push_back(std::max_element(first, first + classes) - first);
  }
  return out;
}

std::string YamlQuoted(const std::string& text) {
  std::string quoted = "'";
  for (char ch : text) quoted += ch == '\'' ? std::string("''") : std::string(1, ch);
  return quoted + "'";
}

// ------------------------------------------------------- the segment task

// One example per line: T token ids, then T per-token targets.
std::string SegmentTaskCsv(const CorrectionDemoOptions& o, int64_t examples, Rng& rng) {
  const int64_t length = o.segments * o.segment_length;
  std::ostringstream csv;
  for (int64_t e = 0; e < examples; ++e) {
    std::vector<int64_t> tokens, targets;
    for (int64_t s = 0; s < o.segments; ++s) {
      const int64_t label = rng.UniformInt(o.classes);
      for (int64_t p = 0; p < o.segment_length; ++p) {
        int64_t token = label;
        if (rng.Uniform() >= o.observation_accuracy) {
          token = rng.UniformInt(o.classes - 1);  // another label, uniformly
          if (token >= label) ++token;
        }
        tokens.push_back(token);
        targets.push_back(label);
      }
    }
    for (int64_t t = 0; t < length; ++t) csv << tokens[t] << ",";
    for (int64_t t = 0; t < length; ++t) csv << targets[t] << (t + 1 < length ? "," : "\n");
  }
  return csv.str();
}

std::string SegmentRunConfig(const CorrectionDemoOptions& o, const fs::path& dir) {
  const int64_t length = o.segments * o.segment_length;
  std::ostringstream y;
  y << "seed: " << o.seed << "\nthreads: 1\n"
    << "task:\n  kind: csv\n  path: " << YamlQuoted((dir / "data" / "train.csv").string())
    << "\n  test_path: " << YamlQuoted((dir / "data" / "test.csv").string())
    << "\n  length: " << length << "\n  vocab_size: " << o.classes
    << "\n  num_classes: " << o.classes << "\n"
    << "model:\n  kind: energy\n  dim: 32\n  heads: 4\n  hidden: 64\n  max_length: " << length
    << "\n  energy:\n    layer: probabilistic\n"
    << "  solver:\n    forward:\n      type: picard\n      max_iterations: 30\n"
    << "      relative_tolerance: 1.0e-4\n    backward:\n      mode: ift\n      solver: gmres\n"
    << "      max_iterations: 30\n      tolerance: 1.0e-5\n"
    << "train:\n  steps: " << o.train_steps << "\n  batch_size: 32\n"
    << "  optimizer:\n    type: adamw\n    lr: 3.0e-3\n"
    << "  schedule:\n    type: cosine\n    warmup_steps: 50\n"
    << "  eval_every: " << o.train_steps << "\n  checkpoint_every: 0\n"
    << "log:\n  dir: " << YamlQuoted((dir / "run").string())
    << "\n  progress: none\n  plots: false\n";
  return y.str();
}

// The k-th position an annotator labels: one per segment in turn.
int64_t ClampOrder(const CorrectionDemoOptions& o, int64_t k) {
  return (k % o.segments) * o.segment_length + k / o.segments;
}

struct ClampingCurve {
  std::vector<double> clamped, accuracy;
};

ClampingCurve MeasureClamping(const CorrectionDemoOptions& o,
                              SequenceModel& model,
                              const Dataset& test,
                              std::ostream& out) {
  const int64_t length = o.segments * o.segment_length;
  ValueBeliefOptions belief;
  belief.iterations = o.belief_iterations;
  belief.value_prior_precision = o.value_prior_precision;
  ClampingCurve curve;
  for (int64_t k = 0; k <= length / 2; ++k) {
    std::vector<char> is_clamped(length, 0);
    for (int64_t i = 0; i < k; ++i) is_clamped[ClampOrder(o, i)] = 1;
    int64_t correct = 0, counted = 0;
    for (int64_t begin = 0; begin < test.size(); begin += 64) {
      std::vector<int64_t> indices;
      for (int64_t i = begin; i < std::min(test.size(), begin + 64); ++i) indices.push_back(i);
      const Batch batch = MakeBatch(test, indices, DType::kFloat32);
      std::vector<int64_t> labels(batch.targets.size(), -1);
      for (std::size_t i = 0; i < labels.size(); ++i) {
        if (is_clamped[i % length]) labels[i] = batch.targets[i];
      }
      const Tensor logits = LogitsWithClamps(model, batch.tokens,
                                             Shape{batch.batch_size, batch.length}, labels,
                                             belief);
      const std::vector<int64_t> predicted = Argmax(logits);
      for (std::size_t i = 0; i < predicted.size(); ++i) {
        if (is_clamped[i % length]) continue;
        correct += predicted[i] == batch.targets[i];
        ++counted;
      }
    }
    curve.clamped.push_back(static_cast<double>(k));
    curve.accuracy.push_back(static_cast<double>(correct) / static_cast<double>(counted));
    out << "clamped " << k << " of " << length << ": accuracy of the other positions "
        << curve.accuracy.back() << "\n";
  }
  return curve;
}

// ------------------------------------------------- the prototype classifier

// Digits as queries, learned prototypes as keys and values of a
// probabilistic attention with Gaussian logits: x [1, N, F] -> [1, N, C].
class PrototypeClassifier : public Module {
 public:
  PrototypeClassifier(const std::vector<double>& initial_prototypes,
                      int64_t prototypes,
                      int64_t features,
                      int64_t classes,
                      Rng& rng) {
    ProbabilisticAttentionOptions a;
    a.dim = features;
    a.heads = 1;
    a.head_dim = 16;
    a.value_head_dim = 16;
    a.magnitude_prior = false;  // distance logits: a common query shift is a key shift
    a.value_precision = 0.0;    // one EM step is exact
    a.solve = FixedSteps(1);
    attention_ = RegisterModule("attention", std::make_shared<ProbabilisticAttention>(a, rng));
    prototypes_ = RegisterParameter(
        "prototypes",
        Tensor::FromVector(Shape{1, prototypes, features}, initial_prototypes, DType::kFloat32));
    head_ = RegisterModule("head", std::make_shared<Linear>(features, classes, rng));
  }
  std::string Name() const override { return "PrototypeClassifier"; }
  Var Forward(const Var& x) const { return head_->Forward(attention_->Forward(x, prototypes_)); }
  const ProbabilisticAttention& attention() const { return *attention_; }

 private:
  std::shared_ptr<ProbabilisticAttention> attention_;
  Var prototypes_;
  std::shared_ptr<Linear> head_;
};

// Images [indices] as one sequence of queries [1, N, F], every pixel + shift.
Var Images(const Dataset& data, const std::vector<int64_t>& indices, double shift) {
  std::vector<double> values;
  for (int64_t i : indices) {
    for (double f : data.Get(i).features) values.push_back(f + shift);
  }
  const int64_t features = static_cast<int64_t>(data.Get(indices.front()).features.size());
  return Var(Tensor::FromVector(Shape{1, static_cast<int64_t>(indices.size()), features}, values,
                                DType::kFloat32));
}

std::vector<int64_t> Labels(const Dataset& data, const std::vector<int64_t>& indices) {
  std::vector<int64_t> labels;
  for (int64_t i : indices) labels.push_back(data.Get(i).targets.front());
  return labels;
}

double PrototypeAccuracy(const PrototypeClassifier& model,
                         const Dataset& test,
                         int64_t batch,
                         double shift,
                         const KeyAdaptationOptions& adaptation) {
  NoGrad no_grad;
  ProbabilisticAttention::TestTimeInference inference;
  inference.key_adaptation = adaptation;
  const TestTimeScope scope(model.attention(), inference);
  int64_t correct = 0;
  for (int64_t begin = 0; begin < test.size(); begin += batch) {
    std::vector<int64_t> indices;
    for (int64_t i = begin; i < std::min(test.size(), begin + batch); ++i) indices.push_back(i);
    const std::vector<int64_t> predicted =
        Argmax(model.Forward(Images(test, indices, shift)).value());
    const std::vector<int64_t> labels = Labels(test, indices);
    for (std::size_t i = 0; i < labels.size(); ++i) correct += predicted[i] == labels[i];
  }
  return static_cast<double>(correct) / static_cast<double>(test.size());
}

struct AdaptationCurve {
  std::vector<double> iterations, shifted, clean;
};

AdaptationCurve MeasureKeyAdaptation(const CorrectionDemoOptions& o, std::ostream& out) {
  const char* env = std::getenv("STILLPOINT_DATA_DIR");
  const std::string path = std::string(env && *env ? env : STILLPOINT_DATA_DIR) + "/digits.csv.gz";
  const DigitsSplit digits = LoadDigits(path, 0.2, o.seed);
  const Dataset& train = *digits.train;
  const int64_t features = static_cast<int64_t>(train.Get(0).features.size());
  const int64_t classes = train.info().num_classes;

  // Prototypes start at training images, the same number of each class.
  Rng rng(o.seed + 1);
  std::vector<double> initial;
  std::vector<int64_t> per_class(classes, 0);
  for (int64_t i = 0; i < train.size() &&
                      static_cast<int64_t>(initial.size()) < o.prototypes * features;
       ++i) {
    const int64_t label = train.Get(i).targets.front();
    if (per_class[label] * classes >= o.prototypes) continue;
    ++per_class[label];
    const std::vector<double>& f = train.Get(i).features;
    initial.insert(initial.end(), f.begin(), f.end());
  }
  SP_CHECK(static_cast<int64_t>(initial.size()) == o.prototypes * features,
           "too few digits images to initialise ", o.prototypes, " prototypes");
  PrototypeClassifier model(initial, o.prototypes, features, classes, rng);
  OptimizerOptions adam;
  adam.type = "adam";
  adam.learning_rate = 1e-2;
  adam.weight_decay = 0.0;
  std::unique_ptr<Optimizer> optimizer = Optimizer::Create(adam, model.named_parameters());
  for (int64_t step = 0; step < o.prototype_steps; ++step) {
    std::vector<int64_t> indices;
    for (int64_t i = 0; i < o.adaptation_batch; ++i) {
      indices.push_back(rng.UniformInt(train.size()));
    }
    const Var loss =
        cross_entropy(model.Forward(Images(train, indices, 0.0)), Labels(train, indices));
    optimizer->ZeroGrad();
    backward(loss);
    optimizer->Step();
  }

  // EM iterations 0, 1, 2, 4, ... and the full count.
  std::vector<int> schedule = {0};
  for (int k = 1; k < o.adaptation_iterations; k *= 2) schedule.push_back(k);
  schedule.push_back(o.adaptation_iterations);
  AdaptationCurve curve;
  for (int iterations : schedule) {
    KeyAdaptationOptions adaptation;
    adaptation.iterations = iterations;
    adaptation.key_prior_precision = o.key_prior_precision;
    curve.iterations.push_back(iterations);
    curve.shifted.push_back(
        PrototypeAccuracy(model, *digits.test, o.adaptation_batch, o.shift_offset, adaptation));
    curve.clean.push_back(
        PrototypeAccuracy(model, *digits.test, o.adaptation_batch, 0.0, adaptation));
    out << "key adaptation, " << iterations << " EM iterations: shifted accuracy "
        << curve.shifted.back() << ", clean accuracy " << curve.clean.back() << "\n";
  }
  return curve;
}

}  // namespace

// ------------------------------------------------ belief propagation on runs

const ProbabilisticAttention& RequireProbabilisticAttention(const SequenceModel& model,
                                                            const std::string& run) {
  const ModelOptions& o = model.options();
  const ProbabilisticAttention* attention = nullptr;
  if (o.kind == ModelKind::kEnergy && model.energy_block()) {
    attention = dynamic_cast<const ProbabilisticAttention*>(model.energy_block()->layer().get());
  }
  if (attention == nullptr) {
    throw ConfigError("run '" + run + "': its model (model.kind " + ToString(o.kind) +
                      (o.kind == ModelKind::kEnergy ? ", energy.layer " + o.energy.layer
                                                    : std::string()) +
                      ") has no probabilistic attention block; clamped-value belief "
                      "propagation needs model.kind energy with energy.layer probabilistic");
  }
  return *attention;
}

Tensor ClampedValues(SequenceModel& model,
                     const std::vector<int64_t>& ids,
                     const Shape& shape,
                     const std::vector<int64_t>& clamp_labels) {
  NoGrad no_grad;
  std::vector<int64_t> labelled = ids;
  for (std::size_t i = 0; i < labelled.size(); ++i) {
    if (clamp_labels[i] >= 0) labelled[i] = clamp_labels[i];
  }
  // Each key unit's value depends on its own token and position only (the
  // block normalises each token, then projects it), so one pass gives every
  // clamped position its value.
  const EnergyBlockProblemPtr problem = model.energy_block()->Prepare(model.Embed(labelled, shape));
  const Var& values = ContextOf<ProbabilisticContext>(*problem->energy).values;  // [B, H, T, dv]
  const Var tokens = permute(values, {0, 2, 1, 3});
  return reshape(tokens, Shape{values.dim(0), values.dim(2), values.dim(1) * values.dim(3)})
      .value()
      .Clone();
}

Tensor LogitsWithClamps(SequenceModel& model,
                        const std::vector<int64_t>& ids,
                        const Shape& shape,
                        const std::vector<int64_t>& clamp_labels,
                        const ValueBeliefOptions& options) {
  NoGrad no_grad;
  const ProbabilisticAttention& attention = RequireProbabilisticAttention(model, "model");
  const bool any = std::any_of(clamp_labels.begin(), clamp_labels.end(),
                               [](int64_t label) { return label >= 0; });
  if (!any) return model.Forward(ids, shape).value().Clone();
  std::vector<double> mask;
  for (int64_t label : clamp_labels) mask.push_back(label >= 0 ? 1.0 : 0.0);
  ProbabilisticAttention::TestTimeInference inference;
  inference.value_belief = options;
  inference.clamp_mask = Tensor::FromVector(shape, mask, DType::kFloat32);
  inference.clamped_values = Var(ClampedValues(model, ids, shape, clamp_labels));
  const TestTimeScope scope(attention, inference);
  return model.Forward(ids, shape).value().Clone();
}

// ----------------------------------------------------------------- the demo

void CheckCorrectionDemoOptions(const CorrectionDemoOptions& o) {
  SP_CHECK(!o.out_dir.empty(), "--out must name a directory");
  SP_CHECK(o.segments >= 2 && o.segment_length >= 2 && o.classes >= 2,
           "segments, segment_length and classes must be >= 2");
  SP_CHECK(o.observation_accuracy > 1.0 / static_cast<double>(o.classes) &&
               o.observation_accuracy < 1.0,
           "--observation-accuracy must be in (1/classes, 1), got ", o.observation_accuracy);
  SP_CHECK(o.train_steps >= 1 && o.train_steps <= 1000000, "--train-steps must be >= 1, got ",
           o.train_steps);
  SP_CHECK(o.belief_iterations >= 1 && o.belief_iterations <= 1000,
           "--belief-iterations must be in [1, 1000], got ", o.belief_iterations);
  SP_CHECK(o.value_prior_precision > 0.0 && o.value_prior_precision <= FLT_MAX,
           "--value-prior-precision must be in (0, ", FLT_MAX, "] (at 0 one clamp overwrites "
           "every key's value; beyond, float32 holds no such number), got ",
           o.value_prior_precision);
  SP_CHECK(o.prototype_steps >= 1 && o.prototype_steps <= 1000000,
           "--prototype-steps must be >= 1, got ", o.prototype_steps);
  SP_CHECK(std::isfinite(o.shift_offset), "--shift must be finite");
  SP_CHECK(o.adaptation_iterations >= 1 && o.adaptation_iterations <= 1000,
           "--adaptation-iterations must be in [1, 1000], got ", o.adaptation_iterations);
  SP_CHECK(o.key_prior_precision >= 0.0 && o.key_prior_precision <= FLT_MAX,
           "--key-prior-precision must be in [0, ", FLT_MAX, "] (float32), got ",
           o.key_prior_precision);
  SP_CHECK(o.prototypes >= 1 && o.adaptation_batch >= 2 && o.train_examples >= 64 &&
               o.test_examples >= 64,
           "prototypes, adaptation_batch and the example counts are too small");
}

namespace {

// clamping.csv, clamping.svg, key_adaptation.csv and key_adaptation.svg.
void WriteCurves(const fs::path& dir, const ClampingCurve& clamping,
                 const AdaptationCurve& adaptation) {
  DemoTable clamp_table;
  clamp_table.Add("clamped_positions", clamping.clamped);
  clamp_table.Add("accuracy_unclamped", clamping.accuracy);
  WriteTextFile((dir / "clamping.csv").string(), clamp_table.ToCsv());
  PlotOptions plot;
  plot.title = "Clamped-value belief propagation: accuracy of the positions not clamped";
  plot.x_label = "positions clamped by the annotator";
  plot.y_label = "accuracy";
  plot.width = 760;
  WriteTextFile((dir / "clamping.svg").string(),
                LinePlotSvg({{"unclamped positions", clamping.clamped, clamping.accuracy, true}},
                            plot));

  DemoTable adapt_table;
  adapt_table.Add("adaptation_iterations", adaptation.iterations);
  adapt_table.Add("shifted_accuracy", adaptation.shifted);
  adapt_table.Add("clean_accuracy", adaptation.clean);
  WriteTextFile((dir / "key_adaptation.csv").string(), adapt_table.ToCsv());
  plot.title = "Online key adaptation on digits with every pixel shifted";
  plot.x_label = "EM iterations of key adaptation";
  WriteTextFile((dir / "key_adaptation.svg").string(),
                LinePlotSvg({{"shifted test set", adaptation.iterations, adaptation.shifted, true},
                             {"clean test set", adaptation.iterations, adaptation.clean, true}},
                            plot));
}

}  // namespace

CorrectionDemoResult RunCorrectionDemo(const CorrectionDemoOptions& o, std::ostream& out) {
  CheckCorrectionDemoOptions(o);
  PrepareDemoDirectory(o.out_dir, o.overwrite);
  const fs::path dir = fs::absolute(o.out_dir);
  fs::create_directories(dir / "data");
  Rng data_rng(o.seed);
  WriteTextFile((dir / "data" / "train.csv").string(),
                SegmentTaskCsv(o, o.train_examples, data_rng));
  WriteTextFile((dir / "data" / "test.csv").string(),
                SegmentTaskCsv(o, o.test_examples, data_rng));

  // Part 1: train the segment model with the ordinary trainer, reload it as
  // `stillpoint correct` does, and clamp.
  {
    const Config config = Config::FromYaml(StillpointSchema(), SegmentRunConfig(o, dir),
                                           "the correction demo's config", {});
    Experiment experiment = BuildExperiment(config, "");
    TrainOptions train;
    train.overwrite = true;
    out << "training " << experiment.model->Name() << " on the segment task ("
        << o.train_steps << " steps) into " << (dir / "run").string() << "\n";
    Train(experiment, train);
  }
  Experiment trained = LoadTrainedRun((dir / "run").string());
  SequenceModel& model = *trained.model;
  const ClampingCurve clamping = MeasureClamping(o, model, *trained.test, out);

  // Part 2: key adaptation on shifted digits.
  const AdaptationCurve adaptation = MeasureKeyAdaptation(o, out);

  CorrectionDemoResult r;
  r.accuracy_unclamped_before = clamping.accuracy.front();
  r.accuracy_unclamped_after = clamping.accuracy.back();
  r.shift_accuracy_before = adaptation.shifted.front();
  r.shift_accuracy_after = adaptation.shifted.back();
  r.clean_accuracy_before = adaptation.clean.front();
  r.clean_accuracy_after = adaptation.clean.back();

  WriteCurves(dir, clamping, adaptation);

  DemoSummary summary;
  summary.SetText("demo", "correction");
  summary.Set("accuracy_unclamped_before", r.accuracy_unclamped_before);
  summary.Set("accuracy_unclamped_after", r.accuracy_unclamped_after);
  summary.Set("clamped_positions_after", clamping.clamped.back());
  summary.Set("shift_accuracy_before", r.shift_accuracy_before);
  summary.Set("shift_accuracy_after", r.shift_accuracy_after);
  summary.Set("clean_accuracy_before", r.clean_accuracy_before);
  summary.Set("clean_accuracy_after", r.clean_accuracy_after);
  summary.Set("shift", o.shift_offset);
  summary.SetText("run", (dir / "run").string());
  WriteTextFile((dir / "summary.json").string(), summary.ToJson());
  out << "unclamped accuracy " << r.accuracy_unclamped_before << " -> "
      << r.accuracy_unclamped_after << " with " << clamping.clamped.back()
      << " positions clamped; shifted digits " << r.shift_accuracy_before << " -> "
      << r.shift_accuracy_after << " with key adaptation; wrote " << o.out_dir << "\n";
  return r;
}

// ------------------------------------------------------ stillpoint correct

namespace {

// --input: token ids separated by spaces or commas.
std::vector<int64_t> ParseTokenIds(const std::string& input) {
  std::vector<int64_t> tokens;
  std::string text = input;
  std::replace(text.begin(), text.end(), ',', ' ');
  std::istringstream in(text);
  std::string word;
  while (in >> word) {
    char* end = nullptr;
    const long long id = std::strtoll(word.c_str(), &end, 10);
    if (end == word.c_str() || *end != '\0') {
      throw ConfigError("--input: '" + word + "' is not a token id");
    }
    tokens.push_back(id);
  }
  if (tokens.empty()) throw ConfigError("--input holds no token ids");
  return tokens;
}

// --clamp POS=VALUE, each as (position, token).
std::vector<std::pair<int64_t, int64_t>> ParseClamps(const std::vector<std::string>& given) {
  std::vector<std::pair<int64_t, int64_t>> clamps;
  for (const std::string& clamp : given) {
    const std::size_t eq = clamp.find('=');
    const std::string pos_text = clamp.substr(0, eq);
    const std::string value_text = eq == std::string::npos ? "" : clamp.substr(eq + 1);
    char* end_pos = nullptr;
    char* end_value = nullptr;
    const long long pos = std::strtoll(pos_text.c_str(), &end_pos, 10);
    const long long value = std::strtoll(value_text.c_str(), &end_value, 10);
    if (eq == std::string::npos || pos_text.empty() || value_text.empty() || *end_pos != '\0' ||
        *end_value != '\0') {
      throw ConfigError("--clamp '" + clamp + "' is not POS=VALUE (two integers)");
    }
    clamps.emplace_back(pos, value);
  }
  return clamps;
}

// The clamped token of each of `length` positions (-1: free), after
// checking each clamp's position and token.
std::vector<int64_t> ClampLabels(const std::vector<std::pair<int64_t, int64_t>>& clamps,
                                 int64_t length, int64_t vocab_size) {
  std::vector<int64_t> labels(length, -1);
  for (const auto& [pos, value] : clamps) {
    if (pos < 0 || pos >= length) {
      throw ConfigError("--clamp " + std::to_string(pos) + "=" + std::to_string(value) +
                        ": position " + std::to_string(pos) + " is outside the input [0, " +
                        std::to_string(length) + ")");
    }
    if (value < 0 || value >= vocab_size) {
      throw ConfigError("--clamp " + std::to_string(pos) + "=" + std::to_string(value) +
                        ": value " + std::to_string(value) + " is not a token in [0, " +
                        std::to_string(vocab_size) + ")");
    }
    labels[pos] = value;
  }
  return labels;
}

}  // namespace

void RunCorrect(const CorrectArgs& args, std::ostream& out) {
  if (args.iterations < 1 || args.iterations > 1000) {
    throw ConfigError("--iterations must be in [1, 1000], got " + std::to_string(args.iterations));
  }
  if (!(args.value_prior_precision > 0.0) || !std::isfinite(args.value_prior_precision)) {
    throw ConfigError("--value-prior-precision must be > 0");
  }
  const std::vector<int64_t> tokens = ParseTokenIds(args.input);
  const std::vector<std::pair<int64_t, int64_t>> clamps = ParseClamps(args.clamps);

  Experiment experiment = LoadTrainedRun(args.run);
  SequenceModel& model = *experiment.model;
  RequireProbabilisticAttention(model, args.run);
  // The belief update runs in the run's dtype, where a larger value is
  // infinite and the predictions garbage.
  if (experiment.dtype == DType::kFloat32 && args.value_prior_precision > FLT_MAX) {
    std::ostringstream message;
    message << "--value-prior-precision " << args.value_prior_precision
            << " does not fit in float32, the dtype of run '" << args.run << "' (at most "
            << FLT_MAX << ")";
    throw ConfigError(message.str());
  }
  const DatasetInfo& info = experiment.train->info();
  if (info.vocab_size <= 0) {
    throw ConfigError("run '" + args.run + "' reads feature vectors, not token ids");
  }
  const int64_t length = static_cast<int64_t>(tokens.size());
  if (length > model.options().max_length) {
    throw ConfigError("--input has " + std::to_string(length) + " tokens; the model reads at most " +
                      std::to_string(model.options().max_length));
  }
  for (int64_t t : tokens) {
    if (t < 0 || t >= info.vocab_size) {
      throw ConfigError("--input: token " + std::to_string(t) + " is outside [0, " +
                        std::to_string(info.vocab_size) + ")");
    }
  }
  const std::vector<int64_t> labels = ClampLabels(clamps, length, info.vocab_size);

  ValueBeliefOptions belief;
  belief.iterations = args.iterations;
  belief.value_prior_precision = args.value_prior_precision;
  const Shape shape{1, length};
  const std::vector<int64_t> before =
      Argmax(LogitsWithClamps(model, tokens, shape, std::vector<int64_t>(length, -1), belief));
  const std::vector<int64_t> after =
      Argmax(LogitsWithClamps(model, tokens, shape, labels, belief));
  auto print = [&](const char* name, const std::vector<int64_t>& v) {
    out << name;
    for (int64_t t = 0; t < length; ++t) out << (t ? " " : "") << v[t];
    out << "\n";
  };
  print("input:   ", tokens);
  out << "clamped: ";
  for (int64_t t = 0; t < length; ++t) {
    out << (t ? " " : "") << (labels[t] >= 0 ? std::to_string(labels[t]) : std::string("."));
  }
  out << "\n";
  print("before:  ", before);
  print("after:   ", after);
  int64_t changed = 0;
  for (int64_t t = 0; t < length; ++t) changed += labels[t] < 0 && before[t] != after[t];
  out << changed << " unclamped position(s) changed\n";
}

}  // namespace stillpoint
