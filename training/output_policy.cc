#include "training/output_policy.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "training/config/config.h"

namespace stillpoint {
namespace {

namespace fs = std::filesystem;

// The records that make a directory a run's (or a comparison's): metrics,
// written as soon as a run starts, its checkpoint, and a comparison's
// report. (summary.json alone is not one: the demos write theirs.)
const char* const kRunRecords[] = {"checkpoint.ckpt", "metrics.csv", "metrics.jsonl",
                                   "report.md", "report.html"};

// What kind of thing is at path, without following a final symlink.
enum class Kind { kNothing, kFile, kSymlink, kDirectory, kSpecial };

Kind KindOf(const std::string& path) {
  struct stat info {};
  if (::lstat(path.c_str(), &info) != 0) return Kind::kNothing;
  if (S_ISREG(info.st_mode)) return Kind::kFile;
  if (S_ISLNK(info.st_mode)) return Kind::kSymlink;
  if (S_ISDIR(info.st_mode)) return Kind::kDirectory;
  return Kind::kSpecial;  // device node, FIFO, socket
}

bool IsRunFileName(const std::string& name) {
  const std::vector<std::string>& names = RunFileNames();
  return std::find(names.begin(), names.end(), name) != names.end();
}

bool SameFile(const std::string& a, const std::string& b) {
  std::error_code error;
  return !a.empty() && !b.empty() && fs::equivalent(a, b, error) && !error;
}

bool HoldsFiles(const std::string& directory) {
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(directory, error)) {
    if (entry.path().filename() != ".lock") return true;
  }
  return false;
}

}  // namespace

const std::vector<std::string>& RunFileNames() {
  static const std::vector<std::string> names = {
      "config.yaml",  "metrics.csv", "metrics.jsonl", "checkpoint.ckpt",      "summary.md",
      "summary.json", "loss.svg",    "accuracy.svg",  "solver.svg",           "report.md",
      "report.html",  "variant.json", "accuracy_vs_depth.svg", "accuracy_vs_length.svg",
      "gradient_quality.svg", "spectral_radius.svg", "path_independence.svg", "heat_map.svg",
      "solved_heat_map.svg", "confusion.svg", "vocabulary.json"};
  return names;
}

namespace {

// `depth` levels of subdirectories are searched too: a comparison keeps its
// variants' runs in root/<variant> or root/<attention>/<kind>.
bool HoldsRecords(const std::string& directory, int depth) {
  std::error_code error;
  if (!fs::is_directory(directory, error)) return false;  // (a symlink to one counts)
  for (const char* name : kRunRecords) {
    if (KindOf((fs::path(directory) / name).string()) != Kind::kNothing) return true;
  }
  if (depth == 0) return false;
  for (const fs::directory_entry& entry : fs::directory_iterator(directory, error)) {
    if (entry.is_directory(error) && !entry.is_symlink(error) &&
        HoldsRecords(entry.path().string(), depth - 1)) {
      return true;
    }
  }
  return false;
}

}  // namespace

bool HoldsARun(const std::string& directory, bool below_too) {
  return HoldsRecords(directory, below_too ? 2 : 0);
}

const std::vector<std::string>& ComparisonFileNames() {
  static const std::vector<std::string> names = [] {
    const std::vector<std::string> variant_only = {"config.yaml",  "metrics.csv",
                                                   "metrics.jsonl", "checkpoint.ckpt",
                                                   "summary.md",   "summary.json",
                                                   "variant.json", "vocabulary.json"};
    std::vector<std::string> kept;
    for (const std::string& name : RunFileNames()) {
      if (std::find(variant_only.begin(), variant_only.end(), name) == variant_only.end()) {
        kept.push_back(name);
      }
    }
    return kept;
  }();
  return names;
}

void CheckRunDirectory(const std::string& directory, bool overwrite,
                       const std::string& input_config,
                       const std::vector<std::string>& written) {
  const Kind kind = KindOf(directory);
  if (kind == Kind::kNothing) return;
  std::error_code error;
  if (kind != Kind::kDirectory && !fs::is_directory(directory, error)) {
    throw ConfigError("log.dir '" + directory + "' is " +
                      (kind == Kind::kSpecial ? "a device, FIFO or socket" : "a file") +
                      ", not a directory");
  }
  if (HoldsARun(directory, /*below_too=*/true)) {
    if (overwrite) return;
    throw ConfigError("run directory '" + directory +
                      "' already holds a run; --resume continues it, --overwrite replaces it, "
                      "or give another log.dir");
  }
  // No run here: files named as the ones this command writes are the user's.
  for (const std::string& name : written) {
    const std::string path = (fs::path(directory) / name).string();
    if (KindOf(path) == Kind::kNothing) continue;
    if (SameFile(path, input_config)) {
      throw ConfigError("log.dir '" + directory + "' holds the config being trained, '" + path +
                        "', and the run writes its resolved config to " + path +
                        ", which would replace it; give another log.dir (e.g. " +
                        (fs::path(directory) / "run").string() + ")");
    }
    if (!overwrite) {
      throw ConfigError("log.dir '" + directory + "' holds '" + path +
                        "', which is not a run's (there is no checkpoint or metrics "
                        "beside it) and which the run would replace; move it, give another "
                        "log.dir, or --overwrite to replace it");
    }
  }
}

