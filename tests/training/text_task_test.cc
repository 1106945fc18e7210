// task.kind text end to end: training writes the vocabulary and bits per
// character; the text models are causal (no output moves when a later
// character changes, inside implicit and energy fixed points too); and
// `stillpoint generate` with its options and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "framework/autograd.h"
#include "tests/scratch_path.h"
#include "training/cli/cli_commands.h"
#include "training/cli/generate_command.h"
#include "training/config_schema.h"
#include "training/generate.h"
#include "training/metrics.h"
#include "training/summary_json.h"
#include "training/trainer.h"

namespace stillpoint::text_task_test {
namespace {

namespace fs = std::filesystem;

class TextTaskTest : public testing_support::ScratchDirTest {
 protected:
  TextTaskTest() : ScratchDirTest("text_task") {}

  // A text with structure to learn: short words in a fixed rotation.
  std::string WriteText() {
    const std::string path = (dir_ / "book.txt").string();
    std::ofstream out(path);
    const char* words[] = {"the ", "cat ", "sat ", "on ", "a ", "mat. "};
    for (int i = 0; i < 400; ++i) out << words[i % 6];
    return path;
  }

  std::string WriteConfig(const std::string& name, const std::string& extra = "") {
    const std::string config_path = (dir_ / (name + ".yaml")).string();
    std::ofstream(config_path) << "seed: 1\nthreads: 1\n"
                               << "task: {kind: text, path: " << WriteText()
                               << ", context: 12, validation_fraction: 0.1}\n"
                               << "model:\n  kind: explicit\n  dim: 16\n  heads: 2\n"
                               << "  hidden: 32\n  max_length: 12\n  num_layers: 2\n"
                               << "train:\n  steps: 60\n  batch_size: 8\n  eval_every: 30\n"
                               << "  log_every: 10\n  optimizer: {lr: 0.01}\n"
                               << "log: {dir: " << (dir_ / ("run_" + name)).string()
                               << ", progress: none}\n"
                               << extra;
    return config_path;
  }

  TrainSummary TrainRun(const std::string& name, const std::vector<std::string>& overrides = {}) {
    const std::string path = WriteConfig(name);
    Config config = Config::FromFile(StillpointSchema(), path, overrides);
    Experiment e = BuildExperiment(config, path);
    return Train(e);
  }
};

TEST_F(TextTaskTest, TrainingWritesTheVocabularyAndBitsPerCharacter) {
  const TrainSummary summary = TrainRun("explicit");
  // The vocabulary file is the training part's: the 13 distinct characters
  // of the text (" .acehmnost") and the unknown id.
  std::ifstream in(summary.run_dir + "/" + kVocabularyFile);
  std::stringstream json;
  json << in.rdbuf();
  const Vocabulary vocabulary = Vocabulary::FromJson(json.str(), "vocabulary.json");
  EXPECT_EQ(vocabulary.Decode(vocabulary.EncodeText("the cat sat", nullptr)), "the cat sat");
  EXPECT_EQ(vocabulary.size(), 1 + 11);
  // bpc = nats / ln 2, in the metrics and the summary.
  const auto metrics = ReadMetricsCsv(summary.run_dir + "/metrics.csv");
  const std::vector<double>& loss = metrics.at("test_loss");
  const std::vector<double>& bpc = metrics.at("test_bpc");
  ASSERT_EQ(loss.size(), bpc.size());
  int evaluated = 0;
  for (std::size_t i = 0; i < loss.size(); ++i) {
    if (std::isnan(loss[i])) continue;
    EXPECT_NEAR(bpc[i], loss[i] / std::log(2.0), 1e-9);
    ++evaluated;
  }
  EXPECT_GE(evaluated, 2);
  EXPECT_NEAR(summary.test_bpc, summary.final_eval.loss / std::log(2.0), 1e-12);
  // A learnable text: far below a uniform guess over the vocabulary.
  EXPECT_LT(summary.test_bpc, 0.6 * std::log2(11.0));
  const TrainSummary back = ReadTrainSummary(summary.run_dir);
  EXPECT_NEAR(back.test_bpc, summary.test_bpc, 1e-9);
}

// The logits of one window before and after changing the character at
// position `changed`: positions before it must not move.
void ExpectCausal(const std::string& config_path, const std::vector<std::string>& overrides,
                  const std::string& what) {
  Config config = Config::FromFile(StillpointSchema(), config_path, overrides);
  Experiment e = BuildExperiment(config, config_path);
  SequenceModel& model = *e.model;
  model.Eval();
  NoGrad no_grad;
  const int64_t T = 12, V = e.train->info().vocab_size;
  std::vector<int64_t> ids = e.train->Get(5).tokens;
  const std::vector<double> before = model.Forward(ids, Shape{1, T}).value().ToVector();
  const int64_t changed = 7;
  ids[changed] = ids[changed] % (V - 1) + 1;  // another symbol (not the unknown id)
  const std::vector<double> after = model.Forward(ids, Shape{1, T}).value().ToVector();
  double earlier = 0, later = 0;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t v = 0; v < V; ++v) {
      const double change = std::fabs(after[t * V + v] - before[t * V + v]);
      double& worst = t < changed ? earlier : later;
      worst = std::max(worst, change);
    }
  }
  EXPECT_LT(earlier, 1e-8) << what << ": an earlier output moved";
  EXPECT_GT(later, 1e-4) << what << ": the changed character changed nothing";
}

