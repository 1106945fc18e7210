// The run-wide solve counts, the equilibrium verdict of summary.json, the
// one gradient check, compare's exit code and console table, and no figure
// for an evaluation that never ran.
#include "training/health.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "framework/ops.h"
#include "layers/registry.h"
#include "tests/scratch_path.h"
#include "training/cli/cli_commands.h"
#include "training/report/compare.h"
#include "training/config_schema.h"
#include "training/metrics.h"
#include "training/trainer.h"

namespace stillpoint::health_test {
namespace {

namespace fs = std::filesystem;

// f(z; u) = a z + u: J_f = a I, so the spectral radius is |a| exactly, and
// the equilibrium contracts for |a| < 1 only.
class ScaledCell : public Cell {
 public:
  explicit ScaledCell(double a) : a_(a) {}
  std::string Name() const override { return "ScaledCell"; }
  Var Forward(const Var& z, const Var& u, const std::vector<int64_t>&) const override {
    return add(mul_scalar(z, a_), u);
  }

 private:
  double a_;
};

// "test_scaled_cell_<a>" for the factors the tests use.
void RegisterScaledCells() {
  for (const auto& [name, a] : {std::pair<const char*, double>{"test_scaled_cell_0.5", 0.5},
                                {"test_scaled_cell_1.5", 1.5},
                                {"test_scaled_cell_2", 2.0},
                                {"test_scaled_cell_-1.5", -1.5}}) {
    if (CellRegistry().Has(name)) continue;
    const double factor = a;
    CellRegistry().Register(name, [factor](const CellOptions&, Rng&) {
      return std::make_shared<ScaledCell>(factor);
    });
  }
}

class HealthTest : public testing_support::ScratchDirTest {
 protected:
  HealthTest() : ScratchDirTest("health") { RegisterScaledCells(); }

  std::string WriteConfig(const std::string& name) {
    const std::string path = (dir_ / (name + ".yaml")).string();
    std::ofstream(path) << "seed: 3\nthreads: 1\n"
                        << "task: {kind: reverse, length: 5, vocab_size: 5, train_examples: 128, "
                           "test_examples: 32}\n"
                        << "model:\n  dim: 8\n  heads: 2\n  hidden: 16\n  max_length: 8\n"
                        << "  num_layers: 2\n  unroll_steps: 2\n"
                        << "train:\n  steps: 6\n  batch_size: 8\n  eval_every: 3\n"
                        << "  log_every: 3\n  checkpoint_every: 0\n"
                        << "log: {dir: " << (dir_ / ("run_" + name)).string()
                        << ", progress: none, plots: false}\n";
    return path;
  }

  TrainSummary Run(const std::string& name, const std::vector<std::string>& overrides) {
    const std::string path = WriteConfig(name);
    Experiment e = BuildExperiment(Config::FromFile(StillpointSchema(), path, overrides), path);
    return Train(e);
  }

