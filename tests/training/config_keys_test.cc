// Every key of the configuration schema changes what stillpoint does.
//
// For each key, a tiny run with the key at another valid value is compared
// with the same run at the base value: the final parameters, the metrics
// (timing and memory columns left out), the files written, the checkpoints
// written, the progress output (digits masked), the worker threads, a
// test-time evaluation (with eval.* applied) and, for the compare.* and the
// curve keys, the comparison report. A key whose change shows nowhere is
// silently ignored, which is exactly the bug users of other DEQ libraries
// report; the test names it.
//
// Keys that only act in some setting (sgd momentum, the picard damping, the
// fallback threshold, ...) are probed in that setting (a "context" of
// overrides applied to both runs). Keys without an entry in the table get an
// automatic alternative value (a flipped bool, the next enum choice, the
// integer plus one, the double doubled), so a newly added key is tested
// without anyone remembering to.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "framework/buffer_pool.h"
#include "framework/ops.h"
#include "framework/parallel.h"
#include "framework/serialize.h"
#include "layers/registry.h"
#include "tests/scratch_path.h"
#include "training/report/compare.h"
#include "training/config_schema.h"
#include "training/experiment.h"
#include "training/metrics.h"
#include "training/trainer.h"
#include "training/weights_file.h"

namespace stillpoint::config_keys_test {
namespace {

namespace fs = std::filesystem;

enum class ProbeKind {
  kTrain,   // train, then evaluate with the config's test-time settings
  kCompare  // `stillpoint compare` on two variants
};

struct KeyProbe {
  std::vector<std::string> context;  // overrides applied to both runs
  std::string value;                 // "" = automatic alternative
  ProbeKind kind = ProbeKind::kTrain;
};

class ConfigKeysTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing_support::ScratchPathForThisTest("config_keys");
    fs::create_directories(dir_);
    // Two token CSVs (2 ids then 2 per-token classes, all in 0..3), so the
    // csv keys can point at different files, and the same columns also read
    // as 2 one-number feature tokens (task.feature_dim: 1).
    WriteCsv("train_a.csv", 11);
    WriteCsv("train_b.csv", 12);
    WriteCsv("test.csv", 13);
    WriteCsv("test_b.csv", 14);
    WriteText("book.txt");
    // Fashion-MNIST's four files, tiny (8 and 4 images), uncompressed.
    fs::create_directories(Path("fashion"));
    WriteIdx("fashion/train-images-idx3-ubyte", {8, 28, 28});
    WriteIdx("fashion/train-labels-idx1-ubyte", {8});
    WriteIdx("fashion/t10k-images-idx3-ubyte", {4, 28, 28});
    WriteIdx("fashion/t10k-labels-idx1-ubyte", {4});
    config_path_ = (dir_ / "base.yaml").string();
    std::ofstream(config_path_) << BaseYaml();
    // Weights for model.init_from: the base model's initialisation, halved.
    Experiment base =
        BuildExperiment(Config::FromFile(StillpointSchema(), config_path_), config_path_);
    NamedTensors halved = base.model->NamedValues();
    for (auto& [name, tensor] : halved) {
      std::vector<double> values = tensor.ToVector();
      for (double& v : values) v *= 0.5;
      tensor = Tensor::FromVector(tensor.shape(), values, tensor.dtype());
    }
    WriteSafetensors(Path("init.safetensors"), halved);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // A text with a few non-ASCII characters, so utf-8 and bytes differ.
  void WriteText(const std::string& name) const {
    std::ofstream out(Path(name), std::ios::binary);
    for (int i = 0; i < 40; ++i) out << "the caf\xC3\xA9 sat on a mat " << i % 7 << ". ";
  }
  // An IDX file of unsigned bytes of these dimensions; values below 10, so
  // label files hold valid labels.
  void WriteIdx(const std::string& name, const std::vector<uint32_t>& dims) const {
    std::ofstream out(Path(name), std::ios::binary);
    out << '\0' << '\0' << '\x08' << static_cast<char>(dims.size());
    uint32_t count = 1;
    for (uint32_t d : dims) {
      for (int shift = 24; shift >= 0; shift -= 8) out << static_cast<char>(d >> shift);
      count *= d;
    }
    for (uint32_t i = 0; i < count; ++i) out << static_cast<char>((i * 7 + i / 13) % 10);
  }

