#include "training/memory_estimate.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/scratch_path.h"
#include "training/cli/cli_commands.h"
#include "training/config_schema.h"
#include "training/experiment.h"

namespace stillpoint::memory_estimate_test {
namespace {

namespace fs = std::filesystem;

const char* kSmall =
    "seed: 1\ntask: {kind: reverse, length: 5, vocab_size: 5, train_examples: 16, "
    "test_examples: 8}\n"
    "model: {dim: 8, heads: 2, hidden: 16, max_length: 8, num_layers: 3, unroll_steps: 2}\n"
    "train: {batch_size: 4}\n";

// The estimate is a lower bound: every model kind holds at least as many
// parameters as it counts.
TEST(MemoryEstimateTest, ParametersAreALowerBoundOfTheBuiltModel) {
  for (const std::string kind : {"explicit", "tied", "implicit", "energy"}) {
    SCOPED_TRACE(kind);
    const Config config =
        Config::FromYaml(StillpointSchema(), kSmall, "small.yaml", {"model.kind=" + kind});
    const MemoryEstimate e = EstimateMemory(config, true);
    const Experiment experiment = BuildExperiment(config, "");
    EXPECT_GT(e.parameters, 0);
    EXPECT_LE(e.parameters, 4.0 * static_cast<double>(experiment.model->NumParameters()));
    EXPECT_EQ(e.gradients, e.parameters);
    EXPECT_EQ(e.optimizer_state, 2 * e.parameters);  // adamw's two moments
  }
  // explicit: 3 cells of 4 d^2 + 2 d h, the embedding and the position table.
  const Config explicit_config =
      Config::FromYaml(StillpointSchema(), kSmall, "small.yaml", {"model.kind=explicit"});
  EXPECT_EQ(EstimateMemory(explicit_config, true).parameters,
            4.0 * (3 * (4 * 64 + 2 * 8 * 16) + 5 * 8 + 8 * 8));
  // An evaluation needs no gradients or optimizer state.
  const MemoryEstimate eval = EstimateMemory(explicit_config, false);
  EXPECT_EQ(eval.gradients, 0);
  EXPECT_EQ(eval.optimizer_state, 0);
}

TEST(MemoryEstimateTest, AConfigThatDoesNotFitIsRefusedWithTheFigureAndKeys) {
  const Config config = Config::FromYaml(StillpointSchema(), kSmall, "small.yaml");
  EXPECT_NO_THROW(CheckMemoryFits(config, true, 1e9));
  try {
    CheckMemoryFits(config, true, 1000);
    FAIL() << "a config needing more than 1000 bytes passed";
  } catch (const ConfigError& error) {
    const std::string m = error.what();
    EXPECT_NE(m.find("small.yaml: this training run needs at least "), std::string::npos) << m;
    EXPECT_NE(m.find("more than this machine's 1000 B"), std::string::npos) << m;
    EXPECT_NE(m.find("model.dim=8, model.hidden=16"), std::string::npos) << m;
  }
}

// The case: model.dim=65536 model.hidden=1048576 ended in
// std::bad_alloc naming no key. Refused before anything is allocated.
TEST(MemoryEstimateTest, TrainRefusesAModelLargerThanTheMachine) {
  const fs::path dir = testing_support::ScratchPathForThisTest("memory");
  fs::create_directories(dir);
  const std::string path = (dir / "huge.yaml").string();
  std::ofstream(path) << kSmall;
  TrainArgs args;
  args.config_path = path;
  args.overrides = {"model.dim=65536", "model.heads=2", "model.hidden=1048576",
                    "log.dir=" + (dir / "run").string()};
  std::ostringstream out, err;
  EXPECT_EQ(RunTrain(args, out, err), 2);
  EXPECT_NE(err.str().find("needs at least"), std::string::npos) << err.str();
  EXPECT_NE(err.str().find("model.dim=65536, model.hidden=1048576"), std::string::npos)
      << err.str();
  EXPECT_FALSE(fs::exists(dir / "run"));
  fs::remove_all(dir);
}

// Item 2 of issue 48: task.train_examples=16777216 task.length=4096 (about
// 1 TiB of generated sequences) passed the estimate and grew until
// std::bad_alloc. The generated sets now count, and the keys are named.
TEST(MemoryEstimateTest, TheGeneratedDatasetCountsAndItsKeysAreNamed) {
  const Config small = Config::FromYaml(StillpointSchema(), kSmall, "small.yaml");
  // 16 + 8 sequences of 5 tokens: each an Example and 5 int64 tokens and targets.
  EXPECT_EQ(EstimateMemory(small, true).dataset, (16 + 8) * (sizeof(Example) + 2 * 8 * 5.0));
  EXPECT_EQ(EstimateMemory(small, false).dataset, EstimateMemory(small, true).dataset);
  const Config huge = Config::FromYaml(StillpointSchema(), kSmall, "small.yaml",
                                       {"task.train_examples=16777216", "task.length=4096",
                                        "model.max_length=4096"});
  EXPECT_GT(EstimateMemory(huge, true).dataset, 1e12);
  try {
    CheckMemoryFits(huge, true, 64.0 * (1 << 30));
    FAIL() << "a terabyte of generated sequences passed";
  } catch (const ConfigError& error) {
    const std::string m = error.what();
    EXPECT_NE(m.find("dataset 1.0 TiB"), std::string::npos) << m;
    EXPECT_NE(m.find("task.train_examples=16777216"), std::string::npos) << m;
    EXPECT_NE(m.find("task.length=4096"), std::string::npos) << m;
  }
  // Data files are not generated: their size is capped by task.max_file_mib.
  const Config digits = Config::FromYaml(StillpointSchema(), kSmall, "small.yaml",
                                         {"task.kind=digits", "task.train_examples=16777216"});
  EXPECT_EQ(EstimateMemory(digits, true).dataset, 0);
}

}  // namespace
}  // namespace stillpoint::memory_estimate_test
