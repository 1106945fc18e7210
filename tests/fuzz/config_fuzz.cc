// Fuzzes the config loader: any text either loads or is a ConfigError (never
// another exception, a crash or a sanitizer report), and a loaded config's
// resolved YAML loads back to the same config.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "training/config/config.h"
#include "training/config_schema.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace stillpoint;
  static const ConfigSchema schema = StillpointSchema();
  const std::string text(reinterpret_cast<const char*>(data), size);
  Config config;
  try {
    config = Config::FromYaml(schema, text, "fuzz.yaml");
  } catch (const ConfigError&) {
    return 0;
  }
  const std::string resolved = config.ToYaml();
  if (Config::FromYaml(schema, resolved, "resolved.yaml").ToYaml() != resolved) std::abort();
  try {
    ModelOptionsFromConfig(config);  // the cross-key checks
  } catch (const Error&) {
  }
  return 0;
}
