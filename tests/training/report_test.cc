// The comparison report and the run's figures as a reader sees them: round
// ticks with units, held-out points joined into lines, legends that fit,
// accuracies in percent, seeds pooled into mean ± std and bands, and
// `stillpoint report` rebuilding the report from run directories.
#include "training/report/compare_report.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <filesystem>
#include <iomanip>
#include <fstream>
#include <regex>
#include <sstream>

#include "tests/scratch_path.h"
#include "training/cli/cli_commands.h"
#include "training/config_schema.h"
#include "training/metrics.h"
#include "training/provenance.h"
#include "training/svg_plot.h"
#include "training/trainer.h"

namespace stillpoint::report_test {
namespace {

namespace fs = std::filesystem;

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The text of every <text> element of an SVG.
std::vector<std::string> Labels(const std::string& svg) {
  std::vector<std::string> labels;
  const std::regex text("<text[^>]*>([^<]*)</text>");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), text); it != std::sregex_iterator();
       ++it) {
    labels.push_back((*it)[1]);
  }
  return labels;
}

// Whether the ticks are consecutive multiples of one spacing of 1, 2 or 5
// times a power of ten.
bool AreRound(const std::vector<double>& ticks) {
  if (ticks.size() < 2) return false;
  const double step = ticks[1] - ticks[0];
  const double decade = std::pow(10.0, std::floor(std::log10(step) + 1e-9));
  const double mantissa = step / decade;
  bool round_step = false;
  for (double m : {1.0, 2.0, 5.0}) round_step = round_step || std::abs(mantissa - m) < 1e-9;
  if (!round_step) return false;
  for (std::size_t i = 0; i < ticks.size(); ++i) {
    const double multiple = ticks[i] / step;
    if (std::abs(multiple - std::round(multiple)) > 1e-6) return false;
    if (i > 0 && std::abs(ticks[i] - ticks[i - 1] - step) > 1e-9 * std::abs(step) * 10) return false;
  }
  return true;
}

TEST(TicksTest, LinearTicksAreRoundAndAtLeastFour) {
  for (const auto& [low, high] : std::vector<std::pair<double, double>>{
           {0, 300}, {97.6, 100.2}, {0.9990, 1.0001}, {-3, 7}, {12.5, 13}}) {
    const std::vector<double> ticks = LinearTicks(low, high);
    ASSERT_GE(ticks.size(), 4u) << low << " " << high;
    EXPECT_LE(ticks.size(), 11u);
    for (double t : ticks) {
      EXPECT_GE(t, low - 1e-9);
      EXPECT_LE(t, high + 1e-9);
    }
    EXPECT_TRUE(AreRound(ticks)) << low << " " << high;
  }
  EXPECT_EQ(TickLabel(3 * 0.1), "0.3");
  EXPECT_EQ(TickLabel(100000), "100000");
  EXPECT_EQ(TickLabel(1e-6), "1e-06");
  EXPECT_EQ(TickLabel(-0.0), "0");
}

TEST(TicksTest, LogTicksArePowersOfTenOrRoundValues) {
  // Four decades: powers of ten only (not 3.162, 0.3162, ...).
  std::vector<double> ticks = LogTicks(0.003, 40);
  ASSERT_EQ(ticks.size(), 4u);
  EXPECT_EQ(TickLabel(ticks[0]), "0.01");
  EXPECT_EQ(TickLabel(ticks[3]), "10");
  // One decade and a bit: 1, 2 and 5 times powers of ten.
  ticks = LogTicks(0.15, 3);
  std::vector<std::string> labels;
  for (double t : ticks) labels.push_back(TickLabel(t));
  EXPECT_EQ(labels, (std::vector<std::string>{"0.2", "0.5", "1", "2"}));
  // Within one decade: linear round values.
  ticks = LogTicks(1.2, 1.7);
  ASSERT_GE(ticks.size(), 4u);
  EXPECT_TRUE(AreRound(ticks));
  EXPECT_EQ(TickLabel(ticks[1]), "1.3");
}

