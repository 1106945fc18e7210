// The `demo` command (the seed papers' claims, docs/seeds.md) and the
// `correct` command (clamped-value belief propagation on one sequence of a
// trained run), added to the `stillpoint` program's command line.
//
//   stillpoint demo exchangeable --out DIR
//   stillpoint demo hidden-state --out DIR [--run RUN]
//   stillpoint demo correction --out DIR
//   stillpoint correct RUN --input TOKENS --clamp POS=VALUE ...
//
// Exit codes as everywhere: 0 ok, 1 runtime failure, 2 bad input (unknown
// demo or option, invalid value, a run that cannot be used), reported before
// any work.
#pragma once

#include <iosfwd>
#include <memory>

namespace CLI {
class App;
}

namespace stillpoint {

class SeedDemoCommands {
 public:
  // Adds the commands to app (which must outlive this object).
  explicit SeedDemoCommands(CLI::App& app);
  ~SeedDemoCommands();

  // After parsing: whether one of these commands was given.
  bool Selected() const;
  // Runs it; returns the exit code.
  int Run(std::ostream& out, std::ostream& err) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace stillpoint
