// `stillpoint generate RUN --prompt TEXT --tokens N [--temperature T]
// [--top-k K] [--seed S] [--keep K] [--full-window] [--no-warm-start] [--json]`: the continuation of a prompt by a
// trained character-level model (task.kind text; training/generate.h).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

namespace CLI {
class App;
}

namespace stillpoint {

struct GenerateArgs {
  std::string run;  // run directory or checkpoint file
  std::string prompt;
  int64_t tokens = 200;
  double temperature = 1.0;
  int64_t top_k = 0;
  int64_t seed = 0;
  bool no_warm_start = false;
  bool full_window = false;  // GenerateOptions::incremental = false
  int64_t keep = 0;          // GenerateOptions::keep
  bool json = false;
};

// Adds the command to app; its arguments land in args.
CLI::App* AddGenerateCommand(CLI::App& app, GenerateArgs& args);

// Prints the continuation to out (and, on err, the prompt's unknown and
// dropped symbols and, for an implicit model, iterations per symbol). Bad
// input (exit 2): options out of range, an empty prompt, a run that is not a
// text task.
int RunGenerate(const GenerateArgs& args, std::ostream& out, std::ostream& err);

}  // namespace stillpoint