TEST(SvgReportTest, HeldOutPointsJoinIntoOneLineAndLongLegendsFit) {
  // A held-out column: values on evaluation rows only.
  const double nan = std::nan("");
  const std::vector<double> steps = {1, 2, 3, 4, 5, 6};
  const std::vector<double> test = {nan, 0.5, nan, 0.75, nan, 1.0};
  const PlotSeries held_out = EvaluatedPoints("probabilistic/implicit_phantom (test)", steps, test,
                                              100.0);
  ASSERT_EQ(held_out.x.size(), 3u);
  EXPECT_EQ(held_out.y[2], 100.0);  // in percent
  PlotOptions options{"Accuracy", "step", "accuracy (%)", false, 640, 400};
  const std::string svg = LinePlotSvg({held_out}, options);
  EXPECT_EQ(Count(svg, "<polyline"), 1);
  EXPECT_EQ(Count(svg, "<circle"), 3);
  // The legend's text ends inside the SVG (7 px per character of 12 px text).
  const std::smatch width = [&] {
    std::smatch m;
    std::regex_search(svg, m, std::regex("<svg[^>]*width=\"([0-9.]+)\""));
    return m;
  }();
  const std::regex legend("<text x=\"([0-9.]+)\"[^>]*>probabilistic/implicit_phantom \\(test\\)<");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(svg, m, legend)) << svg;
  EXPECT_LE(std::stod(m[1]) + 7.0 * held_out.name.size(), std::stod(width[1]));
  // Every tick label is a round number: no 4-significant-digit remnants.
  for (const std::string& label : Labels(svg)) {
    EXPECT_EQ(label.find("3.162"), std::string::npos);
    EXPECT_EQ(label.find("0000000"), std::string::npos) << label;
  }
}

class ReportTest : public testing_support::ScratchDirTest {
 protected:
  ReportTest() : ScratchDirTest("report") {}

  std::string WriteConfig(const std::string& extra) {
    const std::string path = (dir_ / "cmp.yaml").string();
    std::ofstream(path) << "seed: 3\nthreads: 1\n"
                        << "task: {kind: reverse, length: 4, vocab_size: 4, train_examples: 64, "
                           "test_examples: 32}\n"
                        << "model: {dim: 8, heads: 2, hidden: 8, max_length: 4, num_layers: 2}\n"
                        << "train: {steps: 10, batch_size: 8, eval_every: 5, log_every: 1, "
                           "checkpoint_every: 0}\n"
                        << "log: {dir: " << (dir_ / "cmp").string() << ", progress: none}\n"
                        << extra;
    return path;
  }
};

