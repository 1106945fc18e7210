// End-to-end behaviour of the trainer and the CLI commands on tiny configs.
#include "training/trainer.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "framework/buffer_pool.h"
#include "framework/ops.h"
#include "layers/energy_attention.h"
#include "layers/registry.h"
#include "tests/scratch_path.h"
#include "training/checkpoint.h"
#include "training/cli/cli_commands.h"
#include "training/report/compare.h"
#include "training/config_schema.h"
#include "training/metrics.h"
#include "training/optimizer.h"

namespace stillpoint::trainer_test {
namespace {

namespace fs = std::filesystem;

class TrainerTest : public testing_support::ScratchDirTest {
 protected:
  TrainerTest() : ScratchDirTest("trainer") {}

  // A tiny reverse task that trains in well under a second per variant.
  std::string WriteConfig(const std::string& name, const std::string& extra = "") {
    const std::string path = (dir_ / (name + ".yaml")).string();
    std::ofstream(path) << "seed: 3\nthreads: 1\n"
                        << "task: {kind: reverse, length: 5, vocab_size: 5, train_examples: 256, "
                           "test_examples: 64}\n"
                        << "model:\n  dim: 16\n  heads: 2\n  hidden: 32\n  max_length: 8\n"
                        << "  num_layers: 2\n  unroll_steps: 3\n"
                        << "train:\n  steps: 40\n  batch_size: 16\n  eval_every: 20\n"
                        << "  log_every: 5\n  checkpoint_every: 10\n"
                        << "  optimizer: {lr: 0.01}\n  schedule: {warmup_steps: 5}\n"
                        << "log: {dir: " << (dir_ / ("run_" + name)).string()
                        << ", progress: none}\n"
                        << extra;
    return path;
  }
};

TEST_F(TrainerTest, TrainingReducesTheLossAndFillsTheRunDirectory) {
  for (const std::string kind : {"explicit", "tied", "implicit"}) {
    const std::string path = WriteConfig(kind);
    Config config = Config::FromFile(StillpointSchema(), path, {"model.kind=" + kind});
    Experiment e = BuildExperiment(config, path);
    TrainSummary summary = Train(e);
    const auto metrics = ReadMetricsCsv(summary.run_dir + "/metrics.csv");
    const std::vector<double>& loss = metrics.at("loss");
    ASSERT_GE(loss.size(), 4u);
    EXPECT_LT(loss.back(), 0.8 * loss.front()) << kind;
    EXPECT_EQ(summary.steps, 40);
    for (const char* file : {"config.yaml", "metrics.jsonl", "checkpoint.ckpt", "loss.svg",
                             "accuracy.svg", "solver.svg", "summary.md", "summary.json"}) {
      EXPECT_TRUE(fs::exists(summary.run_dir + "/" + file)) << kind << ": " << file;
    }
    // The resolved config is complete and loads again.
    Config resolved = Config::FromFile(StillpointSchema(), summary.run_dir + "/config.yaml");
    EXPECT_EQ(resolved.GetString("model.kind"), kind);
    EXPECT_EQ(resolved.GetInt("train.steps"), 40);
    if (kind == std::string("implicit")) {
      EXPECT_GT(summary.forward.iterations_mean, 0.0);
      EXPECT_GT(summary.backward.iterations_mean, 0.0);
      EXPECT_FALSE(std::isnan(metrics.at("fwd_iters_mean").back()));
    }
  }
}

TEST_F(TrainerTest, ResumingGivesBitwiseIdenticalParameters) {
  const std::string path = WriteConfig("resume", "");
  auto params_after = [&](const std::vector<int64_t>& chunks, const std::string& run) {
    for (std::size_t k = 0; k < chunks.size(); ++k) {
      Config config = Config::FromFile(
          StillpointSchema(), path,
          {"model.kind=implicit", "train.steps=12", "log.dir=" + (dir_ / run).string()});
      Experiment e = BuildExperiment(config, path);
      TrainOptions options;
      options.resume = k > 0;
      options.stop_after_steps = chunks[k];
      Train(e, options);
    }
    return LoadCheckpoint((dir_ / run / "checkpoint.ckpt").string());
  };
  const CheckpointState straight = params_after({12}, "straight");
  const CheckpointState split = params_after({6, 6}, "split");
  EXPECT_EQ(straight.step, 12);
  EXPECT_EQ(split.step, 12);
  ASSERT_EQ(straight.model.size(), split.model.size());
  for (std::size_t i = 0; i < straight.model.size(); ++i) {
    EXPECT_EQ(straight.model[i].second.ToVector(), split.model[i].second.ToVector())
        << straight.model[i].first;
  }
}

TEST_F(TrainerTest, NonFiniteLossStopsTheRunAndKeepsTheLastGoodCheckpoint) {
  // An absurd learning rate drives the parameters to overflow within a few steps.
  const std::string path = WriteConfig("nan", "");
  std::ostringstream out, err;
  TrainArgs args;
  args.config_path = path;
  args.overrides = {"model.kind=explicit",     "train.optimizer.lr=1e30",
                    "train.clip_norm=0",       "train.schedule.warmup_steps=0",
                    "train.on_nonfinite=stop", "train.checkpoint_every=1",
                    "train.optimizer.type=sgd"};
  const int code = RunTrain(args, out, err);
  EXPECT_EQ(code, 1);
  // The reason goes to stderr (it used to reach stdout only).
  EXPECT_NE(err.str().find("error: training stopped early: "), std::string::npos) << err.str();
  EXPECT_NE(err.str().find("non-finite"), std::string::npos) << err.str();
  const CheckpointState last = LoadCheckpoint((dir_ / "run_nan" / "checkpoint.ckpt").string());
  for (const auto& [name, tensor] : last.model) {
    EXPECT_FALSE(HasNonFinite(tensor)) << name;
  }
}

TEST_F(TrainerTest, CommandsReportBadInputWithExitCodeTwo) {
  std::ostringstream out, err;
  TrainArgs args;
  args.config_path = (dir_ / "missing.yaml").string();
  EXPECT_EQ(RunTrain(args, out, err), 2);
  EXPECT_NE(err.str().find("missing.yaml"), std::string::npos) << err.str();

  const std::string typo = (dir_ / "typo.yaml").string();
  std::ofstream(typo) << "task:\n  kind: reverse\ntrain:\n  stepz: 3\n";
  err.str("");
  args.config_path = typo;
  EXPECT_EQ(RunTrain(args, out, err), 2);
  EXPECT_NE(err.str().find("typo.yaml:4:3: unknown key 'train.stepz' (did you mean "
                           "'train.steps'?)"),
            std::string::npos)
      << err.str();

  err.str("");
  args.config_path = WriteConfig("bad_override");
  args.overrides = {"model.dim=-3"};
  EXPECT_EQ(RunTrain(args, out, err), 2);
  EXPECT_NE(err.str().find("model.dim"), std::string::npos) << err.str();

  EvalArgs eval;
  eval.run = (dir_ / "nothing_here").string();
  err.str("");
  EXPECT_EQ(RunEval(eval, out, err), 2);
  eval.iterations = -5;
  err.str("");
  EXPECT_EQ(RunEval(eval, out, err), 2);
  EXPECT_NE(err.str().find("--iters must be in [1, 1048576]"), std::string::npos) << err.str();
  eval.iterations = 0;
  eval.length = -1;
  err.str("");
  EXPECT_EQ(RunEval(eval, out, err), 2);
  EXPECT_NE(err.str().find("--length must be >= 1"), std::string::npos) << err.str();
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path.string());
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

int64_t Occurrences(const std::string& text, const std::string& what) {
  int64_t count = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) {
    ++count;
  }
  return count;
}

// An adjoint solve asked for a tolerance below float32 precision with 2
// iterations never meets it. warn (the default) says so the first time and
// then once per evaluation, and the run goes on; stop ends the run before
// the first update with exit code 1 and the report; ignore says nothing.
// INEXACT backward modes never count as unconverged.
TEST_F(TrainerTest, UnconvergedAdjointIsReportedOrStopsTheRun) {
  const std::vector<std::string> starved = {
      "model.kind=implicit", "train.steps=20", "train.eval_every=10",
      "model.solver.backward.solver=fixed_point", "model.solver.backward.tolerance=1e-12",
      "model.solver.backward.max_iterations=2"};
  const std::string first = "the adjoint (backward) solve left 16/16 samples (100%) above its "
                            "tolerance: max rel residual ";
  auto run = [&](const std::string& name, std::vector<std::string> overrides, int* code) {
    TrainArgs args;
    args.config_path = WriteConfig(name);
    args.overrides = std::move(overrides);
    std::ostringstream out, err;
    *code = RunTrain(args, out, err);
    return out.str() + err.str();
  };

  int code = -1;
  const std::string warned = run("warn", starved, &code);
  EXPECT_EQ(code, 0) << warned;
  EXPECT_EQ(Occurrences(warned, "(train.on_unconverged: warn; reported again once per evaluation)"),
            1)
      << warned;
  EXPECT_NE(warned.find("step 1: " + first), std::string::npos) << warned;
  EXPECT_NE(warned.find("> 1e-12 NOT MET [MAX_ITERATIONS 16]; ift/fixed_point: MAX_ITERATIONS"),
            std::string::npos)
      << warned;
  // Once per evaluation after the first report (evaluations at steps 10 and 20).
  EXPECT_EQ(Occurrences(warned, "more step(s) with unconverged adjoint samples"), 2) << warned;
  EXPECT_NE(warned.find("9 more step(s)"), std::string::npos) << warned;
  const YAML::Node summary = YAML::LoadFile((dir_ / "run_warn" / "summary.json").string());
  EXPECT_EQ(summary["backward_unconverged_steps"].as<int>(), 20);
  EXPECT_EQ(summary["backward_status"]["MAX_ITERATIONS"].as<int>(), 16);
  EXPECT_EQ(summary["backward_tolerance"].as<double>(), 1e-12);
  EXPECT_FALSE(summary["backward_tolerance_met"].as<bool>());
  EXPECT_EQ(summary["forward_status"]["CONVERGED"].as<int>() +
                (summary["forward_status"]["MAX_ITERATIONS"]
                     ? summary["forward_status"]["MAX_ITERATIONS"].as<int>()
                     : 0),
            16);
  const std::string md = ReadFile(dir_ / "run_warn" / "summary.md");
  EXPECT_NE(md.find("Backward residual "), std::string::npos) << md;
  EXPECT_NE(md.find("NOT MET; samples: MAX_ITERATIONS 16"), std::string::npos) << md;

  std::vector<std::string> stop = starved;
  stop.push_back("train.on_unconverged=stop");
  const std::string stopped = run("stop", stop, &code);
  EXPECT_EQ(code, 1) << stopped;
  EXPECT_NE(stopped.find("step 1: " + first), std::string::npos) << stopped;
  EXPECT_NE(stopped.find("stopping before the update (train.on_unconverged: stop)"),
            std::string::npos)
      << stopped;
  const YAML::Node stop_summary = YAML::LoadFile((dir_ / "run_stop" / "summary.json").string());
  EXPECT_TRUE(stop_summary["stopped_early"].as<bool>());
  EXPECT_NE(stop_summary["stop_reason"].as<std::string>().find(first), std::string::npos);
  EXPECT_EQ(stop_summary["backward_status"]["MAX_ITERATIONS"].as<int>(), 16);

  std::vector<std::string> ignore = starved;
  ignore.push_back("train.on_unconverged=ignore");
  const std::string ignored = run("ignore", ignore, &code);
  EXPECT_EQ(code, 0) << ignored;
  EXPECT_EQ(ignored.find("adjoint (backward) solve left"), std::string::npos) << ignored;

  std::vector<std::string> jfb = starved;
  jfb.push_back("train.on_unconverged=stop");
  jfb.push_back("model.solver.backward.mode=jfb");
  const std::string inexact = run("jfb", jfb, &code);
  EXPECT_EQ(code, 0) << inexact;
  const YAML::Node jfb_summary = YAML::LoadFile((dir_ / "run_jfb" / "summary.json").string());
  EXPECT_EQ(jfb_summary["backward_status"]["INEXACT"].as<int>(), 16);
  EXPECT_TRUE(jfb_summary["backward_residual_max"].IsNull());
  EXPECT_TRUE(jfb_summary["backward_tolerance_met"].IsNull());
  EXPECT_EQ(jfb_summary["backward_unconverged_steps"].as<int>(), 0);
}

// The reference of a model with energy attention solves the inner adjoints
// to a tenth of its own tolerance (its outer operator contains them), and
// the attentions' solver options are the configured ones again afterwards.
TEST_F(TrainerTest, GradientCheckSolvesInnerAdjointsTighterThanTheReference) {
  const std::string path = WriteConfig("inner_reference");
  Config config = Config::FromFile(
      StillpointSchema(), path,
      {"model.kind=explicit", "model.attention=hopfield", "train.steps=4", "train.eval_every=4",
       "log.dir=" + (dir_ / "inner_reference").string()});
  Experiment e = BuildExperiment(config, path);
  const TrainSummary summary = Train(e);
  ASSERT_TRUE(summary.gradient_check.ran);
  EXPECT_TRUE(summary.gradient_check.has_reference()) << summary.gradient_check.Line();
  const double reference = summary.gradient_check.reference_tolerance;
  const auto attentions = FindEnergyAttentions(*e.model);
  ASSERT_FALSE(attentions.empty());
  for (const auto& [name, attention] : attentions) {
    const auto last = attention->implicit().backward_summary();
    ASSERT_TRUE(last != nullptr) << name;
    EXPECT_DOUBLE_EQ(last->tolerance, 0.1 * reference) << name;  // the reference's solve
    EXPECT_DOUBLE_EQ(attention->implicit().options().backward.tolerance,
                     config.GetDouble("model.attention_solver.backward.tolerance"))
        << name;
  }
}

// The gradient check at every evaluation: with the configured backward pass
// already the reference (ift, GMRES to 1e-10, float64) it finds no
// difference; with jfb it measures one. It never changes the training: the
// parameters are bitwise those of a run without it.
TEST_F(TrainerTest, GradientCheckMeasuresTheGradientUsedWithoutChangingTraining) {
  const std::vector<std::string> base = {"model.kind=implicit", "dtype=float64", "train.steps=20",
                                         "train.eval_every=10"};
  auto train = [&](const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> overrides = base;
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    overrides.push_back("log.dir=" + (dir_ / name).string());
    const std::string path = WriteConfig(name);
    Config config = Config::FromFile(StillpointSchema(), path, overrides);
    Experiment e = BuildExperiment(config, path);
    return Train(e);
  };
  const TrainSummary exact =
      train("exact", {"model.solver.backward.solver=gmres", "model.solver.backward.tolerance=1e-10",
                      "model.solver.backward.max_iterations=500"});
  ASSERT_TRUE(exact.gradient_check.ran);
  EXPECT_EQ(exact.gradient_check_step, 20);
  EXPECT_GT(exact.gradient_check.cosine, 1.0 - 1e-12);
  EXPECT_LT(exact.gradient_check.relative_error, 1e-8) << exact.gradient_check.Line();
  EXPECT_EQ(exact.gradient_check.reference_status, "CONVERGED");
  const auto metrics = ReadMetricsCsv((dir_ / "exact" / "metrics.csv").string());
  int checked = 0;
  for (double cosine : metrics.at("grad_cos")) checked += std::isfinite(cosine);
  EXPECT_EQ(checked, 2);  // the evaluations at steps 10 and 20
  const YAML::Node json = YAML::LoadFile((dir_ / "exact" / "summary.json").string());
  EXPECT_EQ(json["gradient_check"]["step"].as<int>(), 20);
  EXPECT_EQ(json["gradient_check"]["reference_status"].as<std::string>(), "CONVERGED");

  const TrainSummary jfb = train("jfb", {"model.solver.backward.mode=jfb"});
  ASSERT_TRUE(jfb.gradient_check.ran);
  EXPECT_GT(jfb.gradient_check.relative_error, 1e-3) << jfb.gradient_check.Line();
  EXPECT_LT(jfb.gradient_check.cosine, 1.0 - 1e-6) << jfb.gradient_check.Line();

  // Off, the same run ends with bitwise the same parameters.
  train("jfb_unchecked", {"model.solver.backward.mode=jfb", "eval.gradient_check_batch_size=0"});
  const CheckpointState with = LoadCheckpoint((dir_ / "jfb" / "checkpoint.ckpt").string());
  const CheckpointState without =
      LoadCheckpoint((dir_ / "jfb_unchecked" / "checkpoint.ckpt").string());
  ASSERT_EQ(with.model.size(), without.model.size());
  for (std::size_t i = 0; i < with.model.size(); ++i) {
    EXPECT_EQ(with.model[i].second.ToVector(), without.model[i].second.ToVector())
        << with.model[i].first;
  }

  // `stillpoint eval RUN --gradient-check` does the same for a checkpoint.
  EvalArgs eval;
  eval.run = (dir_ / "jfb").string();
  eval.json = true;
  eval.gradient_check = true;
  std::ostringstream out, err;
  ASSERT_EQ(RunEval(eval, out, err), 0) << err.str();
  const YAML::Node result = YAML::Load(out.str());
  EXPECT_NEAR(result["gradient_check"]["relative_error"].as<double>(),
              jfb.gradient_check.relative_error, 1e-9)
      << out.str();
  EXPECT_EQ(result["gradient_check"]["used"].as<std::string>().rfind("jfb: INEXACT", 0), 0u)
      << out.str();
}

// f(z; u) = z / 2 + u: J_f = I / 2, so the spectral radius is 1/2 exactly.
class HalfCell : public Cell {
 public:
  std::string Name() const override { return "HalfCell"; }
  Var Forward(const Var& z, const Var& u, const std::vector<int64_t>&) const override {
    return add(mul_scalar(z, 0.5), u);
  }
};

// The gradient check's spectral-radius estimate on a cell whose answer is
// known, and on it the fixed_point adjoint with one iteration (w = g + g / 2
// instead of 2 g) is measurably off while ift/gmres is not.
TEST_F(TrainerTest, GradientCheckOnACellWithAKnownJacobian) {
  if (!CellRegistry().Has("test_half_cell")) {
    CellRegistry().Register("test_half_cell", [](const CellOptions&, Rng&) {
      return std::make_shared<HalfCell>();
    });
  }
  auto check = [&](const std::string& name, const std::vector<std::string>& backward) {
    std::vector<std::string> overrides = {"model.kind=implicit", "model.cell=test_half_cell",
                                          "model.solver.backward.solver=fixed_point",
                                          "dtype=float64", "train.steps=2",
                                          "log.dir=" + (dir_ / name).string()};
    overrides.insert(overrides.end(), backward.begin(), backward.end());
    const std::string path = WriteConfig(name);
    Experiment e = BuildExperiment(Config::FromFile(StillpointSchema(), path, overrides), path);
    return Train(e).gradient_check;
  };
  const GradientCheck exact = check("half_gmres", {"model.solver.backward.solver=gmres",
                                                   "model.solver.backward.tolerance=1e-12"});
  ASSERT_TRUE(exact.ran);
  EXPECT_NEAR(exact.spectral_radius, 0.5, 1e-9) << exact.Line();
  EXPECT_LT(exact.relative_error, 1e-9) << exact.Line();
  const GradientCheck one_step = check("half_one_step", {"model.solver.backward.max_iterations=1",
                                                         "model.solver.backward.tolerance=0"});
  EXPECT_NEAR(one_step.spectral_radius, 0.5, 1e-9) << one_step.Line();
  EXPECT_GT(one_step.relative_error, 1e-3) << one_step.Line();
  EXPECT_NE(one_step.used_brief.find("ift/fixed_point: INEXACT"), std::string::npos)
      << one_step.used_brief;
}

// A forward solver that cannot run on the model is a config error (exit 2)
// that names the key, found before the run directory is created.
TEST_F(TrainerTest, SolversThatCannotRunOnTheModelAreRefusedBeforeAnyWork) {
  struct Case {
    std::vector<std::string> overrides;
    std::string key;
    std::string why;
  };
  const std::vector<Case> cases = {
      {{"model.kind=implicit", "model.solver.forward.type=ceres_lbfgs"},
       "model.solver.forward.type",
       "has no energy"},
      {{"model.kind=implicit", "model.solver.forward.fallback_chain=[picard, ceres_lbfgs]"},
       "model.solver.forward.fallback_chain",
       "has no energy"},
      // 17 tokens x 64 = 1088 values per sample, above the dense limit 1024.
      {{"model.kind=implicit", "model.solver.forward.type=ceres_trust_region", "model.dim=64",
        "task.length=17", "model.max_length=20"},
       "model.solver.forward.type",
       "n = 17 tokens x model.dim 64 = 1088 values"},
  };
  for (const Case& c : cases) {
    TrainArgs args;
    args.config_path = WriteConfig("refused");
    args.overrides = c.overrides;
    std::ostringstream out, err;
    EXPECT_EQ(RunTrain(args, out, err), 2) << c.key;
    EXPECT_NE(err.str().find(c.key), std::string::npos) << err.str();
    EXPECT_NE(err.str().find(c.why), std::string::npos) << err.str();
    EXPECT_FALSE(fs::exists(dir_ / "run_refused")) << c.key;
  }
  // The energy kind has an energy, and a small state fits the dense solve.
  const std::string path = WriteConfig("accepted");
  EXPECT_NO_THROW(BuildExperiment(
      Config::FromFile(StillpointSchema(), path,
                       {"model.kind=energy", "model.solver.forward.type=ceres_lbfgs"}),
      path));
  EXPECT_NO_THROW(BuildExperiment(
      Config::FromFile(StillpointSchema(), path,
                       {"model.kind=implicit", "model.solver.forward.type=ceres_trust_region"}),
      path));
}

TEST_F(TrainerTest, EvalOfATrainedRunMatchesTheTrainingSummary) {
  TrainArgs args;
  args.config_path = WriteConfig("eval");
  args.overrides = {"model.kind=implicit", "train.steps=20"};
  std::ostringstream out, err;
  ASSERT_EQ(RunTrain(args, out, err), 0) << err.str();
  std::ifstream summary_file((dir_ / "run_eval" / "summary.json").string());
  const YAML::Node summary = YAML::Load(summary_file);
  EvalArgs eval;
  eval.run = (dir_ / "run_eval").string();
  eval.json = true;
  std::ostringstream eval_out;
  ASSERT_EQ(RunEval(eval, eval_out, err), 0) << err.str();
  const YAML::Node result = YAML::Load(eval_out.str());
  EXPECT_NEAR(result["accuracy"].as<double>(), summary["test_accuracy"].as<double>(), 1e-12);
  // More test-time iterations and a longer length are accepted.
  eval.iterations = 3;
  eval.length = 7;
  std::ostringstream longer;
  ASSERT_EQ(RunEval(eval, longer, err), 0) << err.str();
  EXPECT_EQ(YAML::Load(longer.str())["length"].as<int>(), 7);
  EXPECT_LE(YAML::Load(longer.str())["forward_iterations_max"].as<double>(), 3.0);
}

TEST_F(TrainerTest, CompareWritesAReportWithEveryVariant) {
  CompareArgs args;
  args.config_path = WriteConfig("compare",
                                 "compare: {variants: [explicit, implicit_jfb]}\n"
                                 "eval: {iterations_sweep: [1, 4], lengths: [5, 7]}\n");
  args.overrides = {"train.steps=10"};
  std::ostringstream out, err;
  CompareReport compared;
  ASSERT_EQ(RunCompare(args, out, err, &compared), 0) << err.str();
  // The console prints the short table; the full one is report.md's.
  EXPECT_NE(out.str().find(compared.console_table), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("implicit_jfb"), std::string::npos) << out.str();
  const std::string table = compared.table;
  EXPECT_NE(table.find("| explicit |"), std::string::npos) << table;
  EXPECT_NE(table.find("| implicit_jfb |"), std::string::npos) << table;
  // jfb solves no adjoint equation: its residual is n/a (never 0) and its
  // 16 samples are INEXACT, not CONVERGED.
  EXPECT_NE(table.find(" | n/a | INEXACT 16 | "), std::string::npos) << table;
  EXPECT_NE(table.find("| fwd status |"), std::string::npos) << table;
  std::ifstream md((dir_ / "run_compare" / "report.md").string());
  std::stringstream text;
  text << md.rdbuf();
  EXPECT_NE(text.str().find("accuracy_vs_depth.svg"), std::string::npos);
  EXPECT_NE(text.str().find("accuracy_vs_length.svg"), std::string::npos);
  std::ifstream html((dir_ / "run_compare" / "report.html").string());
  std::stringstream html_text;
  html_text << html.rdbuf();
  EXPECT_NE(html_text.str().find("<svg"), std::string::npos);
  // The curves' numbers follow their plots: lengths 5 and 7 for both
  // variants; iterations 1 and 4 for implicit_jfb, depth 2 for explicit.
  const std::string report = text.str();
  const auto length_table = report.find("| sequence length | explicit | implicit_jfb |");
  ASSERT_NE(length_table, std::string::npos) << report;
  EXPECT_NE(report.find("\n| 7 | ", length_table), std::string::npos) << report;
  const auto depth_table = report.find("| iterations or layers | explicit | implicit_jfb |");
  ASSERT_NE(depth_table, std::string::npos) << report;
  EXPECT_NE(report.find("\n| 1 | - | ", depth_table), std::string::npos) << report;
  EXPECT_NE(report.find("\n| 2 | ", depth_table), std::string::npos) << report;
  EXPECT_NE(html_text.str().find("<th>sequence length</th>"), std::string::npos);
  // The jfb row has a gradient cosine; explicit has none ("-").
  auto cells = [](const std::string& line) {
    std::vector<std::string> out;
    std::stringstream in(line);
    std::string cell;
    std::getline(in, cell, '|');
    while (std::getline(in, cell, '|')) out.push_back(cell);
    return out;
  };
  const std::vector<std::string> header = cells(table.substr(0, table.find('\n')));
  const auto column = std::find(header.begin(), header.end(), " grad cos vs ref ");
  ASSERT_NE(column, header.end()) << table;
  const std::size_t at = static_cast<std::size_t>(column - header.begin());
  const std::string jfb_row = table.substr(table.find("| implicit_jfb |"));
  const std::string explicit_row = table.substr(table.find("| explicit |"));
  EXPECT_NE(cells(jfb_row.substr(0, jfb_row.find('\n')))[at], " - ") << jfb_row;
  EXPECT_EQ(cells(explicit_row.substr(0, explicit_row.find('\n')))[at], " - ") << explicit_row;

  args.overrides = {"compare.variants=[explicit, implicit_magic]"};
  std::ostringstream err2;
  EXPECT_EQ(RunCompare(args, out, err2), 2);
  EXPECT_NE(err2.str().find("implicit_magic"), std::string::npos) << err2.str();
}

// The report reads each variant's metrics from whichever file log.formats
// kept.
TEST_F(TrainerTest, CompareWorksWithJsonLinesMetricsOnly) {
  CompareArgs args;
  args.config_path = WriteConfig("compare_jsonl", "compare: {variants: [explicit, tied]}\n");
  args.overrides = {"train.steps=6", "log.formats=[jsonl]"};
  std::ostringstream out, err;
  ASSERT_EQ(RunCompare(args, out, err), 0) << err.str();
  const fs::path run = dir_ / "run_compare_jsonl";
  EXPECT_FALSE(fs::exists(run / "explicit" / "metrics.csv"));
  ASSERT_TRUE(fs::exists(run / "explicit" / "metrics.jsonl"));
  std::ifstream svg((run / "loss.svg").string());
  std::stringstream text;
  text << svg.rdbuf();
  // One polyline per variant: the curves were read from the JSON lines.
  size_t lines = 0;
  for (size_t at = text.str().find("<polyline"); at != std::string::npos;
       at = text.str().find("<polyline", at + 1)) {
    ++lines;
  }
  EXPECT_GE(lines, 2u) << text.str();
}

TEST_F(TrainerTest, SteadyStateTrainingStepsTakeTensorMemoryOnlyFromThePool) {
  // After warm-up, an implicit model's training step (forward solve,
  // adjoint solve, optimizer update) takes its tensor storage from the pool:
  // fewer than 1% of the buffers come from the system allocator.
  const std::string path = WriteConfig("pool");
  Config config = Config::FromFile(StillpointSchema(), path, {"model.kind=implicit"});
  Experiment e = BuildExperiment(config, path);
  auto optimizer =
      Optimizer::Create(OptimizerOptionsFromConfig(config), e.model->named_parameters());
  Batcher batcher(*e.train, 16, 1, DType::kFloat32);
  auto step = [&] {
    const Batch batch = batcher.Next();
    Var loss = BatchLoss(ForwardBatch(*e.model, batch), batch);
    optimizer->ZeroGrad();
    backward(loss);
    optimizer->Step();
  };
  for (int k = 0; k < 10; ++k) step();
  ResetBufferPoolStats();
  for (int k = 0; k < 5; ++k) step();
  const BufferPoolStats stats = GetBufferPoolStats();
  // A solve whose set of still-active samples is new can ask for a buffer of
  // a size class not seen before; everything else is reused.
  const double requests = double(stats.system_allocations + stats.reuses);
  EXPECT_GT(stats.reuses, 1000);
  EXPECT_LT(stats.system_allocations, 0.01 * requests)
      << stats.system_allocations << " of " << requests << " tensor buffers came from the system";
}

// Pretraining runs the implicit model as the tied unroll of its own cell:
// its first steps are bitwise those of the tied model (same initialisation,
// same batches), no solver runs, and the solve takes over afterwards.
TEST_F(TrainerTest, PretrainingStepsAreTheTiedUnrollThenTheSolveTakesOver) {
  const std::string path = WriteConfig("pretrain");
  const std::vector<std::string> common = {"train.steps=6", "train.log_every=1",
                                           "train.eval_every=0"};
  std::vector<std::string> implicit = common;
  implicit.insert(implicit.end(), {"model.kind=implicit", "train.pretrain_steps=3",
                                   "log.dir=" + (dir_ / "run_pretrain").string()});
  std::vector<std::string> tied = common;
  tied.insert(tied.end(), {"model.kind=tied", "log.dir=" + (dir_ / "run_tied").string()});

  Experiment e_implicit =
      BuildExperiment(Config::FromFile(StillpointSchema(), path, implicit), path);
  Experiment e_tied = BuildExperiment(Config::FromFile(StillpointSchema(), path, tied), path);
  const TrainSummary s_implicit = Train(e_implicit);
  const TrainSummary s_tied = Train(e_tied);
  const auto m_implicit = ReadRunMetrics(s_implicit.run_dir);
  const auto m_tied = ReadRunMetrics(s_tied.run_dir);
  ASSERT_EQ(m_implicit.at("loss").size(), 6u);
  for (int step = 0; step < 6; ++step) {
    SCOPED_TRACE(step + 1);
    const double fwd = m_implicit.at("fwd_iters_mean")[step];
    if (step < 3) {
      EXPECT_EQ(m_implicit.at("loss")[step], m_tied.at("loss")[step]);
      EXPECT_TRUE(std::isnan(fwd)) << "no solve during pretraining";
    } else {
      EXPECT_GT(fwd, 0.0) << "the solve runs after pretraining";
    }
  }
  // Step 4 differs: the implicit model now solves to its fixed point.
  EXPECT_NE(m_implicit.at("loss")[3], m_tied.at("loss")[3]);
  EXPECT_EQ(e_implicit.model->depth_override(), 0);  // the solve is back on after training
}

// An evaluation during pretraining checks the unrolled gradient and measures
// the spectral radius at the fixed point of the check's own batch. It once
// measured it at the last fixed point solved, the evaluation's (64 rows
// here against the check's 8), and threw.
TEST_F(TrainerTest, AnEvaluationDuringPretrainingMeasuresTheCheckBatchsFixedPoint) {
  const std::string path = WriteConfig("pretrain_eval");
  Experiment e = BuildExperiment(
      Config::FromFile(StillpointSchema(), path,
                       {"model.kind=implicit", "train.pretrain_steps=4", "train.steps=6",
                        "train.eval_every=2", "train.log_every=1"}),
      path);
  const TrainSummary summary = Train(e);
  const auto metrics = ReadRunMetrics(summary.run_dir);
  const std::vector<double>& step = metrics.at("step");
  const std::vector<double>& radius = metrics.at("spectral_radius");
  int checked = 0;
  for (std::size_t i = 0; i < step.size(); ++i) {
    if (std::isnan(radius[i])) continue;
    SCOPED_TRACE(step[i]);
    EXPECT_GT(radius[i], 0.0);
    EXPECT_LT(radius[i], 10.0);
    ++checked;
  }
  EXPECT_EQ(checked, 3) << "steps 2 and 4 (pretraining) and 6 (the solve)";
  EXPECT_EQ(summary.gradient_check_step, 6);
}

// train.shards: the batch's shards run forward and backward on replicas of
// the model. In float64 the run is the unsharded run up to rounding: the
// same losses, accuracies and solver iterations at every logged step, with
// pretraining (the replicas' depth override) and the solve after it. The
// implicit model's default spectral-radius penalty is off here: each shard
// draws its own Arnoldi start vectors for its rows, so with it a sharded run
// is another draw of that stochastic term (docs/training.md, "Regularisers").
TEST_F(TrainerTest, ShardedStepsTrainTheSameRunToRounding) {
  for (const std::string kind : {"explicit", "implicit"}) {
    SCOPED_TRACE(kind);
    const std::string path = WriteConfig("shards_" + kind, "dtype: float64\n");
    std::vector<TrainSummary> summaries;
    for (const int shards : {1, 3}) {
      std::vector<std::string> overrides = {
          "model.kind=" + kind,
          "threads=2",
          "train.steps=12",
          "train.log_every=1",
          "train.pretrain_steps=" + std::string(kind == "implicit" ? "4" : "0"),
          "train.shards=" + std::to_string(shards),
          "log.dir=" + (dir_ / ("run_shards_" + kind + std::to_string(shards))).string()};
      if (kind == "implicit") overrides.push_back("model.regularization.spectral_radius_weight=0");
      Experiment e = BuildExperiment(Config::FromFile(StillpointSchema(), path, overrides), path);
      summaries.push_back(Train(e));
    }
    const auto whole = ReadRunMetrics(summaries[0].run_dir);
    const auto sharded = ReadRunMetrics(summaries[1].run_dir);
    ASSERT_EQ(whole.at("loss").size(), 12u);
    ASSERT_EQ(sharded.at("loss").size(), 12u);
    for (std::size_t step = 0; step < 12; ++step) {
      SCOPED_TRACE(step + 1);
      EXPECT_NEAR(sharded.at("loss")[step], whole.at("loss")[step], 1e-10);
      EXPECT_EQ(sharded.at("accuracy")[step], whole.at("accuracy")[step]);
      const double fwd_whole = whole.at("fwd_iters_mean")[step];
      const double fwd_sharded = sharded.at("fwd_iters_mean")[step];
      if (std::isnan(fwd_whole)) {
        EXPECT_TRUE(std::isnan(fwd_sharded));
      } else {
        EXPECT_NEAR(fwd_sharded, fwd_whole, 1e-12);
        EXPECT_EQ(sharded.at("bwd_iters_max")[step], whole.at("bwd_iters_max")[step]);
      }
    }
    EXPECT_NEAR(summaries[1].final_train_loss, summaries[0].final_train_loss, 1e-10);
  }
}

TEST_F(TrainerTest, ShardsThatDoNotFitAreConfigErrors) {
  const std::string path = WriteConfig("bad_shards");
  const auto train_with = [&](const std::vector<std::string>& overrides) {
    Experiment e = BuildExperiment(Config::FromFile(StillpointSchema(), path, overrides), path);
    Train(e);
  };
  try {
    train_with({"train.shards=17"});  // batch_size 16
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("train.shards (17) is more than"), std::string::npos)
        << error.what();
  }
  EXPECT_FALSE(fs::exists(dir_ / "run_bad_shards"));  // nothing written
}

