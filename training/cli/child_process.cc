#include "training/cli/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "framework/check.h"

extern char** environ;

namespace stillpoint {
namespace {

// Both pipes are read together, so a child that fills one while this
// process waits on the other cannot stall.
void ReadBoth(int out_fd, int err_fd, std::string* out, std::string* err) {
  pollfd fds[2] = {{out_fd, POLLIN, 0}, {err_fd, POLLIN, 0}};
  std::string* sinks[2] = {out, err};
  int open = 2;
  char buffer[1 << 14];
  while (open > 0) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      const ssize_t n = ::read(fds[i].fd, buffer, sizeof buffer);
      if (n > 0) {
        sinks[i]->append(buffer, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        fds[i].fd = -1;  // end of file (or an error): poll ignores it now
        --open;
      }
    }
  }
}

}  // namespace

std::string ChildResult::Failure() const {
  if (exit_code == 0) return "";
  if (signal != 0) return "killed by signal " + std::to_string(signal) + " (" + strsignal(signal) + ")";
  std::string last = err;
  while (!last.empty() && last.back() == '\n') last.pop_back();
  const size_t newline = last.rfind('\n');
  if (newline != std::string::npos) last = last.substr(newline + 1);
  return "exit " + std::to_string(exit_code) + (last.empty() ? "" : ": " + last);
}

ChildResult RunChild(const std::vector<std::string>& argv,
                     const std::vector<std::string>& extra_env) {
  SP_CHECK(!argv.empty(), "RunChild: no program");
  std::vector<std::string> environment;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    bool replaced = false;
    for (const std::string& extra : extra_env) {
      const size_t name = extra.find('=');
      replaced = replaced || entry.compare(0, name + 1, extra, 0, name + 1) == 0;
    }
    if (!replaced) environment.push_back(entry);
  }
  environment.insert(environment.end(), extra_env.begin(), extra_env.end());
  std::vector<char*> args, envp;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const std::string& e : environment) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  int out_pipe[2], err_pipe[2];
  SP_CHECK(::pipe2(out_pipe, O_CLOEXEC) == 0 && ::pipe2(err_pipe, O_CLOEXEC) == 0,
           "RunChild: cannot make a pipe: ", std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err_pipe[1], STDERR_FILENO);
  pid_t pid = 0;
  const int spawned = ::posix_spawn(&pid, args[0], &actions, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  if (spawned != 0) {
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    SP_CHECK(false, "cannot run ", argv[0], ": ", std::strerror(spawned));
  }
  ChildResult result;
  ReadBoth(out_pipe[0], err_pipe[0], &result.out, &result.err);
  ::close(out_pipe[0]);
  ::close(err_pipe[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  return result;
}

}  // namespace stillpoint
