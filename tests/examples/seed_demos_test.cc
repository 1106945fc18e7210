// The seed papers' claims as `stillpoint demo` shows them (docs/seeds.md),
// run through the program as a user runs it, and the bad input of the demo
// and correct commands (exit code 2, the culprit named).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/scratch_path.h"
#include "tests/shell_text.h"

#ifndef STILLPOINT_CLI_PATH
#error "the build gives the path of the stillpoint program"
#endif

namespace stillpoint::seed_demos_test {
namespace {

namespace fs = std::filesystem;
using testing_support::Quoted;
using testing_support::ReadText;

class SeedDemosTest : public testing_support::ScratchDirTest {
 protected:
  SeedDemosTest() : ScratchDirTest("demos") {}

  // Runs `stillpoint args...`; returns its exit code, keeps its output.
  int Run(const std::vector<std::string>& args) {
    std::string command = Quoted(STILLPOINT_CLI_PATH);
    for (const std::string& a : args) command += " " + Quoted(a);
    command += " > " + Quoted((dir_ / "stdout").string()) + " 2> " +
               Quoted((dir_ / "stderr").string());
    const int status = std::system(command.c_str());
    out_ = ReadText(dir_ / "stdout");
    err_ = ReadText(dir_ / "stderr");
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  YAML::Node Summary(const std::string& sub) const {
    return YAML::LoadFile((dir_ / sub / "summary.json").string());
  }
  // Data rows of a CSV file (header excluded), as numbers.
  std::vector<std::vector<double>> CsvRows(const fs::path& path) const {
    std::ifstream in(path);
    std::string line;
    std::getline(in, line);
    std::vector<std::vector<double>> rows;
    while (std::getline(in, line)) {
      std::vector<double> row;
      std::stringstream cells(line);
      std::string cell;
      while (std::getline(cells, cell, ',')) row.push_back(std::stod(cell));
      rows.push_back(row);
    }
    return rows;
  }

  std::string out_, err_;
};

// Seed 003 (Z1, Z2): both attentions converge to their conditional means at
// the Monte Carlo rate L^-1/2, and the error at L = 4096 is the one the
// delta method predicts.
TEST_F(SeedDemosTest, ExchangeableAttentionConvergesAtTheMonteCarloRate) {
  ASSERT_EQ(Run({"demo", "exchangeable", "--out", (dir_ / "ex").string()}), 0) << err_;
  const YAML::Node s = Summary("ex");
  for (const char* slope : {"slope", "rbf_slope"}) {
    EXPECT_GE(s[slope].as<double>(), -0.6) << slope;
    EXPECT_LE(s[slope].as<double>(), -0.4) << slope;
  }
  // 400 trials: the measured RMS error is within about 5% of its
  // expectation (one standard deviation); 20% is four.
  for (const char* variant : {"", "rbf_"}) {
    const double measured = s[std::string(variant) + "final_error"].as<double>();
    const double expected = s[std::string(variant) + "expected_final_error"].as<double>();
    EXPECT_NEAR(measured / expected, 1.0, 0.2) << variant << "final_error " << measured;
  }
  EXPECT_EQ(CsvRows(dir_ / "ex" / "exchangeable.csv").size(), 11u);  // L = 4 .. 4096
  EXPECT_NE(ReadText(dir_ / "ex" / "error.svg").find("<polyline"), std::string::npos);
}

// Seeds 000/002 (S7b): tokens under z <- LN((I + Sigma) z) approach the top
// eigenvector at the rate lambda2 / lambda1.
TEST_F(SeedDemosTest, LayerNormEquilibriumConvergesAtTheEigenvalueRatio) {
  ASSERT_EQ(Run({"demo", "hidden-state", "--out", (dir_ / "hs").string()}), 0) << err_;
  const YAML::Node s = Summary("hs");
  const double measured = s["ln_rate_measured"].as<double>();
  const double predicted = s["ln_rate_predicted"].as<double>();
  EXPECT_NEAR(measured, predicted, 0.05);
  EXPECT_NEAR(predicted, s["lambda_2"].as<double>() / s["lambda_1"].as<double>(), 1e-12);
  // The Jacobian's spectral radius at the equilibrium, by power iteration on
  // VJPs, is the same ratio computed another way.
  EXPECT_NEAR(s["jacobian_radius"].as<double>(), predicted, 1e-3);
  EXPECT_GT(s["final_alignment"].as<double>(), 0.999);
  const std::vector<std::vector<double>> rows = CsvRows(dir_ / "hs" / "hidden_state.csv");
  ASSERT_EQ(rows.size(), 41u);
  // The covariance collapses onto one direction: its top eigenvalue takes
  // all the variance at the end, not at the start.
  // Columns: iteration, mean_norm, mean_1..8, eigenvalue_1..8, ...
  EXPECT_LT(rows.front()[10] / (rows.front()[10] + rows.front()[11]), 0.9);
  EXPECT_GT(rows.back()[10] / (rows.back()[10] + rows.back()[11]), 0.999);
}

// Seed 004 (M1-M3): clamping labels propagates to the positions not clamped,
// key adaptation recovers accuracy on shifted digits; `stillpoint correct`
// and `demo hidden-state --run` read the demo's trained run.
TEST_F(SeedDemosTest, CorrectionImprovesUnclampedAndShiftedAccuracy) {
  const fs::path out = dir_ / "co";
  ASSERT_EQ(Run({"demo", "correction", "--out", out.string()}), 0) << err_;
  const YAML::Node s = Summary("co");
  const double before = s["accuracy_unclamped_before"].as<double>();
  const double after = s["accuracy_unclamped_after"].as<double>();
  EXPECT_GT(after, before + 0.3) << "clamping 8 of 16 positions";
  EXPECT_GT(s["shift_accuracy_after"].as<double>(), s["shift_accuracy_before"].as<double>() + 0.08);
  // The clean accuracy stays within a few points (the prior holds the keys).
  EXPECT_GT(s["clean_accuracy_after"].as<double>(), s["clean_accuracy_before"].as<double>() - 0.06);
  const std::vector<std::vector<double>> curve = CsvRows(out / "clamping.csv");
  ASSERT_EQ(curve.size(), 9u);  // 0 .. 8 clamped positions
  // One clamp per segment (4) already decides most of every segment.
  EXPECT_GT(curve[4][1], before + 0.3);

  // One test sequence, one label given per segment.
  std::ifstream test_csv(out / "data" / "test.csv");
  std::string line;
  std::getline(test_csv, line);
  std::vector<std::string> cells;
  std::stringstream split(line);
  for (std::string cell; std::getline(split, cell, ',');) cells.push_back(cell);
  ASSERT_EQ(cells.size(), 32u);
  std::string input;
  for (int t = 0; t < 16; ++t) input += (t ? " " : "") + cells[t];
  std::vector<std::string> args = {"correct", (out / "run").string(), "--input", input};
  for (int t : {0, 4, 8, 12}) {
    args.push_back("--clamp");
    args.push_back(std::to_string(t) + "=" + cells[16 + t]);
  }
  ASSERT_EQ(Run(args), 0) << err_;
  auto predictions = [&](const std::string& name) {
    const std::size_t at = out_.find(name);
    EXPECT_NE(at, std::string::npos) << out_;
    std::stringstream row(out_.substr(at + name.size(), out_.find('\n', at) - at - name.size()));
    std::vector<std::string> v;
    for (std::string word; row >> word;) v.push_back(word);
    return v;
  };
  const std::vector<std::string> plain = predictions("before:"), corrected = predictions("after:");
  ASSERT_EQ(plain.size(), 16u);
  ASSERT_EQ(corrected.size(), 16u);
  int right_before = 0, right_after = 0;
  for (int t = 0; t < 16; ++t) {
    if (t % 4 == 0) continue;
    right_before += plain[t] == cells[16 + t];
    right_after += corrected[t] == cells[16 + t];
  }
  EXPECT_GT(right_after, right_before) << out_;
  // A prior precision beyond float32 (the run's dtype) printed garbage and
  // exited 0 (issue 48, item 9).
  std::vector<std::string> huge = args;
  huge.insert(huge.end(), {"--value-prior-precision", "1e39"});
  EXPECT_EQ(Run(huge), 2);
  EXPECT_NE(err_.find("--value-prior-precision 1e+39 does not fit in float32"), std::string::npos)
      << err_;
  // The demo's folder now holds its outputs: a second demo there is refused
  // without --overwrite, before any work (the output policy).
  EXPECT_EQ(Run({"demo", "correction", "--out", out.string()}), 2);
  EXPECT_NE(err_.find("already holds files; --overwrite"), std::string::npos) << err_;

  // The trained run's own solve: the contraction rate of its iterations is
  // the spectral radius of its Jacobian at the fixed point (the block's
  // value contraction makes it fast, so the burn-in is short).
  ASSERT_EQ(Run({"demo", "hidden-state", "--run", (out / "run").string(), "--out",
                 (dir_ / "hs").string(), "--iterations", "80", "--burn-in", "10"}),
            0)
      << err_;
  const YAML::Node h = Summary("hs");
  EXPECT_NEAR(h["ln_rate_measured"].as<double>(), h["ln_rate_predicted"].as<double>(), 0.05);
}

// The same measurement on a small trained implicit (DEQ-cell) model.
TEST_F(SeedDemosTest, TrainedImplicitModelContractsAtItsJacobianRadius) {
  const std::string run = (dir_ / "implicit_run").string();
  ASSERT_EQ(Run({"train", std::string(STILLPOINT_SOURCE_DIR) + "/tests/data/progress_tiny.yaml",
                 "log.dir=" + run, "log.progress=none", "model.kind=implicit", "train.steps=30"}),
            0)
      << err_;
  ASSERT_EQ(Run({"demo", "hidden-state", "--run", run, "--out", (dir_ / "hs").string()}), 0)
      << err_;
  const YAML::Node h = Summary("hs");
  EXPECT_NEAR(h["ln_rate_measured"].as<double>(), h["ln_rate_predicted"].as<double>(), 0.05);
  EXPECT_LT(h["ln_rate_predicted"].as<double>(), 1.0);
}

TEST_F(SeedDemosTest, BadInputExitsWithTwoAndNamesTheCulprit) {
  const std::string out = (dir_ / "x").string();
  EXPECT_EQ(Run({"demo", "exchangable", "--out", out}), 2);
  EXPECT_NE(err_.find("exchangable"), std::string::npos) << err_;
  EXPECT_EQ(Run({"demo", "exchangeable", "--out", out, "--bogus", "1"}), 2);
  EXPECT_NE(err_.find("--bogus"), std::string::npos) << err_;
  EXPECT_EQ(Run({"demo", "exchangeable"}), 2);
  EXPECT_NE(err_.find("--out"), std::string::npos) << err_;
  EXPECT_EQ(Run({"demo", "exchangeable", "--out", out, "--trials", "1"}), 2);
  EXPECT_NE(err_.find("--trials"), std::string::npos) << err_;
  EXPECT_EQ(Run({"demo", "hidden-state", "--out", out, "--iterations", "3"}), 2);
  EXPECT_NE(err_.find("--iterations"), std::string::npos) << err_;
  EXPECT_EQ(Run({"demo", "correction", "--out", out, "--observation-accuracy", "0.1"}), 2);
  EXPECT_NE(err_.find("--observation-accuracy"), std::string::npos) << err_;
  EXPECT_EQ(Run({"demo", "correction", "--out", out, "--value-prior-precision", "1e39"}), 2);
  EXPECT_NE(err_.find("--value-prior-precision must be in (0, 3.40282e+38]"), std::string::npos)
      << err_;
  EXPECT_FALSE(fs::exists(out)) << "no output for bad input";

  const fs::path file = dir_ / "a_file";
  std::ofstream(file) << "not a directory\n";
  EXPECT_EQ(Run({"demo", "hidden-state", "--out", file.string()}), 2);
  EXPECT_NE(err_.find(file.string()), std::string::npos) << err_;

  const std::string missing = (dir_ / "no_such_run").string();
  EXPECT_EQ(Run({"demo", "hidden-state", "--out", out, "--run", missing}), 2);
  EXPECT_NE(err_.find(missing), std::string::npos) << err_;

  // A run without an implicit layer or probabilistic attention: a tied
  // model trained for a few steps.
  const std::string run = (dir_ / "tied_run").string();
  ASSERT_EQ(Run({"train", std::string(STILLPOINT_SOURCE_DIR) + "/tests/data/progress_tiny.yaml",
                 "log.dir=" + run, "log.progress=none"}),
            0)
      << err_;
  EXPECT_EQ(Run({"demo", "hidden-state", "--out", out, "--run", run}), 2);
  EXPECT_NE(err_.find(run), std::string::npos) << err_;
  EXPECT_NE(err_.find("no implicit layer"), std::string::npos) << err_;
  EXPECT_EQ(Run({"correct", run, "--input", "0 1 2 3", "--clamp", "0=1"}), 2);
  EXPECT_NE(err_.find(run), std::string::npos) << err_;
  EXPECT_NE(err_.find("no probabilistic attention"), std::string::npos) << err_;
  EXPECT_EQ(Run({"correct", run, "--input", "0 1 2 3", "--clamp", "0"}), 2);
  EXPECT_NE(err_.find("POS=VALUE"), std::string::npos) << err_;
  EXPECT_EQ(Run({"correct", run, "--input", "0 x", "--clamp", "0=1"}), 2);
  EXPECT_NE(err_.find("'x'"), std::string::npos) << err_;
}

}  // namespace
}  // namespace stillpoint::seed_demos_test