// The Jacobian penalty with two shards: each shard adds its own estimate,
// weighted by its share of the batch, with probes of its own. The logged
// loss of the first step (same parameters) is the task loss plus the
// penalty; the run is reproducible, and 1 or 2 threads give the same
// parameters bitwise.
TEST_F(TrainerTest, JacobianPenaltyWorksWithShards) {
  const std::string path = WriteConfig("jacobian_shards");
  auto run = [&](const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> overrides = {"model.kind=implicit", "train.shards=2",
                                          "train.steps=4", "train.log_every=1",
                                          "log.dir=" + (dir_ / name).string()};
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    Experiment e = BuildExperiment(Config::FromFile(StillpointSchema(), path, overrides), path);
    Train(e);
    return std::make_pair(ReadMetricsCsv((dir_ / name / "metrics.csv").string()),
                          LoadCheckpoint((dir_ / name / "checkpoint.ckpt").string()));
  };
  const auto [plain_metrics, plain] = run("plain", {});
  const auto [penalised_metrics, penalised] =
      run("penalised", {"model.regularization.jacobian_weight=1", "threads=2"});
  const auto [again_metrics, again] =
      run("again", {"model.regularization.jacobian_weight=1", "threads=1"});
  EXPECT_GT(penalised_metrics.at("loss")[0], plain_metrics.at("loss")[0] + 1e-6);
  ASSERT_EQ(penalised.model.size(), again.model.size());
  bool differs_from_plain = false;
  for (std::size_t i = 0; i < penalised.model.size(); ++i) {
    EXPECT_EQ(penalised.model[i].second.ToVector(), again.model[i].second.ToVector())
        << penalised.model[i].first;
    differs_from_plain |= penalised.model[i].second.ToVector() != plain.model[i].second.ToVector();
  }
  EXPECT_TRUE(differs_from_plain);
}


