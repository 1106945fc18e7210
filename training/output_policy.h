// One policy for every file stillpoint writes: run directories (train,
// compare), exports, reports, demo and retrieval outputs, and stdout.
//
//   - What is not ours is not replaced without --overwrite: an existing file
//     or symlink at an output path, an output directory that holds files, a
//     file in log.dir named as a run file when log.dir holds no run.
//   - Never replaced, even with --overwrite: the files of a run directory by
//     any command but that run's own `train --overwrite` (export --out
//     RUN/checkpoint.ckpt, report --out RUN); the config being trained (its
//     log.dir would receive the resolved config under its name); a device
//     node, FIFO, socket or directory. A symlink is replaced as a link (the
//     rename replaces the link itself), never written through to its target.
//   - Files are written atomically (WriteFileAtomically, framework/
//     serialize.h: temporary, fsync, rename), which refuses to rename over
//     anything but a regular file or a symlink.
//   - A failed or short write is exit code 1 naming the path; for stdout,
//     main() flushes and checks it (CheckStandardOutput).
//
// A refusal is a ConfigError (exit code 2) naming the path and the way out,
// raised before the command does any work.
#pragma once

#include <ostream>
#include <streambuf>
#include <string>
#include <vector>

namespace stillpoint {

// The names of the files a run (or a comparison) writes into its directory.
const std::vector<std::string>& RunFileNames();

// True when `directory` holds the records of a run or a comparison: a
// checkpoint, metrics or a comparison report; with `below_too`,
// also in its subdirectories two levels down (a comparison's variants; what
// train and compare check for log.dir). Other files (a user's notes, a
// config, data) do not make it a run. A demo's folder holding a trained run
// in a subdirectory is not itself a run directory.
bool HoldsARun(const std::string& directory, bool below_too = false);

// Throws ConfigError unless `directory` may receive a run (train) or a
// comparison (compare): it must be a directory or not exist; when it holds
// a run, only `overwrite` (or a resume) may replace it; when it holds no run,
// files of a run's names in it are the user's: `input_config` (the config
// being trained) is never replaced, the others only with `overwrite`.
// `written`: the names the command writes into `directory` itself (a run:
// RunFileNames(); a comparison: ComparisonFileNames(), its variants' files go
// to subdirectories); a user's file of another name is none of its business.
void CheckRunDirectory(const std::string& directory, bool overwrite,
                       const std::string& input_config,
                       const std::vector<std::string>& written = RunFileNames());

// The files `compare` writes at its root: the report and the plots of the
// comparison, never a config, metrics, checkpoint or summary (those are its
// variants', in their own directories). A subset of RunFileNames().
const std::vector<std::string>& ComparisonFileNames();

// Throws ConfigError unless a command may write the file `path` (export):
// never a directory, device node, FIFO or socket, nor a run's own file; an
// existing file or symlink only with `overwrite`.
void CheckOutputFile(const std::string& path, bool overwrite);

// Throws ConfigError unless a command may write its files into `directory`
// (report, demos, retrieve): a directory or nothing; never a run directory;
// one that holds files only with `overwrite`.
void CheckOutputDirectory(const std::string& directory, bool overwrite);

// The program's stdout as a stream buffer over its file descriptor that
// keeps the reason (errno) of the first failed write, which stdio forgets.
// main() installs it under std::cout. On a terminal it writes each line as
// it ends; elsewhere it writes in blocks.
class CheckedOutputBuffer : public std::streambuf {
 public:
  explicit CheckedOutputBuffer(int fd);
  ~CheckedOutputBuffer() override;
  // 0, or the errno of the first write that failed.
  int error() const { return error_; }

 protected:
  int_type overflow(int_type ch) override;
  int sync() override;

 private:
  bool Drain();

  int fd_;
  bool line_buffered_;
  int error_ = 0;
  std::string pending_;  // line-buffered mode
  char block_[1 << 13];  // block mode
};

// Flushes `out` (the program's stdout) and returns false, with a message on
// `err` naming standard output and the system's reason (from `buffer`, when
// given), when a write to it failed or fell short (a full disk, /dev/full, a
// closed pipe).
bool CheckStandardOutput(std::ostream& out, std::ostream& err,
                         const CheckedOutputBuffer* buffer = nullptr);

}  // namespace stillpoint
