#include "training/memory_estimate.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/scratch_path.h"
#include "training/cli/cli_commands.h"
#include "training/config_schema.h"
#include "training/experiment.h"

namespace stillpoint {
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

}  // namespace
}  // namespace stillpoint