// The Jacobian weight's ramp: at the first step the penalty enters with
// 1/jacobian_ramp_steps of its weight (the same probes, the same parameters,
// so the logged loss is the task loss plus a quarter of the full term).
TEST_F(TrainerTest, TheJacobianWeightRampsUp) {
  const std::string path = WriteConfig("jacobian_ramp");
  auto first_loss = [&](const std::string& name, std::vector<std::string> extra) {
    // The implicit model's default spectral-radius penalty off: its draw of
    // whether to apply at a step would follow the Jacobian term's.
    std::vector<std::string> overrides = {"model.kind=implicit", "train.steps=1",
                                          "train.log_every=1",
                                          "model.regularization.spectral_radius_weight=0",
                                          "log.dir=" + (dir_ / name).string()};
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    Experiment e = BuildExperiment(Config::FromFile(StillpointSchema(), path, overrides), path);
    Train(e);
    return ReadMetricsCsv((dir_ / name / "metrics.csv").string()).at("loss")[0];
  };
  const double plain = first_loss("plain", {});
  const double full = first_loss("full", {"model.regularization.jacobian_weight=1"});
  const double ramped = first_loss("ramped", {"model.regularization.jacobian_weight=1",
                                              "model.regularization.jacobian_ramp_steps=4"});
  ASSERT_GT(full - plain, 1e-4);
  EXPECT_NEAR(ramped - plain, (full - plain) / 4, 1e-3 * (full - plain));
}

