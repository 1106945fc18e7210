// Where a run came from, recorded in RUN_DIR/summary.json ("provenance"),
// summary.md and the comparison report: the stillpoint version, the git
// revision the binary was built from (when known), the command line, the
// config overrides, the machine and the start and end times.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "training/config/config.h"

namespace stillpoint {

// project(... VERSION) of the build ("unknown" when built without it).
const char* StillpointVersion();

struct Provenance {
  std::string version;       // project(... VERSION)
  std::string git_revision;  // "<12 hex>[-dirty]" at build time; "" unknown
  std::string command_line;  // as given to the program ("" when run in-process)
  // The overrides of the resolved config, as "key=value" (from the command
  // line, and those compare applies per variant), in schema order.
  std::vector<std::string> overrides;
  std::string cpu_model;  // /proc/cpuinfo "model name"; "" unknown
  int simd_float_lanes = 1;  // float32 lanes of the SIMD packets compiled in
  int64_t threads = 1;       // the config's threads
  int64_t shards = 1;        // the config's train.shards
  std::string start_time;    // UTC, ISO 8601 ("2026-11-27T21:58:03Z")
  std::string end_time;      // "" while running
};

// Keeps the program's command line (main calls it once) for every run's
// provenance; arguments with spaces or quotes are shell-quoted.
void SetCommandLine(int argc, const char* const* argv);

// The provenance of a run of `config` starting now (no end time).
Provenance CollectProvenance(const Config& config);

// The current time, UTC, ISO 8601 to the second.
std::string UtcNow();

// {"version": ..., "git_revision": ... or null, "command_line": ...,
//  "overrides": [...], "machine": {"cpu_model", "simd_float_lanes",
//  "threads", "shards"}, "start_time", "end_time"}.
std::string ProvenanceJson(const Provenance& provenance);
// Reads ProvenanceJson's text back (the fields it finds).
Provenance ProvenanceFromJson(const std::string& json);
// Markdown lines for summary.md and the report.
std::string ProvenanceMarkdown(const Provenance& provenance);

}  // namespace stillpoint
