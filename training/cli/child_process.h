// Runs another program as a child process and collects what it prints, for
// measurements that need a process of their own (a peak resident set that
// is one configuration's alone: `stillpoint bench scale`).
#pragma once

#include <string>
#include <vector>

namespace stillpoint {

struct ChildResult {
  int exit_code = -1;  // the child's exit status; -1 when it did not exit normally
  int signal = 0;      // the signal that ended it, if one did
  std::string out;     // its standard output
  std::string err;     // its standard error
  // A one-line description of a failure ("exit 2: <last line of stderr>",
  // "killed by signal 9"), empty when exit_code is 0.
  std::string Failure() const;
};

// Runs argv[0] (a path, not searched on PATH) with the arguments argv and
// this process's environment plus extra_env ("NAME=VALUE" entries, which
// replace a variable of the same name), and waits for it. Throws
// stillpoint::Error when the program cannot be started.
ChildResult RunChild(const std::vector<std::string>& argv,
                     const std::vector<std::string>& extra_env = {});

}  // namespace stillpoint