// The fixed-point correction loss on a solve that stops on its tolerance
// well before its budget (the iterates it keeps follow the iterations it
// ran): every step runs, the logged loss of the first step (same
// parameters) is the task loss plus the correction term, and the updates
// differ from the plain run's.
TEST_F(TrainerTest, TheCorrectionLossTrainsOnAToleranceStoppedSolve) {
  const std::string path = WriteConfig("correction");
  auto run = [&](const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> overrides = {
        "model.kind=implicit", "model.solver.forward.max_iterations=60",
        "model.solver.forward.relative_tolerance=1e-3", "train.steps=6", "train.log_every=1",
        "log.dir=" + (dir_ / name).string()};
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    Experiment e = BuildExperiment(Config::FromFile(StillpointSchema(), path, overrides), path);
    const TrainSummary summary = Train(e);
    EXPECT_FALSE(summary.stopped_early) << summary.stop_reason;
    EXPECT_EQ(summary.steps, 6);
    return ReadMetricsCsv((dir_ / name / "metrics.csv").string());
  };
  const auto plain = run("plain", {});
  const auto corrected = run("corrected", {"model.regularization.correction_weight=0.5",
                                           "model.regularization.correction_iterates=3"});
  EXPECT_LT(plain.at("fwd_iters_max")[0], 30.0);  // far inside the budget of 60
  EXPECT_GT(corrected.at("loss")[0], plain.at("loss")[0] + 0.1);
  EXPECT_NE(corrected.at("loss").back() - corrected.at("loss")[0],
            plain.at("loss").back() - plain.at("loss")[0]);
}

