// Protection of a run directory: one writer at a time, and no finished run
// replaced without being asked.
//
// A writer (a `stillpoint train` run, or `stillpoint compare` over its report
// directory) holds an advisory lock, flock(2) on RUN_DIR/.lock, for as long
// as it writes; the lock file holds the holder's pid and host. A second
// writer is refused with a ConfigError (exit code 2) naming the holder. The
// kernel drops the lock when the holder exits, however it exits, so a stale
// lock file never blocks a later run; the file itself stays (removing it
// would race with a writer that has just opened it).
//
// A plain run into a directory that already holds a run is refused unless
// the caller overwrites or resumes: repeating a command must not destroy the
// last result (CheckRunDirectory, training/output_policy.h, which also
// guards a user's files in a directory that holds no run). With no log.dir in the config, the CLI
// picks the first free directory of runs/<config name>, runs/<config
// name>-2, runs/<config name>-3, ... (NextFreeRunDirectory) and prints it.
#pragma once

#include <string>
#include <vector>

#include "training/output_policy.h"

namespace stillpoint {

class RunDirectoryLock {
 public:
  // Creates `directory` if needed and locks it. Throws ConfigError naming
  // the holder when another writer holds it, or when `directory` exists and
  // is not a directory; Error when the lock file cannot be created.
  explicit RunDirectoryLock(const std::string& directory);
  ~RunDirectoryLock();
  RunDirectoryLock(const RunDirectoryLock&) = delete;
  RunDirectoryLock& operator=(const RunDirectoryLock&) = delete;

  const std::string& directory() const { return directory_; }

 private:
  std::string directory_;
  int fd_ = -1;
};

// True when `directory` does not exist or holds nothing but a lock file.
bool RunDirectoryIsEmpty(const std::string& directory);

// `base` if it is empty (or missing), else the first of base-2, base-3, ...
// that is.
std::string NextFreeRunDirectory(const std::string& base);

// Removes the files a run writes (RunFileNames: checkpoint, metrics,
// config, summary, plots, reports) from `directory`, so an overwritten run starts clean and a
// crash cannot leave the old run's checkpoint beside the new run's metrics.
// Other files and subdirectories are left alone. `names`: the files to
// remove (a comparison's root: ComparisonFileNames(), so a user's config.yaml
// there stays).
void RemoveRunFiles(const std::string& directory,
                    const std::vector<std::string>& names = RunFileNames());

// Removes the temporaries (<file>.tmp.<pid>, framework/serialize.h) that a
// writer killed mid-save left in `directory` (SIGKILL, SIGXFSZ): only those
// whose pid is not a live process, so a concurrent writer's (an export
// into the run directory) is left alone. Returns the paths removed.
std::vector<std::string> RemoveStaleTemporaries(const std::string& directory);

}  // namespace stillpoint