TEST_F(ReportTest, SeedsArePooledAndTheReportRebuildsFromTheRunDirectories) {
  CompareArgs args;
  args.config_path = WriteConfig("compare: {variants: [explicit, tied], seeds: [0, 1, 2]}\n");
  std::ostringstream out, err;
  ASSERT_EQ(RunCompare(args, out, err), 0) << err.str();
  const fs::path root = dir_ / "cmp";
  for (const char* variant : {"explicit", "tied"}) {
    for (const char* seed : {"seed-0", "seed-1", "seed-2"}) {
      EXPECT_TRUE(fs::exists(root / variant / seed / "summary.json")) << variant << seed;
      EXPECT_TRUE(fs::exists(root / variant / seed / "variant.json")) << variant << seed;
    }
  }
  // The seeds differ, so do their accuracies: the std is shown.
  const std::string md = ReadAll(root / "report.md");
  EXPECT_NE(md.find("| variant | seeds | params |"), std::string::npos) << md;
  EXPECT_TRUE(std::regex_search(md, std::regex("\\| explicit \\| 3 \\| [0-9]+ \\| [0-9.]+ ± [0-9.]+ \\|")))
      << md;
  EXPECT_TRUE(std::regex_search(md, std::regex("[0-9.]+ ± [0-9.]+%"))) << md;
  // Bands in the figures, one per variant.
  EXPECT_EQ(Count(ReadAll(root / "accuracy.svg"), "<polygon"), 2);
  EXPECT_EQ(Count(ReadAll(root / "loss.svg"), "<polygon"), 2);
  // The column explanations are in the HTML too.
  const std::string html = ReadAll(root / "report.html");
  EXPECT_NE(html.find("Columns: <em>params</em>"), std::string::npos);
  EXPECT_NE(html.find("sample standard deviation"), std::string::npos);
  // Accuracy in percent in the figures: a tick above 1 on the accuracy axis.
  bool percent_tick = false;
  for (const std::string& label : Labels(ReadAll(root / "accuracy.svg"))) {
    percent_tick = percent_tick || label == "held-out accuracy (%)";
  }
  EXPECT_TRUE(percent_tick);

  // `stillpoint report` on the comparison's directory: the same table.
  ReportArgs report;
  report.runs = {root.string()};
  report.out_dir = (dir_ / "again").string();
  std::ostringstream again, again_err;
  ASSERT_EQ(RunReport(report, again, again_err), 0) << again_err.str();
  // The console's short table, the same from both.
  const std::string first_table = out.str().substr(out.str().find("\nvariant ") + 1);
  const std::string second_table =
      again.str().substr(0, again.str().find("\nreport (the full table): "));
  EXPECT_EQ(first_table.substr(0, first_table.find("\nreport (the full table): ")), second_table);
  EXPECT_TRUE(fs::exists(dir_ / "again" / "report.html"));

  // One seed of each: plain cells, no bands.
  report.runs = {(root / "explicit" / "seed-0").string(), (root / "tied" / "seed-1").string()};
  report.out_dir = (dir_ / "two").string();
  std::ostringstream two;
  ASSERT_EQ(RunReport(report, two, again_err), 0) << again_err.str();
  EXPECT_EQ(two.str().find("±"), std::string::npos) << two.str();
  EXPECT_EQ(Count(ReadAll(dir_ / "two" / "accuracy.svg"), "<polygon"), 0);

  // A directory without runs is bad input.
  report.runs = {dir_.string() + "/nothing"};
  fs::create_directories(dir_ / "nothing");
  std::ostringstream none, none_err;
  EXPECT_EQ(RunReport(report, none, none_err), 2);
  EXPECT_NE(none_err.str().find("holds no run"), std::string::npos) << none_err.str();
}