TEST_F(TextTaskTest, TextModelsAreCausalInsideTheirFixedPoints) {
  const std::string path = WriteConfig("causal");
  const std::vector<std::string> tight = {
      "dtype=float64", "model.solver.forward.relative_tolerance=1e-12",
      "model.solver.forward.max_iterations=400", "model.attention_solver.forward.relative_tolerance=1e-12",
      "model.attention_solver.forward.max_iterations=400"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), tight.begin(), tight.end());
    return extra;
  };
  ExpectCausal(path, with({"model.kind=explicit"}), "explicit softmax");
  ExpectCausal(path, with({"model.kind=implicit"}), "implicit softmax");
  ExpectCausal(path, with({"model.kind=explicit", "model.attention=probabilistic"}),
               "explicit probabilistic");
  ExpectCausal(path, with({"model.kind=implicit", "model.attention=probabilistic"}),
               "implicit probabilistic");
}

TEST_F(TextTaskTest, GenerateSamplesReproduciblyAndRefusesBadInput) {
  const TrainSummary summary = TrainRun("gen");
  GenerateArgs args;
  args.run = summary.run_dir;
  args.prompt = "the cat ";
  args.tokens = 30;
  args.seed = 4;
  std::ostringstream out1, out2, err;
  ASSERT_EQ(RunGenerate(args, out1, err), 0) << err.str();
  ASSERT_EQ(RunGenerate(args, out2, err), 0) << err.str();
  EXPECT_EQ(out1.str(), out2.str());
  // The prompt, then 30 characters (all ASCII here), then a newline.
  EXPECT_EQ(out1.str().size(), args.prompt.size() + 30 + 1);
  EXPECT_EQ(out1.str().rfind(args.prompt, 0), 0u);
  // Top-1 sampling is the argmax whatever the seed.
  args.top_k = 1;
  std::ostringstream greedy1, greedy2;
  args.seed = 1;
  ASSERT_EQ(RunGenerate(args, greedy1, err), 0);
  args.seed = 2;
  ASSERT_EQ(RunGenerate(args, greedy2, err), 0);
  EXPECT_EQ(greedy1.str(), greedy2.str());
  // Characters outside the vocabulary are read as unknown and counted.
  TextGenerator generator = LoadTextGenerator(summary.run_dir);
  GenerateOptions options;
  options.tokens = 5;
  const GenerateResult result = generator.Generate("the dog", options);
  EXPECT_EQ(result.prompt_unknown, 2);  // 'd' and 'g'
  EXPECT_EQ(result.prompt_symbols, 7);
  EXPECT_TRUE(result.iterations.empty());  // an explicit model solves nothing
  // Bad input: exit 2 and a message that names the problem.
  const std::vector<std::pair<std::function<void(GenerateArgs&)>, std::string>> bad = {
      {[](GenerateArgs& a) { a.tokens = 0; }, "--tokens must be >= 1"},
      {[](GenerateArgs& a) { a.temperature = 0; }, "--temperature must be"},
      {[](GenerateArgs& a) { a.top_k = -1; }, "--top-k must be >= 0"},
      {[](GenerateArgs& a) { a.keep = 12; }, "--keep must be in [1, 12)"},
      {[](GenerateArgs& a) { a.prompt = ""; }, "--prompt is empty"},
      {[](GenerateArgs& a) { a.prompt = std::string("ab\xff", 3); }, "not UTF-8"},
      {[&](GenerateArgs& a) { a.run = (dir_ / "nowhere").string(); }, "no checkpoint"},
  };
  for (const auto& [change, wanted] : bad) {
    GenerateArgs broken = args;
    change(broken);
    std::ostringstream o, e;
    EXPECT_EQ(RunGenerate(broken, o, e), 2) << wanted;
    EXPECT_NE(e.str().find(wanted), std::string::npos) << e.str();
  }
}

