// Every shipped configuration (examples/configs/*.yaml) parses against the
// schema and converts into model options, so a renamed or removed key
// cannot leave a broken example behind.

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "training/report/compare.h"
#include "training/config/config.h"
#include "training/config_schema.h"

namespace stillpoint::example_configs_test {
namespace {

std::vector<std::string> ExampleConfigs() {
  std::vector<std::string> paths;
  const std::filesystem::path dir = std::filesystem::path(STILLPOINT_SOURCE_DIR) / "examples" /
                                    "configs";
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".yaml") paths.push_back(entry.path().string());
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

TEST(ExampleConfigsTest, EveryExampleParsesAgainstTheSchema) {
  const std::vector<std::string> paths = ExampleConfigs();
  ASSERT_GE(paths.size(), 7u);  // digits, extrapolate, quickstart + the four energy configs
  int energy = 0;
  for (const std::string& path : paths) {
    SCOPED_TRACE(path);
    try {
      const Config config = Config::FromFile(StillpointSchema(), path);
      const ModelOptions model = ModelOptionsFromConfig(config);
      OptimizerOptionsFromConfig(config);
      ScheduleOptionsFromConfig(config);
      ValidateCompareVariants(config);
      if (model.kind == ModelKind::kEnergy) ++energy;
    } catch (const Error& e) {
      ADD_FAILURE() << e.what();
    }
  }
  EXPECT_GE(energy, 4);
}

}  // namespace
}  // namespace stillpoint::example_configs_test