// The table says when each variant first reached 98% held-out accuracy and
// came within a point of its final accuracy, in steps and in the wall time
// of the training steps until then (the metrics' train_s at that
// evaluation: the steps' own times summed, the evaluations left out).
TEST_F(ReportTest, TheTableReportsTheTimeToAccuracy) {
  CompareArgs args;
  args.config_path = WriteConfig("compare: {variants: [explicit, tied]}\n");
  args.overrides = {"train.steps=30", "train.eval_every=5", "train.log_every=1",
                    "train.optimizer.lr=0.03"};
  std::ostringstream out, err;
  ASSERT_EQ(RunCompare(args, out, err), 0) << err.str();
  const std::string md = ReadAll(dir_ / "cmp" / "report.md");
  EXPECT_NE(md.find("| ms/step | to 98% | to final acc |"), std::string::npos) << md;
  for (const std::string variant : {"explicit", "tied"}) {
    const auto metrics = ReadMetricsCsv((dir_ / "cmp" / variant / "metrics.csv").string());
    const std::vector<double>& step = metrics.at("step");
    const std::vector<double>& accuracy = metrics.at("test_accuracy");
    const std::vector<double>& elapsed = metrics.at("elapsed_s");
    const std::vector<double>& trained = metrics.at("train_s");
    const std::vector<double>& step_ms = metrics.at("step_ms");
    // Every step is logged: train_s is the sum of the step times so far, and
    // no more than the wall time, which holds the evaluations too.
    double step_sum = 0;
    for (std::size_t i = 0; i < trained.size(); ++i) {
      step_sum += step_ms[i] / 1000.0;
      EXPECT_NEAR(trained[i], step_sum, 1e-6 + 1e-6 * step_sum) << variant << " row " << i;
      EXPECT_LE(trained[i], elapsed[i]) << variant << " row " << i;
    }
    double final_accuracy = NAN;
    for (double a : accuracy) {
      if (std::isfinite(a)) final_accuracy = a;
    }
    ASSERT_TRUE(std::isfinite(final_accuracy)) << variant;
    auto expected_cell = [&](double level) {
      for (std::size_t i = 0; i < step.size(); ++i) {
        if (!std::isfinite(accuracy[i]) || accuracy[i] < level) continue;
        std::ostringstream cell;
        cell << static_cast<int64_t>(step[i]) << " steps, " << std::fixed << std::setprecision(1)
             << trained[i] << " s";
        return cell.str();
      }
      return std::string("not reached");
    };
    // Elapsed wall time grows along the run.
    for (std::size_t i = 1; i < elapsed.size(); ++i) EXPECT_GE(elapsed[i], elapsed[i - 1]);
    const std::string row = "| " + variant + " | ";
    const std::size_t at = md.find(row);
    ASSERT_NE(at, std::string::npos) << md;
    const std::string line = md.substr(at, md.find('\n', at) - at);
    EXPECT_NE(line.find(" | " + expected_cell(0.98) + " | " + expected_cell(final_accuracy - 0.01) +
                        " | "),
              std::string::npos)
        << line;
  }
}

TEST_F(ReportTest, SeedsMustBeDistinctWholeNumbers) {
  for (const char* seeds : {"[0, 1.5]", "[2, 2]"}) {
    CompareArgs args;
    args.config_path = WriteConfig(std::string("compare: {variants: [explicit], seeds: ") + seeds +
                                   "}\n");
    std::ostringstream out, err;
    EXPECT_EQ(RunCompare(args, out, err), 2) << seeds;
    EXPECT_NE(err.str().find("compare.seeds"), std::string::npos) << err.str();
  }
}

// The run's figures are rewritten at every evaluation, so a long run can be
// watched: when the second evaluation is announced, accuracy.svg already
// holds the first evaluation's held-out point.
TEST_F(ReportTest, RunFiguresAreRefreshedAtEveryEvaluation) {
  class Watch : public std::stringbuf {
   public:
    explicit Watch(fs::path svg) : svg_(std::move(svg)) {}
    int sync() override {
      if (str().find("eval at step 10") != std::string::npos && seen_.empty() &&
          fs::exists(svg_)) {
        seen_ = ReadAll(svg_);
      }
      return 0;
    }
    std::string seen_;

   private:
    fs::path svg_;
  };
  std::ofstream(dir_ / "run.yaml")
      << "seed: 3\nthreads: 1\ntask: {kind: reverse, length: 4, vocab_size: 4, "
         "train_examples: 64, test_examples: 32}\n"
      << "model: {kind: explicit, dim: 8, heads: 2, hidden: 8, max_length: 4, num_layers: 2}\n"
      << "train: {steps: 10, batch_size: 8, eval_every: 5, log_every: 1, checkpoint_every: 0}\n"
      << "log: {dir: " << (dir_ / "run").string() << ", progress: lines}\n";
  Watch watch(dir_ / "run" / "accuracy.svg");
  std::ostream progress(&watch);
  Config config = Config::FromFile(StillpointSchema(), (dir_ / "run.yaml").string());
  Experiment e = BuildExperiment(config, (dir_ / "run.yaml").string());
  TrainOptions options;
  options.progress = &progress;
  Train(e, options);
  ASSERT_FALSE(watch.seen_.empty()) << "accuracy.svg was not written before the last evaluation";
  // The train curve (no markers) and one held-out point (step 5).
  EXPECT_EQ(Count(watch.seen_, "<circle"), 1) << watch.seen_;
}