TEST_F(TextTaskTest, CompareReportShowsBitsPerCharacterAndASample) {
  CompareArgs args;
  args.config_path = WriteConfig("compare", "compare: {variants: [explicit, implicit]}\n");
  args.overrides = {"train.steps=10"};
  std::ostringstream out, err;
  ASSERT_EQ(RunCompare(args, out, err), 0) << err.str();
  std::ifstream in((dir_ / "run_compare" / "report.md").string());
  std::stringstream md;
  md << in.rdbuf();
  const std::string report = md.str();
  const auto table = report.find("## Held-out text");
  ASSERT_NE(table, std::string::npos) << report;
  for (const char* variant : {"explicit", "implicit"}) {
    EXPECT_NE(report.find(std::string("| ") + variant + " | ", table), std::string::npos);
    EXPECT_NE(report.find(std::string("Sample, ") + variant), std::string::npos) << report;
  }
  // The console's table leads with each variant's held-out bits per
  // character, the figure of its summary.json.
  const std::string console = out.str();
  const auto header = console.find("\nvariant ");
  ASSERT_NE(header, std::string::npos) << console;
  const std::string header_line = console.substr(header, console.find('\n', header + 1) - header);
  EXPECT_NE(header_line.find("test bpc"), std::string::npos) << header_line;
  EXPECT_EQ(header_line.find("test acc"), std::string::npos) << header_line;
  for (const char* variant : {"explicit", "implicit"}) {
    const TrainSummary summary = ReadTrainSummary((dir_ / "run_compare" / variant).string());
    char bpc[32];
    std::snprintf(bpc, sizeof(bpc), "%.4f", summary.test_bpc);
    const auto line = console.find(std::string("\n") + variant + " ");
    ASSERT_NE(line, std::string::npos) << console;
    const std::string row = console.substr(line, console.find('\n', line + 1) - line);
    EXPECT_NE(row.find(bpc), std::string::npos) << variant << " " << bpc << "\n" << console;
  }
}

TEST_F(TextTaskTest, ClassificationRunsWriteTheConfusionMatrixAndPerClassAccuracy) {
  const std::string path = (dir_ / "digits.yaml").string();
  std::ofstream(path) << "seed: 0\nthreads: 1\ntask: {kind: digits}\n"
                      << "model: {kind: explicit, dim: 16, heads: 2, hidden: 32, max_length: 16, "
                         "num_layers: 1}\n"
                      << "train: {steps: 30, batch_size: 16, eval_every: 30}\n"
                      << "log: {dir: " << (dir_ / "run_digits").string() << ", progress: none}\n";
  Config config = Config::FromFile(StillpointSchema(), path);
  Experiment e = BuildExperiment(config, path);
  const TrainSummary summary = Train(e);
  ASSERT_EQ(summary.confusion.classes(), 10);
  EXPECT_NEAR(summary.confusion.Accuracy(), summary.final_eval.accuracy, 1e-12);
  int64_t examples = 0;
  for (const auto& row : summary.confusion.counts) {
    for (int64_t n : row) examples += n;
  }
  EXPECT_EQ(examples, e.test->size());
  EXPECT_TRUE(fs::exists(summary.run_dir + "/confusion.svg"));
  std::ifstream in(summary.run_dir + "/summary.json");
  std::stringstream json;
  json << in.rdbuf();
  EXPECT_NE(json.str().find("\"per_class_accuracy\": {\"0\": "), std::string::npos) << json.str();
}

TEST(SampleSymbolTest, FollowsTemperatureAndTopKAndNeverTheUnknown) {
  // Logits for [unknown, a, b, c]: the unknown id has the largest logit
  // but is never drawn.
  const std::vector<double> logits = {10.0, std::log(1.0), std::log(2.0), std::log(5.0)};
  Rng rng(7);
  std::vector<int> counts(4, 0);
  const int draws = 40000;
  for (int i = 0; i < draws; ++i) ++counts[SampleSymbol(logits, 1.0, 0, rng)];
  EXPECT_EQ(counts[0], 0);
  // Probabilities 1/8, 2/8, 5/8 at temperature 1 (4 standard deviations).
  const double expected[] = {0, 1.0 / 8, 2.0 / 8, 5.0 / 8};
  for (int k = 1; k < 4; ++k) {
    const double p = expected[k];
    EXPECT_NEAR(counts[k] / double(draws), p, 4 * std::sqrt(p * (1 - p) / draws)) << k;
  }
  // top_k 2 never draws the least likely symbol; a tiny temperature is greedy.
  for (int i = 0; i < 2000; ++i) {
    EXPECT_NE(SampleSymbol(logits, 1.0, 2, rng), 1);
    EXPECT_EQ(SampleSymbol(logits, 1e-3, 0, rng), 3);
  }
}

TEST_F(TextTaskTest, ImplicitGenerationStartsFromThePreviousFixedPoint) {
  const TrainSummary summary =
      TrainRun("implicit_gen", {"model.kind=implicit", "train.steps=30"});
  TextGenerator generator = LoadTextGenerator(summary.run_dir);
  GenerateOptions options;
  options.tokens = 20;
  options.top_k = 1;
  // The full-window path re-solves the whole window for every character:
  // starting from the previous window's fixed point leaves only the new
  // position far from its own. (The incremental path never re-solves the
  // earlier positions; tests/training/generate_step_test.cc.)
  options.incremental = false;
  const GenerateResult warm = generator.Generate("the cat sat on", options);
  options.warm_start = false;
  const GenerateResult cold = generator.Generate("the cat sat on", options);
  ASSERT_EQ(warm.iterations.size(), 20u);
  ASSERT_EQ(cold.iterations.size(), 20u);
  EXPECT_LT(warm.IterationsMean(), cold.IterationsMean());
  // The same fixed points, to the solver's tolerance: the same greedy text.
  EXPECT_EQ(warm.text, cold.text);
}

}  // namespace
}  // namespace stillpoint::text_task_test