  YAML::Node Json(const std::string& name) {
    return YAML::LoadFile((dir_ / ("run_" + name) / "summary.json").string());
  }
};

const std::vector<std::string> kExactLinear = {
    "model.kind=implicit", "dtype=float64", "model.solver.backward.solver=gmres",
    "model.solver.backward.tolerance=1e-12", "model.solver.forward.relative_tolerance=1e-10"};

std::vector<std::string> With(std::vector<std::string> base, const std::vector<std::string>& more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

// A contracting cell solved exactly: healthy, with the radius, the
// converged fractions and the cosine in summary.json.
TEST_F(HealthTest, AContractingExactlySolvedModelIsHealthy) {
  const TrainSummary s = Run("healthy", With(kExactLinear, {"model.cell=test_scaled_cell_0.5"}));
  EXPECT_EQ(s.equilibrium.verdict, "healthy");
  const YAML::Node e = Json("healthy")["equilibrium"];
  ASSERT_TRUE(e.IsMap());
  EXPECT_EQ(e["verdict"].as<std::string>(), "healthy");
  EXPECT_NEAR(e["layers"]["model"]["spectral_radius_max"].as<double>(), 0.5, 1e-9);
  EXPECT_NEAR(e["layers"]["model"]["dominant_eigenvalue"].as<double>(), 0.5, 1e-9);
  EXPECT_EQ(e["layers"]["model"]["forward_converged_fraction"].as<double>(), 1.0);
  EXPECT_EQ(e["layers"]["model"]["backward_converged_fraction"].as<double>(), 1.0);
  EXPECT_EQ(e["layers"]["model"]["forward"]["solves"].as<int>(), 6);  // one per step
  EXPECT_EQ(e["layers"]["model"]["backward"]["solves"].as<int>(), 6);
  EXPECT_EQ(e["gradient_checks"].as<int>(), 2);  // steps 3 and 6
  EXPECT_GT(e["gradient_cosine_min"].as<double>(), 1.0 - 1e-9);
  EXPECT_EQ(Json("healthy")["forward_unconverged_steps"].as<int>(), 0);
}

// An expanding cell (rho 1.5) is unhealthy, naming the radius, however
// exactly it is solved; a threshold above it makes it healthy again.
TEST_F(HealthTest, AnExpandingMapIsUnhealthyUnlessTheThresholdAllowsIt) {
  const TrainSummary s =
      Run("expanding", With(kExactLinear, {"model.cell=test_scaled_cell_1.5",
                                           "model.solver.forward.type=anderson"}));
  EXPECT_EQ(s.equilibrium.verdict.rfind("unhealthy: ", 0), 0u) << s.equilibrium.verdict;
  EXPECT_NE(s.equilibrium.verdict.find("model spectral radius 1.5 >= 1 (eigenvalue 1.5: an "
                                       "expanding direction)"),
            std::string::npos)
      << s.equilibrium.verdict;
  EXPECT_EQ(Json("expanding")["equilibrium"]["verdict"].as<std::string>(), s.equilibrium.verdict);

  const TrainSummary allowed =
      Run("allowed", With(kExactLinear, {"model.cell=test_scaled_cell_1.5",
                                         "model.solver.forward.type=anderson",
                                         "health.max_spectral_radius=2"}));
  EXPECT_EQ(allowed.equilibrium.verdict, "healthy");
}

// The sign of the dominant eigenvalue tells an overshooting map (-1.5:
// damping would contract it) from an expanding one.
TEST_F(HealthTest, TheVerdictTellsAnOvershootingMapFromAnExpandingOne) {
  const TrainSummary s =
      Run("overshooting", With(kExactLinear, {"model.cell=test_scaled_cell_-1.5",
                                              "model.solver.forward.type=anderson"}));
  EXPECT_NE(s.equilibrium.verdict.find("model spectral radius 1.5 >= 1 (eigenvalue -1.5: an "
                                       "overshooting step"),
            std::string::npos)
      << s.equilibrium.verdict;
  EXPECT_NEAR(Json("overshooting")["equilibrium"]["layers"]["model"]["dominant_eigenvalue"]
                  .as<double>(),
              -1.5, 1e-9);
}

// A starved forward solve is counted in every step, and the verdict says
// how many of its samples converged.
TEST_F(HealthTest, UnconvergedForwardSolvesAreCountedOverTheWholeRun) {
  const TrainSummary s =
      Run("starved", With(kExactLinear, {"model.cell=test_scaled_cell_0.5",
                                         "model.solver.forward.type=picard",
                                         "model.solver.forward.max_iterations=2"}));
  const YAML::Node json = Json("starved");
  EXPECT_EQ(json["forward_unconverged_steps"].as<int>(), 6);
  EXPECT_EQ(json["backward_unconverged_steps"].as<int>(), 0);
  EXPECT_EQ(json["solve_counts"]["model"]["forward"]["unconverged_solves"].as<int>(), 6);
  EXPECT_EQ(json["solve_counts"]["model"]["forward"]["samples"].as<int>(), 6 * 8);
  EXPECT_EQ(json["solve_counts"]["model"]["forward"]["converged_samples"].as<int>(), 0);
  EXPECT_NE(s.equilibrium.verdict.find("model forward solves converged for 0.00% of samples"),
            std::string::npos)
      << s.equilibrium.verdict;
}

// A fraction just below the threshold is written with the decimals that
// tell the two apart: never "99.90% of samples < 99.90%".
TEST(HealthVerdictTest, AFractionJustBelowTheThresholdReadsBelowIt) {
  RunSolveCounts counts;
  SolveTally& adjoint = counts.solves[SolveFamily::kModel].backward;
  adjoint.solves = 1;
  adjoint.samples = 100000;
  adjoint.converged_samples = 99896;
  SolveTally& forward = counts.solves[SolveFamily::kModel].forward;
  forward.solves = 1;
  forward.samples = 100;
  forward.converged_samples = 50;
  const Equilibrium e = AssessEquilibrium(true, counts, EquilibriumMonitor{}, HealthOptions{});
  EXPECT_NE(e.verdict.find("model adjoint solves converged for 99.896% of samples < 99.900%"),
            std::string::npos)
      << e.verdict;
  EXPECT_NE(e.verdict.find("model forward solves converged for 50.00% of samples < 99.90%"),
            std::string::npos)
      << e.verdict;
}

// A forward solve that diverges hands on its best iterate: the step is a
// failed one (skipped, its reason naming the solve), never applied.
TEST_F(HealthTest, ADivergedForwardSolveFailsTheStep) {
  const TrainSummary s =
      Run("diverged", With(kExactLinear, {"model.cell=test_scaled_cell_2",
                                          "model.solver.forward.type=picard",
                                          "model.solver.forward.fallback_chain=[]",
                                          "model.solver.forward.max_iterations=60"}));
  EXPECT_EQ(s.skipped_steps, 6);
  EXPECT_GT(s.solve_counts.solves[SolveFamily::kModel].forward.failed_solves, 0);
  const YAML::Node json = Json("diverged");
  EXPECT_EQ(json["solve_counts"]["model"]["forward"]["failed_solves"].as<int>(), 6);
}

// The inner solves of an energy attention in an implicit cell: every inner
// adjoint of a step is counted (one per VJP of the outer adjoint solve, not
// only the last), and the per-family step counts are in summary.json.
TEST_F(HealthTest, EveryInnerAdjointOfAStepIsCounted) {
  const TrainSummary s = Run("inner", {"model.kind=implicit", "model.attention=probabilistic",
                                       "model.solver.backward.solver=fixed_point",
                                       "model.attention_solver.backward.max_iterations=1"});
  const ImplicitTally& outer = s.solve_counts.solves[SolveFamily::kModel];
  const ImplicitTally& inner = s.solve_counts.solves[SolveFamily::kAttention];
  // Every outer adjoint iteration is a VJP through the cell, whose
  // attention solves its own adjoint each time.
  EXPECT_GT(inner.backward.solves, 2 * outer.backward.solves);
  EXPECT_GT(inner.forward.solves, outer.forward.solves);
  const YAML::Node json = Json("inner");
  EXPECT_EQ(json["solve_counts"]["attention"]["backward"]["solves"].as<int64_t>(),
            inner.backward.solves);
  // One adjoint iteration leaves the inner adjoints unconverged: counted in
  // every step, and on_unconverged (warn) watched them.
  EXPECT_EQ(json["attention_backward_unconverged_steps"].as<int>(), 6);
}

// on_unconverged: stop watches the inner adjoints too; the run stops at its
// first step, before any evaluation: no held-out figure is written, and the
// reason is.
TEST_F(HealthTest, AStopBeforeTheFirstEvaluationWritesNoHeldOutFigures) {
  const TrainSummary s = Run("stopped", {"model.kind=explicit", "model.attention=probabilistic",
                                         "model.attention_solver.backward.max_iterations=1",
                                         "train.on_unconverged=stop"});
  EXPECT_TRUE(s.stopped_early);
  EXPECT_EQ(s.steps, 1);
  EXPECT_EQ(s.final_eval.examples, 0);
  const YAML::Node json = Json("stopped");
  EXPECT_TRUE(json["test_loss"].IsNull());
  EXPECT_TRUE(json["test_accuracy"].IsNull());
  EXPECT_NE(json["test_not_evaluated"].as<std::string>().find("stopped before its first"),
            std::string::npos);
  EXPECT_EQ(s.BriefReport().find("test accuracy"), std::string::npos) << s.BriefReport();
}

// A health threshold out of its range is refused naming the key.
TEST_F(HealthTest, AThresholdOutOfRangeIsRefused) {
  const std::string path = WriteConfig("bad");
  for (const std::string& bad : {std::string("health.min_converged_fraction=1.5"),
                                 std::string("health.min_gradient_cosine=-2"),
                                 std::string("health.max_spectral_radius=0")}) {
    try {
      Config::FromFile(StillpointSchema(), path, {bad});
      ADD_FAILURE() << bad << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(bad.substr(0, bad.find('='))), std::string::npos)
          << e.what();
    }
  }
}

// compare: a variant that stops early makes it exit 1 and shows the stop;
// the console table fits 100 columns and carries the verdict; the gradient
// figure is the run's own, the same as its summary.json.
TEST_F(HealthTest, CompareExitsOneWhenAVariantStoppedAndFitsAHundredColumns) {
  const std::string path = WriteConfig("compare");
  CompareArgs args;
  args.config_path = path;
  args.overrides = {"compare.variants=[implicit,explicit]", "model.attention=probabilistic",
                    "model.attention_solver.backward.max_iterations=1",
                    "train.on_unconverged=stop", "eval.iterations_sweep=[1]",
                    "log.dir=" + (dir_ / "cmp").string()};
  std::ostringstream out, err;
  CompareReport report;
  EXPECT_EQ(RunCompare(args, out, err, &report), 1) << out.str() << err.str();
  EXPECT_NE(err.str().find("stopped early"), std::string::npos) << err.str();
  EXPECT_NE(report.console_table.find("stopped"), std::string::npos) << report.console_table;
  EXPECT_NE(report.table.find("stopped at step 1"), std::string::npos) << report.table;
  std::istringstream lines(report.console_table);
  std::string line;
  int rows = 0;
  while (std::getline(lines, line)) {
    ++rows;
    std::size_t width = 0;
    for (unsigned char c : line) width += (c & 0xC0) != 0x80;
    EXPECT_LE(width, 100u) << line;
  }
  EXPECT_EQ(rows, 3);
  EXPECT_NE(report.console_table.find("equilibrium"), std::string::npos);

  // Without the stop both train to the end: exit 0.
  args.overrides = {"compare.variants=[implicit,explicit]", "eval.iterations_sweep=[1]",
                    "dtype=float64", "log.dir=" + (dir_ / "cmp_ok").string()};
  std::ostringstream out_ok, err_ok;
  CompareReport ok;
  EXPECT_EQ(RunCompare(args, out_ok, err_ok, &ok), 0) << err_ok.str();
  for (const VariantResult& v : ok.variants) {
    const YAML::Node json = YAML::LoadFile(v.run_dir + "/summary.json");
    if (v.name == "explicit") {
      EXPECT_TRUE(json["gradient_check"].IsNull());
      EXPECT_TRUE(json["equilibrium"].IsNull());
      continue;
    }
    ASSERT_TRUE(json["gradient_check"].IsMap());
    const YAML::Node cosine = json["gradient_check"]["cosine"];
    if (cosine.IsNull()) {
      EXPECT_TRUE(std::isnan(v.gradient_cosine_vs_ift));
    } else {
      EXPECT_EQ(v.gradient_cosine_vs_ift, cosine.as<double>());
    }
    EXPECT_EQ(json["equilibrium"]["verdict"].as<std::string>(), v.train.equilibrium.verdict);
  }
}

// `report` pools the seeds of a variant: a seed that never evaluated is
// left out of the held-out cells and the cell says so; its stop is shown.
TEST_F(HealthTest, PooledCellsSayHowManySeedsTheyPool) {
  auto write = [&](const std::string& seed, const std::string& summary) {
    const fs::path run = dir_ / "runs" / "a" / ("seed-" + seed);
    fs::create_directories(run);
    std::ofstream(run / "summary.json") << summary;
    std::ofstream(run / "metrics.jsonl") << "{\"step\": 1, \"loss\": 1.5}\n";
    std::ofstream(run / "variant.json")
        << "{\"name\": \"a\", \"seed\": " << seed
        << ", \"overrides\": [], \"accuracy_vs_depth\": [], \"accuracy_vs_length\": []}\n";
  };
  write("0",
        "{\"steps\": 5, \"test_loss\": 0.5, \"test_accuracy\": 0.9, \"test_examples\": 10, "
        "\"seconds_per_step\": 0.01}\n");
  // An old summary.json wrote 0 for a run that never evaluated.
  write("1",
        "{\"steps\": 1, \"test_loss\": 0, \"test_accuracy\": 0, \"test_examples\": 0, "
        "\"seconds_per_step\": 0.01, \"stopped_early\": true, \"stop_reason\": \"x\"}\n");
  ReportArgs report;
  report.runs = {(dir_ / "runs").string()};
  report.out_dir = (dir_ / "report").string();
  std::ostringstream out, err;
  ASSERT_EQ(RunReport(report, out, err), 0) << err.str();
  std::ifstream in(dir_ / "report" / "report.md");
  std::stringstream md;
  md << in.rdbuf();
  const std::string text = md.str();
  const std::size_t row = text.find("| a | 2 |");
  ASSERT_NE(row, std::string::npos) << text;
  const std::string line = text.substr(row, text.find('\n', row) - row);
  EXPECT_NE(line.find("| 90.00% (1 of 2 seeds) |"), std::string::npos) << line;
  EXPECT_NE(line.find("| 0.5000 (1 of 2 seeds) |"), std::string::npos) << line;
  EXPECT_NE(line.find("stopped (1 of 2 seeds)"), std::string::npos) << line;
  EXPECT_EQ(line.find("| 0.00%"), std::string::npos) << line;
}

}  // namespace
}  // namespace stillpoint::health_test
