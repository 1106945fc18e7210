#include "training/provenance.h"

#include <yaml-cpp/yaml.h>

#include <ctime>
#include <fstream>
#include <mutex>

#include "framework/backend_info.h"
#include "training/metrics.h"
#include "stillpoint_git_revision.h"

namespace stillpoint {
namespace {

std::mutex command_line_mutex;
std::string& StoredCommandLine() {
  static std::string command_line;
  return command_line;
}

std::string Quoted(const std::string& word) {
  if (!word.empty() && word.find_first_of(" \t\n'\"\\$`*?[]{}()<>|;&#~") == std::string::npos) {
    return word;
  }
  std::string quoted = "'";
  for (char ch : word) quoted += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return quoted + "'";
}

std::string CpuModel() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) {
        const auto begin = line.find_first_not_of(' ', colon + 1);
        return begin == std::string::npos ? "" : line.substr(begin);
      }
    }
  }
  return "";
}

std::string Text(const YAML::Node& node, const char* key) {
  return node[key] && !node[key].IsNull() ? node[key].as<std::string>() : "";
}

}  // namespace

// The build sets STILLPOINT_VERSION from project(... VERSION).
#ifndef STILLPOINT_VERSION
#define STILLPOINT_VERSION "unknown"
#endif
const char* StillpointVersion() { return STILLPOINT_VERSION; }

void SetCommandLine(int argc, const char* const* argv) {
  std::string line;
  for (int i = 0; i < argc; ++i) line += (i ? " " : "") + Quoted(argv[i]);
  const std::lock_guard<std::mutex> lock(command_line_mutex);
  StoredCommandLine() = line;
}

std::string UtcNow() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char buffer[32];
  std::strftime(buffer, sizeof(buffer), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return buffer;
}

Provenance CollectProvenance(const Config& config) {
  Provenance p;
  p.version = StillpointVersion();
  p.git_revision = STILLPOINT_GIT_REVISION;
  {
    const std::lock_guard<std::mutex> lock(command_line_mutex);
    p.command_line = StoredCommandLine();
  }
  for (const ConfigKey& key : config.schema().keys()) {
    if (config.Origin(key.path).rfind("override '", 0) == 0) {
      p.overrides.push_back(key.path + "=" + config.ValueText(key.path));
    }
  }
  p.cpu_model = CpuModel();
  p.simd_float_lanes = SimdFloatLanes();
  p.threads = config.GetInt("threads");
  p.shards = config.GetInt("train.shards");
  p.start_time = UtcNow();
  return p;
}

std::string ProvenanceJson(const Provenance& p) {
  std::string out = "{\"version\": " + JsonString(p.version) + ", \"git_revision\": " +
                    (p.git_revision.empty() ? "null" : JsonString(p.git_revision)) +
                    ", \"command_line\": " +
                    (p.command_line.empty() ? "null" : JsonString(p.command_line)) +
                    ", \"overrides\": [";
  for (std::size_t i = 0; i < p.overrides.size(); ++i) {
    out += (i ? ", " : "") + JsonString(p.overrides[i]);
  }
  out += "], \"machine\": {\"cpu_model\": " + JsonString(p.cpu_model) +
         ", \"simd_float_lanes\": " + std::to_string(p.simd_float_lanes) +
         ", \"threads\": " + std::to_string(p.threads) +
         ", \"shards\": " + std::to_string(p.shards) + "}, \"start_time\": " +
         JsonString(p.start_time) + ", \"end_time\": " +
         (p.end_time.empty() ? "null" : JsonString(p.end_time)) + "}";
  return out;
}

Provenance ProvenanceFromJson(const std::string& json) {
  Provenance p;
  const YAML::Node node = YAML::Load(json);
  if (!node.IsMap()) return p;
  p.version = Text(node, "version");
  p.git_revision = Text(node, "git_revision");
  p.command_line = Text(node, "command_line");
  for (const auto& o : node["overrides"]) p.overrides.push_back(o.as<std::string>());
  const YAML::Node machine = node["machine"];
  if (machine && machine.IsMap()) {
    p.cpu_model = Text(machine, "cpu_model");
    if (machine["simd_float_lanes"]) p.simd_float_lanes = machine["simd_float_lanes"].as<int>();
    if (machine["threads"]) p.threads = machine["threads"].as<int64_t>();
    if (machine["shards"]) p.shards = machine["shards"].as<int64_t>();
  }
  p.start_time = Text(node, "start_time");
  p.end_time = Text(node, "end_time");
  return p;
}

std::string ProvenanceMarkdown(const Provenance& p) {
  std::string overrides;
  for (const std::string& o : p.overrides) overrides += (overrides.empty() ? "`" : ", `") + o + "`";
  return "stillpoint " + p.version + ", git revision " +
         (p.git_revision.empty() ? "unknown" : "`" + p.git_revision + "`") + "; command `" +
         (p.command_line.empty() ? "(in-process)" : p.command_line) + "`; overrides " +
         (overrides.empty() ? "none" : overrides) + "; machine: " +
         (p.cpu_model.empty() ? "unknown CPU" : p.cpu_model) + ", SIMD " +
         std::to_string(p.simd_float_lanes) + " float32 lanes, " + std::to_string(p.threads) +
         " threads, " + std::to_string(p.shards) + " shards; started " + p.start_time +
         ", ended " + (p.end_time.empty() ? "(running)" : p.end_time) + ".";
}

}  // namespace stillpoint