  void WriteCsv(const std::string& name, unsigned seed) const {
    std::ofstream out(Path(name));
    unsigned state = seed;
    auto next = [&state] {
      state = state * 1103515245u + 12345u;
      return (state >> 16) % 4;
    };
    for (int i = 0; i < 24; ++i) {
      const unsigned a = next(), b = next();
      out << a << "," << b << "," << b << "," << a << "\n";
    }
  }

  std::string BaseYaml() const {
    return "seed: 3\nthreads: 1\n"
           "task: {kind: reverse, length: 5, vocab_size: 5, train_examples: 48, "
           "test_examples: 24}\n"
           "model:\n  kind: implicit\n  dim: 8\n  heads: 2\n  hidden: 12\n  max_length: 8\n"
           "  num_layers: 2\n  unroll_steps: 2\n"
           "  solver:\n    forward: {max_iterations: 12}\n"
           "    backward: {max_iterations: 12}\n"
           "train:\n  steps: 4\n  batch_size: 8\n  eval_every: 2\n  log_every: 1\n"
           "  checkpoint_every: 2\n  optimizer: {lr: 0.01}\n  schedule: {warmup_steps: 1}\n"
           // The gradient check (one per evaluation) is off in the base runs,
           // which keeps this test's hundreds of runs short; its key's probe
           // turns it on.
           "eval: {batch_size: 16, gradient_check_batch_size: 0}\n"
           "log: {dir: " +
           Path("run") +
           ", progress: lines}\n"
           "compare: {variants: [explicit, implicit_jfb]}\n";
  }

  // What a run with the given overrides shows, as text (equal text = no
  // observable difference).
  std::string Observe(const std::vector<std::string>& overrides, ProbeKind kind) {
    Config config = Config::FromFile(StillpointSchema(), config_path_, overrides);
    const std::string run_dir = RunDirectory(config, config_path_);
    fs::remove_all(run_dir);
    std::ostringstream seen;
    std::ostringstream progress;
    if (kind == ProbeKind::kCompare) {
      const CompareReport report = RunComparison(config, config_path_, &progress);
      for (const VariantResult& v : report.variants) {
        seen << v.name << " loss " << v.train.final_train_loss << " test "
             << v.train.final_eval.accuracy << " cosine " << v.gradient_cosine_vs_ift
             << "\n  depth";
        for (const auto& [depth, accuracy] : v.accuracy_vs_depth) {
          seen << " " << depth << ":" << accuracy;
        }
        seen << "\n  grid " << v.scale_name;
        for (const ScaleDepthResult& g : v.scale_depth) {
          seen << " " << g.scale << "x" << g.depth << ":" << g.accuracy << "," << g.solved_fraction;
        }
        seen << "\n  length";
        for (const auto& [length, accuracy] : v.accuracy_vs_length) {
          seen << " " << length << ":" << accuracy;
        }
        seen << "\n";
      }
      return seen.str();
    }
    Experiment e = BuildExperiment(config, config_path_);
    TrainOptions options;
    options.progress = &progress;
    const TrainSummary summary = Train(e, options);
    seen << "threads " << NumThreads() << "\nrun dir " << run_dir << "\nsteps " << summary.steps
         << " skipped " << summary.skipped_steps << " stopped " << summary.stopped_early
         << "\ncheckpoints " << summary.checkpoints_written << "\nfiles";
    std::vector<std::string> files;
    for (const auto& entry : fs::directory_iterator(run_dir)) {
      files.push_back(entry.path().filename().string());
    }
    std::sort(files.begin(), files.end());
    for (const std::string& f : files) seen << " " << f;
    const std::string serialized = SerializeTensors(e.model->NamedValues());
    seen << "\nparameters " << e.model->NumParameters() << " fnv "
         << Fnv1a64(serialized.data(), serialized.size()) << "\n";
    if (fs::exists(run_dir + "/metrics.csv")) {
      for (const auto& [column, values] : ReadMetricsCsv(run_dir + "/metrics.csv")) {
        if (column == "step_ms" || column == "peak_rss_mb" || column == "pool_peak_mb") continue;
        seen << column;
        for (double v : values) seen << " " << v;
        seen << "\n";
      }
    }
    std::string text = progress.str();
    for (char& c : text) {
      if (std::isdigit(static_cast<unsigned char>(c))) c = '0';
    }
    seen << "progress " << text << "\n";
    // Test time: the eval.* budget, the tensors an evaluation batch needs.
    SetEvalDepth(*e.model, config, e.test->info().length);
    ResetBufferPoolStats();
    const EvalResult eval = Evaluate(*e.model, *e.test, config.GetInt("eval.batch_size"), e.dtype);
    seen << "eval " << eval.loss << " " << eval.accuracy << " iters "
         << eval.forward.iterations_mean << " pool " << GetBufferPoolStats().peak_bytes_in_use
         << "\n";
    return seen.str();
  }

