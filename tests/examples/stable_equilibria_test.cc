// The quickstart's probabilistic energy model trains at a contracting fixed
// point with the exact implicit gradient at its defaults, and does not with
// the contraction switched off: a reduced run of examples/configs/
// quickstart.yaml through the program as a user runs it (label `examples`).
// At every evaluation the trainer's checks give the spectral radius of the
// model's fixed-point map (power iteration at z*) and the cosine of the
// gradient it trains with against the implicit gradient solved to 1e-10.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "tests/scratch_path.h"
#include "tests/shell_text.h"
#include "training/metrics.h"

#ifndef STILLPOINT_CLI_PATH
#error "the build gives the path of the stillpoint program"
#endif

namespace stillpoint {
namespace {

using testing_support::Quoted;

struct Checks {
  std::vector<double> spectral_radius;  // one per evaluation
  std::vector<double> gradient_cosine;
};

class StableEquilibriaTest : public testing_support::ScratchDirTest {
 protected:
  StableEquilibriaTest() : ScratchDirTest("stable") {}

  // 100 steps of the quickstart's probabilistic/energy variant (300 in the
  // config), evaluated every 25; returns the checks of every evaluation.
  Checks Train(const std::string& sub, const std::vector<std::string>& overrides) {
    std::string command = Quoted(STILLPOINT_CLI_PATH) + " train " +
                          Quoted(std::string(STILLPOINT_SOURCE_DIR) +
                                 "/examples/configs/quickstart.yaml");
    for (const std::string& o :
         {std::string("model.kind=energy"), std::string("model.attention=probabilistic"),
          std::string("train.steps=100"), std::string("train.eval_every=25"),
          std::string("train.checkpoint_every=0"), std::string("log.plots=false"),
          std::string("log.dir=") + (dir_ / sub).string(), std::string("log.progress=none")}) {
      command += " " + Quoted(o);
    }
    for (const std::string& o : overrides) command += " " + Quoted(o);
    command += " > " + Quoted((dir_ / (sub + ".out")).string()) + " 2>&1";
    const int status = std::system(command.c_str());
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << command;
    const std::map<std::string, std::vector<double>> metrics = ReadRunMetrics((dir_ / sub).string());
    Checks checks;
    const std::vector<double>& radius = metrics.at("spectral_radius");
    const std::vector<double>& cosine = metrics.at("grad_cos");
    for (std::size_t row = 0; row < radius.size(); ++row) {
      if (std::isnan(radius[row])) continue;  // a step without evaluation
      checks.spectral_radius.push_back(radius[row]);
      checks.gradient_cosine.push_back(cosine[row]);
    }
    return checks;
  }
};

TEST_F(StableEquilibriaTest, TheEnergyModelContractsAndTrainsWithTheExactGradient) {
  const Checks defaults = Train("defaults", {});
  ASSERT_EQ(defaults.spectral_radius.size(), 4u);
  for (std::size_t i = 0; i < defaults.spectral_radius.size(); ++i) {
    EXPECT_LT(defaults.spectral_radius[i], 1.0) << "evaluation " << i;
    EXPECT_GE(defaults.gradient_cosine[i], 0.999) << "evaluation " << i;
  }
  // Without the contraction the value term outgrows the mixture's spread:
  // the map expands at its fixed point (a saddle of the EM energy) and the
  // gradient the model trains with is no longer the implicit one.
  const Checks off = Train("off", {"model.energy.value_contraction=0"});
  ASSERT_EQ(off.spectral_radius.size(), 4u);
  const double worst_radius = *std::max_element(off.spectral_radius.begin(), off.spectral_radius.end());
  const double worst_cosine = *std::min_element(off.gradient_cosine.begin(), off.gradient_cosine.end());
  EXPECT_TRUE(worst_radius > 1.0 || worst_cosine < 0.999)
      << "radius " << worst_radius << ", cosine " << worst_cosine;
}

}  // namespace
}  // namespace stillpoint
