// The config keys of positions, masks, input injection, the solver's start
// and the progressive loss: bad values are ConfigErrors naming the key, and
// an implicit run logs the path-independence score.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/scratch_path.h"
#include "training/config_schema.h"
#include "training/experiment.h"
#include "training/metrics.h"
#include "training/trainer.h"

namespace stillpoint::extrapolation_keys_test {
namespace {

namespace fs = std::filesystem;

class ExtrapolationKeysTest : public testing_support::ScratchDirTest {
 protected:
  ExtrapolationKeysTest() : ScratchDirTest("extrapolation_keys") {}

  std::string WriteConfig(const std::string& name) {
    const std::string path = (dir_ / (name + ".yaml")).string();
    std::ofstream(path) << "seed: 3\nthreads: 1\n"
                        << "task: {kind: reverse, length: 5, vocab_size: 5, train_examples: 64, "
                           "test_examples: 32}\n"
                        << "model:\n  kind: implicit\n  dim: 8\n  heads: 2\n  hidden: 16\n"
                        << "  max_length: 8\n  unroll_steps: 3\n"
                        << "train:\n  steps: 4\n  batch_size: 8\n  eval_every: 2\n"
                        << "  log_every: 1\n  optimizer: {lr: 0.01}\n"
                        << "eval: {gradient_check_batch_size: 0}\n"
                        << "log: {dir: " << (dir_ / ("run_" + name)).string()
                        << ", progress: none}\n";
    return path;
  }

  // The ConfigError message of building (and checking) the config with the
  // overrides, or "" when there is none.
  std::string ErrorOf(const std::vector<std::string>& overrides) {
    const std::string path = WriteConfig("bad");
    try {
      Config config = Config::FromFile(StillpointSchema(), path, overrides);
      CheckTrainingConfig(config);
      CheckModelKindKeys(config);
      BuildExperiment(config, path);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  }
};

void ExpectNames(const std::string& message, const std::string& key) {
  EXPECT_NE(message.find(key), std::string::npos) << "no '" << key << "' in: " << message;
}

TEST_F(ExtrapolationKeysTest, BadValuesNameTheirKey) {
  ExpectNames(ErrorOf({"model.positions=alibbi"}), "did you mean 'alibi'");
  ExpectNames(ErrorOf({"model.attention_mask=windowed"}), "model.attention_mask");
  ExpectNames(ErrorOf({"model.attention_window=2"}), "model.attention_window");
  ExpectNames(ErrorOf({"model.attention_mask=local"}), "model.attention_window");
  ExpectNames(ErrorOf({"model.attention_window=-1", "model.attention_mask=causal"}),
              "model.attention_window");
  // Head width 8 / 4 = 2: rotary fits, rotary_2d needs a multiple of 4.
  ExpectNames(ErrorOf({"model.heads=4", "model.positions=rotary_2d"}), "model.positions");
  EXPECT_EQ(ErrorOf({"model.heads=4", "model.positions=rotary"}), "");
  // Learned positions cover max_length tokens; the others any length.
  ExpectNames(ErrorOf({"task.length=12"}), "model.max_length");
  EXPECT_EQ(ErrorOf({"task.length=12", "model.positions=alibi"}), "");
  // Keys of other model kinds.
  ExpectNames(ErrorOf({"model.kind=explicit", "model.solver.init=random"}), "model.solver.init");
  EXPECT_EQ(ErrorOf({"model.solver.init=mixed"}), "");
  ExpectNames(ErrorOf({"model.kind=energy", "train.progressive_loss.weight=0.5"}),
              "train.progressive_loss.weight");
  ExpectNames(ErrorOf({"model.input_injection=first_step"}), "model.input_injection");
  EXPECT_EQ(ErrorOf({"model.kind=tied", "model.input_injection=first_step"}), "");
  // Progressive loss: weight in [0, 1], k below N.
  ExpectNames(ErrorOf({"train.progressive_loss.weight=1.5"}), "train.progressive_loss.weight");
  ExpectNames(ErrorOf({"train.progressive_loss.weight=0.5", "train.progressive_loss.steps=3"}),
              "train.progressive_loss.steps");
  EXPECT_EQ(ErrorOf({"train.progressive_loss.weight=0.5", "train.progressive_loss.steps=3",
                     "train.progressive_loss.iterations=5"}),
            "");
}

TEST_F(ExtrapolationKeysTest, ImplicitRunsLogThePathIndependenceScore) {
  const std::string path = WriteConfig("implicit");
  Config config = Config::FromFile(
      StillpointSchema(), path,
      {"model.positions=rotary", "model.attention_mask=causal", "model.solver.init=mixed",
       "train.progressive_loss.weight=0.5", "train.progressive_loss.iterations=4"});
  Experiment e = BuildExperiment(config, path);
  const TrainSummary summary = Train(e);
  const auto metrics = ReadMetricsCsv(summary.run_dir + "/metrics.csv");
  const std::vector<double>& cosine = metrics.at("path_independence_cosine");
  const std::vector<double>& agreement = metrics.at("path_independence_agreement");
  int evaluated = 0;
  for (std::size_t i = 0; i < cosine.size(); ++i) {
    if (std::isnan(cosine[i])) continue;
    ++evaluated;
    EXPECT_GT(cosine[i], 0.9);
    EXPECT_LE(cosine[i], 1.0 + 1e-9);
    EXPECT_GE(agreement[i], 0.0);
    EXPECT_LE(agreement[i], 1.0);
  }
  EXPECT_EQ(evaluated, 2);
  EXPECT_FALSE(std::isnan(summary.final_eval.path_independence.cosine));
  EXPECT_TRUE(fs::exists(summary.run_dir + "/path_independence.svg"));
  std::ifstream json(summary.run_dir + "/summary.json");
  const std::string text((std::istreambuf_iterator<char>(json)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"path_independence_cosine\": 0."), std::string::npos) << text;
  // An explicit model solves nothing: no score.
  Config explicit_config = Config::FromFile(StillpointSchema(), path,
                                            {"model.kind=explicit", "log.dir=" +
                                                                        (dir_ / "run_explicit").string()});
  Experiment ex = BuildExperiment(explicit_config, path);
  EXPECT_TRUE(std::isnan(Train(ex).final_eval.path_independence.cosine));
}

}  // namespace
}  // namespace stillpoint::extrapolation_keys_test