  fs::path dir_;
  std::string config_path_;
};

// The probes of the solver keys under prefix ("model.solver." or
// "model.attention_solver."), each in `base` plus its own context.
std::map<std::string, KeyProbe> SolverProbes(const std::string& prefix,
                                             const std::vector<std::string>& base) {
  const std::string fw = prefix + "forward.";
  const std::string bw = prefix + "backward.";
  const std::vector<std::string> unconverged = {fw + "max_iterations=2",
                                                fw + "relative_tolerance=1e-12"};
  auto in = [&](std::vector<std::string> context) {
    context.insert(context.begin(), base.begin(), base.end());
    return context;
  };
  std::map<std::string, KeyProbe> probes = {
      {fw + "type", {in({}), "broyden"}},
      {fw + "max_iterations", {in({}), "3"}},
      {fw + "absolute_tolerance", {in({fw + "stop_mode=absolute"}), "0.5"}},
      {fw + "relative_tolerance", {in({}), "0.05"}},
      // A tolerance below float32 precision: the residual stalls (tolerance 0
      // would mean a fixed budget, where stagnation is not judged).
      {fw + "stagnation_window",
       {in({fw + "relative_tolerance=1e-12", fw + "max_iterations=40"}), "1"}},
      // A map whose residual doubles every step: DIVERGED at once with a
      // factor of 1.01, MAX_ITERATIONS at the default.
      {fw + "divergence_factor", {in({"model.cell=test_doubling_cell", fw + "type=picard"}), "1.01"}},
      {fw + "picard_damping", {in({fw + "type=picard"}), "0.5"}},
      {fw + "anderson_memory", {in({}), "2"}},
      {fw + "anderson_lambda", {in({}), "0.5"}},
      {fw + "anderson_beta", {in({}), "0.5"}},
      {fw + "anderson_safeguard_factor",
       {in({fw + "relative_tolerance=1e-12", fw + "max_iterations=40"}), "1"}},
      {fw + "broyden_memory", {in({fw + "type=broyden"}), "2"}},
      {fw + "broyden_initial_scale", {in({fw + "type=broyden"}), "0"}},
      {fw + "broyden_variant", {in({fw + "type=broyden"}), "bad"}},
      {fw + "broyden_line_search",
       {in({fw + "type=broyden", fw + "relative_tolerance=1e-12", fw + "max_iterations=40"}), "true"}},
      {fw + "gmres_restart", {in({fw + "type=newton_krylov"}), "2"}},
      {fw + "newton_forcing", {in({fw + "type=newton_krylov"}), "0.9"}},
      {fw + "fallback_chain", {in(unconverged), "[picard]"}},
      {fw + "fallback_residual_threshold",
       {in([&] {
          std::vector<std::string> c = unconverged;
          c.push_back(fw + "fallback_chain=[picard]");
          return c;
        }()),
        "1e30"}},
      {bw + "mode", {in({}), "jfb"}},
      {bw + "solver", {in({}), "anderson"}},
      {bw + "max_iterations", {in({}), "2"}},
      {bw + "tolerance", {in({}), "0.1"}},
      {bw + "neumann_terms", {in({bw + "solver=neumann"}), "2"}},
      {bw + "gmres_restart", {in({bw + "solver=gmres", bw + "tolerance=1e-12"}), "2"}},
      // A tolerance below float32 precision: the adjoint residual stalls, and
      // a window of 1 ends it sooner than the default 10.
      {bw + "stagnation_window", {in({bw + "tolerance=1e-12", bw + "max_iterations=60"}), "1"}},
      {bw + "warm_start", {in({bw + "max_iterations=3"}), "true"}},
      {bw + "phantom_steps", {in({bw + "mode=phantom"}), "2"}},
      {bw + "phantom_tau", {in({bw + "mode=phantom"}), "0.25"}},
      {bw + "unrolled_steps", {in({bw + "mode=unrolled"}), "2"}},
  };
  if (prefix == "model.attention_solver.") {
    // Not keys of the inner solve (config_schema.cc, SolverKeyApplies).
    probes.erase(fw + "divergence_factor");
    probes.erase(bw + "warm_start");
  }
  // Every other key under prefix: its automatic alternative, in `base`.
  for (const ConfigKey& key : StillpointSchema().keys()) {
    if (key.path.rfind(prefix, 0) == 0 && !probes.count(key.path)) probes[key.path] = {in({}), ""};
  }
  return probes;
}

// The keys that need a setting to act in, or a specific value.
std::map<std::string, KeyProbe> ProbeTable(const std::string& dir) {
  auto path = [&](const std::string& name) { return (fs::path(dir) / name).string(); };
  // The base's generated-set sizes at their defaults: tasks read from files
  // refuse keys they do not read.
  const std::vector<std::string> from_files = {"task.train_examples=4096",
                                               "task.test_examples=512"};
  const std::vector<std::string> csv = {"task.kind=csv", from_files[0], from_files[1],
                                        "task.length=2",
                                        "task.vocab_size=4",
                                        "task.num_classes=4",
                                        "task.path=" + path("train_a.csv"),
                                        "task.test_path=" + path("test.csv")};
  const std::vector<std::string> digits = {"task.kind=digits", "model.max_length=16",
                                           from_files[0], from_files[1], "task.length=16",
                                           "task.vocab_size=16"};
  // The base's length and vocabulary at their defaults: the tasks below do
  // not read them.
  const std::vector<std::string> prefix_sum = {"task.kind=prefix_sum", "task.vocab_size=16"};
  const std::vector<std::string> maze = {"task.kind=maze", "task.size=2", "task.length=16",
                                         "task.vocab_size=16", "model.max_length=64"};
  std::vector<std::string> maze_of_three = maze;
  maze_of_three.push_back("task.size=3");
  const std::vector<std::string> text = {"task.kind=text", from_files[0], from_files[1],
                                         "task.length=16", "task.vocab_size=16",
                                         "model.max_length=16", "task.context=8",
                                         "task.path=" + path("book.txt")};
  const std::vector<std::string> fashion = {"task.kind=fashion_mnist", from_files[0], from_files[1],
                                            "task.length=16", "task.vocab_size=16",
                                            "model.max_length=64",
                                            "task.path=" + path("fashion")};
  const std::vector<std::string> nonfinite = {"train.optimizer.lr=1e30", "train.clip_norm=0",
                                              "train.optimizer.type=sgd"};
  const std::vector<std::string> jacobian = {"model.regularization.jacobian_weight=0.5"};
  const std::vector<std::string> correction = {"model.regularization.correction_weight=0.5"};
  // A target of 0 penalises any radius, so the term is never zero.
  const std::vector<std::string> spectral_anywhere = {
      "model.regularization.spectral_radius_target=0"};
  const std::vector<std::string> spectral = {"model.regularization.spectral_radius_weight=0.5",
                                             "model.regularization.spectral_radius_target=0"};
  const std::string energy_transformer = "model.energy.layer=energy_transformer";
  const std::vector<std::string> probabilistic = {"model.kind=energy",
                                                  "model.energy.layer=probabilistic"};
  std::vector<std::string> adapting = probabilistic;
  adapting.push_back("model.energy.key_adaptation.iterations=1");
  std::vector<std::string> adapting_precision = adapting;
  adapting_precision.push_back("model.energy.key_adaptation.adapt_precision=true");
  std::map<std::string, KeyProbe> table = {
      {"dtype", {{}, "float64"}},
      {"task.kind", {{}, "sort"}},
      {"task.path", {csv, path("train_b.csv")}},
      {"task.test_path", {csv, path("test_b.csv")}},
      {"task.test_fraction", {digits, "0.3"}},
      {"task.patch", {fashion, "7"}},
      {"task.flip", {fashion, "true"}},
      {"task.shift", {fashion, "2"}},
      {"task.encoding", {text, "bytes"}},
      {"task.context", {text, "12"}},
      {"task.validation_fraction", {text, "0.2"}},
      {"task.feature_dim", {csv, "1"}},
      {"task.num_classes", {csv, "5"}},
      {"task.vocab_size", {{}, "7"}},
      {"task.modulus", {prefix_sum, "3"}},
      {"task.start_token", {prefix_sum, "false"}},
      {"task.size", {maze, "3"}},
      {"task.min_size", {maze_of_three, "2"}},
      {"model.kind", {{}, "tied"}},
      {"model.cell", {{}, "test_tanh_cell"}},
      {"model.dim", {{}, "12"}},
      {"model.heads", {{}, "4"}},
      {"model.max_length", {{}, "9"}},
      {"model.num_layers", {{"model.kind=explicit"}, "3"}},
      {"model.unroll_steps", {{"model.kind=tied"}, "3"}},
      {"model.dropout", {{}, "0.2"}},
      {"model.positions", {{}, "rotary"}},
      {"model.attention_mask", {{}, "causal"}},
      {"model.attention_window", {{"model.attention_mask=causal"}, "1"}},
      {"model.input_injection", {{"model.kind=explicit"}, "first_step"}},
      {"model.solver.init", {{}, "mixed"}},
      {"model.init_from", {{}, path("init.safetensors")}},
      {"model.regularization.jacobian_weight", {{}, "0.5"}},
      {"model.regularization.jacobian_probes", {jacobian, "3"}},
      {"model.regularization.jacobian_frequency", {jacobian, "0.5"}},
      {"model.regularization.jacobian_ramp_steps", {jacobian, "3"}},
      {"model.regularization.spectral_radius_weight", {spectral_anywhere, "0.5"}},
      {"model.regularization.spectral_radius_target",
       {{"model.regularization.spectral_radius_weight=0.5"}, "0"}},
      {"model.regularization.spectral_radius_iterations", {spectral, "3"}},
      {"model.regularization.spectral_radius_frequency", {spectral, "0.5"}},
      {"model.regularization.spectral_radius_samples", {spectral, "1"}},
      {"model.regularization.spectral_radius_rows",
       {{"model.regularization.spectral_radius_weight=0.5",
         "model.regularization.spectral_radius_target=0",
         "model.regularization.spectral_radius_samples=1"},
        "slowest"}},
      {"model.regularization.attention_spectral_radius_weight",
       {{"model.attention=hopfield", "model.regularization.attention_spectral_radius_target=0"},
        "0.5"}},
      {"model.regularization.attention_spectral_radius_target",
       {{"model.attention=hopfield", "model.regularization.attention_spectral_radius_weight=0.5"},
        "0"}},
      {"model.regularization.attention_spectral_radius_iterations",
       {{"model.attention=hopfield", "model.regularization.attention_spectral_radius_weight=0.5",
         "model.regularization.attention_spectral_radius_target=0"},
        "3"}},
      {"model.regularization.correction_weight", {{}, "0.5"}},
      {"model.regularization.correction_iterates", {correction, "3"}},
      {"model.regularization.correction_steps", {correction, "2"}},
      {"model.regularization.correction_tau", {correction, "0.5"}},
      {"model.regularization.correction_gamma", {correction, "0.5"}},
      {"train.optimizer.type", {{}, "sgd"}},
      {"train.optimizer.momentum", {{"train.optimizer.type=sgd"}, "0.5"}},
      {"train.optimizer.nesterov",
       {{"train.optimizer.type=sgd", "train.optimizer.momentum=0.9"}, "true"}},
      {"train.optimizer.beta1", {{}, "0.5"}},
      {"train.optimizer.beta2", {{}, "0.9"}},
      {"train.optimizer.epsilon", {{}, "0.01"}},
      {"train.optimizer.weight_decay", {{}, "0.5"}},
      {"train.optimizer.no_weight_decay", {{"train.optimizer.weight_decay=0.5"}, "[]"}},
      {"train.schedule.type", {{}, "constant"}},
      {"train.schedule.step_size",
       {{"train.schedule.type=step", "train.schedule.warmup_steps=0"}, "2"}},
      {"train.schedule.gamma", {{"train.schedule.type=step", "train.schedule.step_size=2"}, "0.5"}},
      {"train.schedule.min_ratio", {{}, "0.5"}},
      {"train.clip_norm", {{}, "0.001"}},
      {"train.pretrain_steps", {{}, "2"}},
      {"train.progressive_loss.weight", {{}, "0.5"}},
      {"train.progressive_loss.steps",
       {{"train.progressive_loss.weight=0.5", "train.progressive_loss.iterations=4"}, "2"}},
      {"train.progressive_loss.iterations", {{"train.progressive_loss.weight=0.5"}, "4"}},
      {"train.eval_every", {{}, "1"}},
      {"train.checkpoint_every", {{}, "1"}},
      {"train.log_every", {{}, "2"}},
      {"train.on_nonfinite", {nonfinite, "stop"}},
      // An adjoint tolerance below float32 precision is never met: stop ends
      // the run at the first step, warn (the default) reports and goes on.
      {"train.on_unconverged",
       {{"model.solver.backward.tolerance=1e-12", "model.solver.backward.max_iterations=2"},
        "stop"}},
      {"train.max_skipped_steps", {nonfinite, "1"}},
      {"eval.batch_size", {{}, "4"}},
      {"eval.max_examples", {{}, "3"}},
      {"eval.max_iterations", {{}, "1"}},
      {"eval.iterations_sweep", {{}, "[1, 2]", ProbeKind::kCompare}},
      {"eval.lengths", {{}, "[6]", ProbeKind::kCompare}},
      {"eval.sizes", {maze, "[3]", ProbeKind::kCompare}},
      // A budget of 4 per token (20 at the 5 tokens) against the trained 3.
      {"eval.iterations_per_token", {{"model.solver.forward.max_iterations=3"}, "4"}},
      {"log.dir", {{}, path("other_run")}},
      {"log.formats", {{}, "[csv]"}},
      {"log.progress", {{}, "none"}},
      {"compare.variants", {{}, "[explicit, tied]", ProbeKind::kCompare}},
      // The verdict (progress output's "equilibrium: ...") moves with them.
      {"health.max_spectral_radius", {{"eval.gradient_check_batch_size=2"}, "0.001"}},
      {"health.min_converged_fraction",
       {{"model.solver.forward.max_iterations=1", "model.solver.forward.relative_tolerance=1e-12"},
        "0"}},
      {"health.min_gradient_cosine",
       {{"eval.gradient_check_batch_size=2", "model.solver.backward.mode=jfb"}, "-1"}},
      {"compare.seeds", {{}, "[5, 6]", ProbeKind::kCompare}},
      {"compare.overrides", {{}, "[explicit:train.optimizer.lr=0.05]", ProbeKind::kCompare}},
      {"compare.attention", {{}, "[softmax]", ProbeKind::kCompare}},
      {"compare.kinds",
       {{"compare.attention=[softmax]"}, "[explicit, tied]", ProbeKind::kCompare}},
      {"model.energy.layer", {{"model.kind=energy"}, "hopfield"}},
      {"model.energy.beta", {{"model.kind=energy"}, "2.5"}},
      {"model.energy.value_precision",
       {{"model.kind=energy", "model.energy.layer=probabilistic"}, "0.25"}},
      {"model.energy.pattern_contraction",
       {{"model.kind=energy", "model.energy.layer=hopfield"}, "0.5"}},
      {"model.energy.value_contraction",
       {{"model.kind=energy", "model.energy.layer=probabilistic"}, "0.5"}},
      {"model.energy.key_grad", {{"model.kind=energy", energy_transformer}, "stop"}},
      {"model.energy.dynamics", {{"model.kind=energy", energy_transformer}, "non_leaky"}},
      {"model.energy.memory", {{"model.kind=energy", energy_transformer}, "softmax"}},
      {"model.energy.memories", {{"model.kind=energy", energy_transformer}, "7"}},
      {"model.energy.step", {{"model.kind=energy", energy_transformer}, "0.05"}},
      {"model.energy.readout", {{"model.kind=energy", energy_transformer}, "move"}},
      {"model.energy.normalize_input", {{"model.kind=energy"}, "false"}},
      {"model.energy.key_adaptation.iterations", {probabilistic, "1"}},
      {"model.energy.key_adaptation.prior_precision", {adapting, "0"}},
      {"model.energy.key_adaptation.recentre_prior",
       {[&] {
          std::vector<std::string> c = probabilistic;
          c.push_back("model.energy.key_adaptation.iterations=3");
          return c;
        }(),
        "true"}},
      {"model.energy.key_adaptation.adapt_precision", {adapting, "true"}},
      {"model.energy.key_adaptation.precision_prior_shape", {adapting_precision, "3"}},
      {"model.energy.key_adaptation.precision_prior_rate", {adapting_precision, "2"}},
      {"model.energy.measure", {{"model.kind=energy", "model.energy.layer=expfam"}, "gaussian"}},
      {"model.energy.components",
       {{"model.kind=energy", "model.energy.layer=expfam", "model.energy.measure=mixture"}, "2"}},
      {"model.attention", {{}, "probabilistic"}},
      {"model.pooling", {digits, "hopfield"}},
      {"model.pooling_patterns",
       {[&] {
          std::vector<std::string> c = digits;
          c.push_back("model.pooling=hopfield");
          return c;
        }(),
        "2"}},
      {"model.lookup", {{}, "hopfield"}},
      {"model.lookup_size", {{"model.lookup=hopfield"}, "3"}},
  };
  table.merge(SolverProbes("model.solver.", {}));
  table.merge(SolverProbes("model.attention_solver.", {"model.attention=probabilistic"}));
  return table;
}

// Another valid value for a key, from its current value and the schema.
std::string AutomaticAlternative(const ConfigKey& key, const Config& config) {
  switch (key.type) {
    case ConfigType::kBool:
      return config.GetBool(key.path) ? "false" : "true";
    case ConfigType::kEnum:
      for (const std::string& choice : key.choices) {
        if (choice != config.GetString(key.path)) return choice;
      }
      return "";
    case ConfigType::kInt: {
      const int64_t v = config.GetInt(key.path);
      return std::to_string(!key.has_max || v + 1 <= key.max ? v + 1 : v - 1);
    }
    case ConfigType::kDouble: {
      const double v = config.GetDouble(key.path);
      double alt = v == 0 ? 0.5 : 2 * v;
      if (key.has_max && alt > key.max) alt = v == 0 ? key.max : 0.5 * v;
      std::ostringstream out;
      out.precision(17);
      out << alt;
      return out.str();
    }
    default:
      return "";  // strings and lists need a value in the table
  }
}

// A cell other than the built-in one, for model.cell: f = tanh(z W + u).
class TanhCell : public Cell {
 public:
  TanhCell(const CellOptions& options, Rng& rng) {
    weight_ =
        RegisterParameter("weight", RandomNormal(Shape{options.dim, options.dim}, 0.0,
                                                 0.3 / std::sqrt(static_cast<double>(options.dim)),
                                                 options.dtype, rng));
  }
  std::string Name() const override { return "TanhCell"; }
  Var Forward(const Var& z, const Var& u, const std::vector<int64_t>&) const override {
    return tanh(add(matmul(z, weight_), u));
  }

