// The expfam energy attention learns the attention grid's task
// (examples/configs/attention_grid.yaml: reverse, 16 symbols, d = 64, 4
// heads) at a reduced budget, run through the program as a user runs it.
// Its operating point (patterns rescaled so the update contracts,
// docs/energy-layers.md "Operating points", with the measurements) is what
// these runs check: without the rescaling the solve and its adjoint do not
// converge and the energy model stays far below the bound.
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

namespace stillpoint::expfam_attention_test {
namespace {

namespace fs = std::filesystem;
using testing_support::Quoted;
using testing_support::ReadText;

class ExpFamAttentionTrainingTest : public testing_support::ScratchDirTest {
 protected:
  ExpFamAttentionTrainingTest() : ScratchDirTest("expfam") {}

  // `stillpoint train attention_grid.yaml overrides... log.dir=dir_/name`;
  // returns the run's held-out token accuracy.
  double Train(const std::string& name, const std::vector<std::string>& overrides) {
    std::string command =
        Quoted(STILLPOINT_CLI_PATH) + " train " +
        Quoted(std::string(STILLPOINT_SOURCE_DIR) + "/examples/configs/attention_grid.yaml");
    for (const std::string& o : overrides) command += " " + Quoted(o);
    command += " " + Quoted("log.dir=" + (dir_ / name).string());
    command +=
        " > " + Quoted((dir_ / "stdout").string()) + " 2> " + Quoted((dir_ / "stderr").string());
    const int status = std::system(command.c_str());
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << ReadText(dir_ / "stderr") << ReadText(dir_ / "stdout");
    const YAML::Node summary = YAML::LoadFile((dir_ / name / "summary.json").string());
    return summary["test_accuracy"].as<double>();
  }
};

// The single-block energy model: 150 of the grid's 300 steps.
TEST_F(ExpFamAttentionTrainingTest, EnergyModelLearnsTheReverseTask) {
  const double accuracy =
      Train("energy", {"model.kind=energy", "model.attention=expfam", "train.steps=150",
                       "train.eval_every=150", "train.checkpoint_every=0", "log.plots=false"});
  EXPECT_GE(accuracy, 0.95);
}

// expfam as the attention of the explicit 6-layer transformer: 150 steps.
TEST_F(ExpFamAttentionTrainingTest, ExplicitTransformerLearnsTheReverseTask) {
  const double accuracy =
      Train("explicit", {"model.kind=explicit", "model.attention=expfam", "train.steps=150",
                         "train.eval_every=150", "train.checkpoint_every=0", "log.plots=false"});
  EXPECT_GE(accuracy, 0.95);
}

}  // namespace
}  // namespace stillpoint::expfam_attention_test