// The spectral-radius penalty keeps the fixed-point map contractive: after
// the same steps the radius logged at the evaluation (power iteration at
// z*) is lower with it than without, for an implicit and an energy model.
TEST_F(TrainerTest, TheSpectralRadiusPenaltyLowersTheLoggedRadius) {
  const std::string path = WriteConfig("spectral");
  for (const std::string kind : {"implicit", "energy"}) {
    auto radius = [&](const std::string& name, std::vector<std::string> extra) {
      std::vector<std::string> overrides = {"model.kind=" + kind, "train.steps=40",
                                            "train.eval_every=40", "train.optimizer.lr=0.03",
                                            "log.dir=" + (dir_ / (kind + name)).string()};
      overrides.insert(overrides.end(), extra.begin(), extra.end());
      Experiment e =
          BuildExperiment(Config::FromFile(StillpointSchema(), path, overrides), path);
      Train(e);
      const auto metrics = ReadMetricsCsv((dir_ / (kind + name) / "metrics.csv").string());
      return metrics.at("spectral_radius").back();
    };
    const double plain = radius("plain", {});
    const double penalised = radius("penalised", {"model.regularization.spectral_radius_weight=5",
                                                  "model.regularization.spectral_radius_target=0"});
    EXPECT_GT(plain, 0.0) << kind;
    EXPECT_LT(penalised, 0.9 * plain) << kind;
  }
}


TEST(ConfigDocsTest, DocsConfigMdIsGeneratedFromTheSchema) {
  std::ifstream file(std::string(STILLPOINT_SOURCE_DIR) + "/docs/config.md");
  ASSERT_TRUE(file.good()) << "docs/config.md is missing; run `stillpoint config --doc`";
  std::stringstream text;
  text << file.rdbuf();
  EXPECT_EQ(text.str(), ConfigReferenceMarkdown())
      << "docs/config.md is out of date: regenerate it with "
         "`build/bin/stillpoint config --doc > docs/config.md`";
}

TEST(ExampleConfigsTest, EveryShippedConfigLoadsAndBuilds) {
  const fs::path dir = fs::path(STILLPOINT_SOURCE_DIR) / "examples" / "configs";
  int count = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".yaml") continue;
    ++count;
    SCOPED_TRACE(entry.path().string());
    Config config = Config::FromFile(StillpointSchema(), entry.path().string());
    Experiment e = BuildExperiment(config, entry.path().string());
    EXPECT_GT(e.model->NumParameters(), 0);
    EXPECT_GT(e.test->size(), 0);
  }
  EXPECT_GE(count, 3);
}

}  // namespace
}  // namespace stillpoint::trainer_test
