#include "training/run_directory.h"

#include <fcntl.h>
#include <sys/file.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "training/config/config.h"
#include "training/output_policy.h"

namespace stillpoint {
namespace {

namespace fs = std::filesystem;

constexpr const char* kLockName = ".lock";

std::string HostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "unknown host";
  return name;
}

// The lock file's text ("pid 123 on host"), for the refusal message.
std::string HolderOf(const std::string& lock_path) {
  std::ifstream in(lock_path);
  std::string holder;
  std::getline(in, holder);
  return holder.empty() ? "another process" : holder;
}

}  // namespace

RunDirectoryLock::RunDirectoryLock(const std::string& directory) : directory_(directory) {
  std::error_code error;
  // A file, FIFO or device named as log.dir is bad input, not a failure.
  if (fs::exists(directory, error) && !fs::is_directory(directory, error)) {
    throw ConfigError("log.dir '" + directory + "' is not a directory");
  }
  fs::create_directories(directory, error);
  if (error) {
    throw Error("cannot create the run directory '" + directory + "': " + error.message());
  }
  const std::string lock_path = (fs::path(directory) / kLockName).string();
  fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw Error("cannot create the lock file '" + lock_path + "': " + std::strerror(errno));
  }
  int result;
  do {
    result = ::flock(fd_, LOCK_EX | LOCK_NB);
  } while (result != 0 && errno == EINTR);
  if (result != 0) {
    const int error_number = errno;
    ::close(fd_);
    fd_ = -1;
    if (error_number == EWOULDBLOCK) {
      throw ConfigError("run directory '" + directory + "' is in use by " + HolderOf(lock_path) +
                        " (lock " + lock_path +
                        "); wait for that run to end or give another log.dir");
    }
    throw Error("cannot lock '" + lock_path + "': " + std::strerror(error_number));
  }
  // Only the holder writes the file, so its content is the holder's.
  const std::string holder =
      "pid " + std::to_string(static_cast<long>(::getpid())) + " on " + HostName() + "\n";
  if (::ftruncate(fd_, 0) == 0) {
    ssize_t written = ::pwrite(fd_, holder.data(), holder.size(), 0);
    (void)written;  // the lock holds without the note; the message then says less
  }
}

RunDirectoryLock::~RunDirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the lock
}

bool RunDirectoryIsEmpty(const std::string& directory) {
  std::error_code error;
  if (!fs::exists(directory, error)) return true;
  if (!fs::is_directory(directory, error)) return false;
  for (const fs::directory_entry& entry : fs::directory_iterator(directory, error)) {
    if (entry.path().filename() != kLockName) return false;
  }
  return true;
}

std::string NextFreeRunDirectory(const std::string& base) {
  if (RunDirectoryIsEmpty(base)) return base;
  for (int n = 2;; ++n) {
    const std::string candidate = base + "-" + std::to_string(n);
    if (RunDirectoryIsEmpty(candidate)) return candidate;
  }
}

void RemoveRunFiles(const std::string& directory, const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    const fs::path path = fs::path(directory) / name;
    std::error_code error;
    fs::remove(path, error);
    if (error) {
      throw Error("--overwrite: cannot remove '" + path.string() + "': " + error.message());
    }
  }
}

std::vector<std::string> RemoveStaleTemporaries(const std::string& directory) {
  std::vector<std::string> removed;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(directory, error)) {
    const std::string name = entry.path().filename().string();
    const std::size_t mark = name.rfind(".tmp.");
    if (mark == std::string::npos || mark == 0 || !entry.is_regular_file(error)) continue;
    const std::string digits = name.substr(mark + 5);
    if (digits.empty() || digits.size() > 9 ||
        digits.find_first_not_of("0123456789") != std::string::npos) {
      continue;
    }
    const pid_t pid = static_cast<pid_t>(std::stol(digits));
    // Alive (or not ours to signal): a writer may still be saving it.
    if (pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
    if (fs::remove(entry.path(), error)) removed.push_back(entry.path().string());
  }
  return removed;
}

}  // namespace stillpoint
