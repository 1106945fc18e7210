// The Energy Transformer block learns the reverse task as the energy model
// (examples/configs/energy_transformer.yaml) on a reduced budget, run through
// the program as a user runs it (label `examples`): it fails if the block's
// operating point (docs/energy-layers.md, "Operating points") falls back.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/scratch_path.h"
#include "tests/shell_text.h"

#ifndef STILLPOINT_CLI_PATH
#error "the build gives the path of the stillpoint program"
#endif

namespace stillpoint::energy_transformer_test {
namespace {

namespace fs = std::filesystem;
using testing_support::TrainCommand;

class EnergyTransformerExampleTest : public testing_support::ScratchDirTest {
 protected:
  EnergyTransformerExampleTest() : ScratchDirTest("et") {}

  // Trains the example config with `overrides` on the reduced budget;
  // returns its summary.json.
  YAML::Node Train(const std::string& sub, const std::vector<std::string>& overrides) {
    std::vector<std::string> all = {"train.steps=150", "train.eval_every=150",
                                    "log.dir=" + (dir_ / sub).string(), "log.progress=none"};
    all.insert(all.end(), overrides.begin(), overrides.end());
    const std::string command = TrainCommand(
        STILLPOINT_CLI_PATH,
        std::string(STILLPOINT_SOURCE_DIR) + "/examples/configs/energy_transformer.yaml", all,
        dir_ / (sub + ".out"));
    const int status = std::system(command.c_str());
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << command;
    return YAML::LoadFile((dir_ / sub / "summary.json").string());
  }
};

// 150 steps of the example (600 in the config): the defaults (attention
// readout, step 1, beta 4/sqrt(dh), the config's spectral-radius penalty)
// learn the task at a healthy equilibrium; the tokens' move x* - x as the
// output (the reference readout, no value map) stays below on the same
// budget (docs/energy-layers.md gives the measured figures).
TEST_F(EnergyTransformerExampleTest, LearnsTheReverseTaskOnAReducedBudget) {
  const YAML::Node defaults = Train("defaults", {});
  EXPECT_GE(defaults["test_accuracy"].as<double>(), 0.95);
  EXPECT_TRUE(defaults["forward_tolerance_met"].as<bool>());
  EXPECT_TRUE(defaults["backward_tolerance_met"].as<bool>());
  EXPECT_EQ(defaults["equilibrium"]["verdict"].as<std::string>(), "healthy");
  const YAML::Node move = Train("move", {"model.energy.readout=move"});
  EXPECT_LT(move["test_accuracy"].as<double>(), defaults["test_accuracy"].as<double>() - 0.1);
}

}  // namespace
}  // namespace stillpoint::energy_transformer_test