 private:
  Var weight_;
};

// f = 2 z + u: no fixed point in reach; Picard's residual doubles.
class DoublingCell : public Cell {
 public:
  std::string Name() const override { return "DoublingCell"; }
  Var Forward(const Var& z, const Var& u, const std::vector<int64_t>&) const override {
    return add(mul_scalar(z, 2.0), u);
  }
};

TEST_F(ConfigKeysTest, EveryKeyChangesBehaviour) {
  if (!CellRegistry().Has("test_tanh_cell")) {
    CellRegistry().Register("test_tanh_cell", [](const CellOptions& o, Rng& rng) {
      return std::make_shared<TanhCell>(o, rng);
    });
    CellRegistry().Register("test_doubling_cell", [](const CellOptions&, Rng&) {
      return std::make_shared<DoublingCell>();
    });
  }
  const std::map<std::string, KeyProbe> table = ProbeTable(dir_.string());
  for (const auto& [path, probe] : table) {
    EXPECT_NE(StillpointSchema().Find(path), nullptr) << "the table names an unknown key " << path;
  }
  std::map<std::string, std::string> base_seen;  // by context and probe kind
  int probed = 0;
  for (const ConfigKey& key : StillpointSchema().keys()) {
    SCOPED_TRACE(key.path);
    KeyProbe probe;
    if (auto it = table.find(key.path); it != table.end()) probe = it->second;
    const Config base = Config::FromFile(StillpointSchema(), config_path_, probe.context);
    const std::string value = probe.value.empty() ? AutomaticAlternative(key, base) : probe.value;
    ASSERT_FALSE(value.empty()) << key.path << " needs an entry in ProbeTable";
    std::vector<std::string> changed = probe.context;
    changed.push_back(key.path + "=" + value);

    std::string cache_key = probe.kind == ProbeKind::kCompare ? "compare|" : "train|";
    for (const std::string& c : probe.context) cache_key += c + "|";
    if (!base_seen.count(cache_key)) base_seen[cache_key] = Observe(probe.context, probe.kind);
    std::string seen;
    try {
      seen = Observe(changed, probe.kind);
    } catch (const std::exception& error) {
      ADD_FAILURE() << key.path << "=" << value << " failed: " << error.what();
      continue;
    }
    EXPECT_NE(seen, base_seen[cache_key])
        << key.path << "=" << value << " (context: " << ::testing::PrintToString(probe.context)
        << ") made no observable difference";
    ++probed;
  }
  EXPECT_EQ(probed, static_cast<int>(StillpointSchema().keys().size()));
}

}  // namespace
}  // namespace stillpoint::config_keys_test