void CheckOutputFile(const std::string& path, bool overwrite) {
  if (path.empty()) throw ConfigError("--out must name a file, got ''");
  const Kind kind = KindOf(path);
  if (kind == Kind::kDirectory) throw ConfigError("--out '" + path + "' is a directory");
  if (kind == Kind::kSpecial) {
    throw ConfigError("--out '" + path +
                      "' is a device, FIFO or socket; stillpoint replaces only regular files");
  }
  // A run's own file: its checkpoint, metrics, summary (through any path
  // that names it, e.g. RUN/../RUN/checkpoint.ckpt).
  std::error_code error;
  fs::path parent = fs::path(path).parent_path();
  if (parent.empty()) parent = ".";
  const fs::path resolved_parent = fs::weakly_canonical(parent, error);
  const std::string name = fs::path(path).filename().string();
  if (IsRunFileName(name) && HoldsARun(error ? parent.string() : resolved_parent.string())) {
    throw ConfigError("--out '" + path + "' is a file of the run in '" + parent.string() +
                      "'; replacing it would damage the run (even with --overwrite): write "
                      "elsewhere");
  }
  if (kind != Kind::kNothing && !overwrite) {
    throw ConfigError("--out '" + path + "' exists" +
                      (kind == Kind::kSymlink ? " (a symlink; --overwrite replaces the link, "
                                                "not its target)"
                                              : "") +
                      "; --overwrite replaces it, or name another file");
  }
}

void CheckOutputDirectory(const std::string& directory, bool overwrite) {
  if (directory.empty()) throw ConfigError("--out must name a directory, got ''");
  const Kind kind = KindOf(directory);
  if (kind == Kind::kNothing) return;
  std::error_code error;
  if (kind != Kind::kDirectory && !(kind == Kind::kSymlink && fs::is_directory(directory, error))) {
    throw ConfigError("--out '" + directory + "' is " +
                      (kind == Kind::kSpecial ? "a device, FIFO or socket" : "a file") +
                      ", not a directory");
  }
  if (HoldsARun(directory) && !fs::exists(fs::path(directory) / "report.md", error)) {
    throw ConfigError("--out '" + directory +
                      "' is a run directory; its files are the run's (even with --overwrite): "
                      "write elsewhere");
  }
  if (HoldsFiles(directory) && !overwrite) {
    throw ConfigError("--out '" + directory +
                      "' already holds files; --overwrite replaces the ones this command "
                      "writes, or name another directory");
  }
}

CheckedOutputBuffer::CheckedOutputBuffer(int fd) : fd_(fd), line_buffered_(::isatty(fd) == 1) {
  // Line-buffered: every character reaches overflow(), which ends a line
  // with a write; block mode fills block_ first.
  if (!line_buffered_) setp(block_, block_ + sizeof(block_));
}

CheckedOutputBuffer::~CheckedOutputBuffer() { Drain(); }

CheckedOutputBuffer::int_type CheckedOutputBuffer::overflow(int_type ch) {
  if (line_buffered_) {
    if (traits_type::eq_int_type(ch, traits_type::eof())) return Drain() ? 0 : ch;
    pending_.push_back(traits_type::to_char_type(ch));
    if (ch == '\n' && !Drain()) return traits_type::eof();
    return ch;
  }
  if (!Drain()) return traits_type::eof();
  if (!traits_type::eq_int_type(ch, traits_type::eof())) {
    *pptr() = traits_type::to_char_type(ch);
    pbump(1);
  }
  return traits_type::not_eof(ch);
}

int CheckedOutputBuffer::sync() { return Drain() ? 0 : -1; }

bool CheckedOutputBuffer::Drain() {
  const char* data = line_buffered_ ? pending_.data() : pbase();
  std::size_t left = line_buffered_ ? pending_.size() : static_cast<std::size_t>(pptr() - pbase());
  bool ok = true;
  while (left > 0) {
    const ssize_t n = ::write(fd_, data, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (error_ == 0) error_ = n < 0 ? errno : EIO;
      ok = false;
      break;
    }
    data += n;
    left -= static_cast<std::size_t>(n);
  }
  // What could not be written is dropped: the error is kept instead.
  if (line_buffered_) {
    pending_.clear();
  } else {
    setp(block_, block_ + sizeof(block_));
  }
  return ok;
}

bool CheckStandardOutput(std::ostream& out, std::ostream& err,
                         const CheckedOutputBuffer* buffer) {
  out.flush();
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0 && !std::ferror(stdout);
  int error_number = buffer != nullptr && buffer->error() != 0 ? buffer->error() : errno;
  if (out.good() && flushed && (buffer == nullptr || buffer->error() == 0)) return true;
  err << "error: writing to standard output failed"
      << (error_number != 0 ? std::string(": ") + std::strerror(error_number) : std::string())
      << "; the output is incomplete\n";
  return false;
}

}  // namespace stillpoint