// A run records where it came from, in summary.json, summary.md and the
// comparison report.
TEST_F(ReportTest, ProvenanceIsRecordedInTheSummaryAndTheReport) {
  const char* argv[] = {"stillpoint", "train", "my config.yaml", "train.steps=4"};
  SetCommandLine(4, argv);
  std::ofstream(dir_ / "p.yaml")
      << "seed: 3\nthreads: 1\ntask: {kind: reverse, length: 4, vocab_size: 4, "
         "train_examples: 64, test_examples: 32}\n"
      << "model: {kind: explicit, dim: 8, heads: 2, hidden: 8, max_length: 4, num_layers: 2}\n"
      << "train: {steps: 10, batch_size: 8, eval_every: 5, log_every: 1, checkpoint_every: 0}\n"
      << "log: {progress: none}\n";
  Config config = Config::FromFile(StillpointSchema(), (dir_ / "p.yaml").string(),
                                   {"train.steps=4", "log.dir=" + (dir_ / "p").string()});
  Experiment e = BuildExperiment(config, (dir_ / "p.yaml").string());
  Train(e);
  SetCommandLine(0, nullptr);
  const YAML::Node p = YAML::LoadFile((dir_ / "p" / "summary.json").string())["provenance"];
  ASSERT_TRUE(p.IsMap());
  EXPECT_EQ(p["version"].as<std::string>(), StillpointVersion());
  EXPECT_EQ(p["command_line"].as<std::string>(),
            "stillpoint train 'my config.yaml' train.steps=4");
  ASSERT_EQ(p["overrides"].size(), 2u);
  EXPECT_EQ(p["overrides"][0].as<std::string>(), "train.steps=4");
  // A 12-digit commit (-dirty with uncommitted changes), or null outside git.
  if (!p["git_revision"].IsNull()) {
    EXPECT_TRUE(std::regex_match(p["git_revision"].as<std::string>(),
                                 std::regex("[0-9a-f]{12}(-dirty)?")))
        << p["git_revision"].as<std::string>();
  }
  EXPECT_EQ(p["machine"]["threads"].as<int>(), 1);
  EXPECT_EQ(p["machine"]["shards"].as<int>(), 1);
  EXPECT_GE(p["machine"]["simd_float_lanes"].as<int>(), 1);
  const std::regex iso("20[0-9]{2}-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]:[0-6][0-9]Z");
  ASSERT_TRUE(std::regex_match(p["start_time"].as<std::string>(), iso));
  ASSERT_TRUE(std::regex_match(p["end_time"].as<std::string>(), iso));
  EXPECT_LE(p["start_time"].as<std::string>(), p["end_time"].as<std::string>());
  EXPECT_NE(ReadAll(dir_ / "p" / "summary.md").find("git revision"), std::string::npos);

  // The report lists it per run.
  ReportArgs report;
  report.runs = {(dir_ / "p").string()};
  report.out_dir = (dir_ / "rep").string();
  std::ostringstream out, err;
  ASSERT_EQ(RunReport(report, out, err), 0) << err.str();
  const std::string md = ReadAll(dir_ / "rep" / "report.md");
  EXPECT_NE(md.find("## Provenance"), std::string::npos);
  EXPECT_NE(md.find("command `stillpoint train 'my config.yaml' train.steps=4`"),
            std::string::npos)
      << md;
  EXPECT_NE(ReadAll(dir_ / "rep" / "report.html").find("<h2>Provenance</h2>"),
            std::string::npos);
}

}  // namespace
}  // namespace stillpoint::report_test
