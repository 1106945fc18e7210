#include "training/signals.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>

namespace stillpoint {
namespace {

// Lock-free, so reading and writing it in a signal handler is defined.
std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);

// The signals that stop a run, and the handlers they had before.
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGXFSZ};
constexpr int kStopSignalCount = sizeof(kStopSignals) / sizeof(kStopSignals[0]);
struct sigaction g_previous[kStopSignalCount];

void Write(const char* text) {
  // Only async-signal-safe calls in the handler: write(2), not iostreams.
  ssize_t ignored = ::write(STDERR_FILENO, text, std::strlen(text));
  (void)ignored;
}

// Signals raised again by every failing write: never a reason to stop at once.
bool Repeats(int signal_number) { return signal_number == SIGPIPE || signal_number == SIGXFSZ; }

void Handle(int signal_number) {
  int expected = 0;
  if (!g_stop_signal.compare_exchange_strong(expected, signal_number)) {
    if (Repeats(signal_number)) return;  // the write that raised it fails instead
    // The second request: stop now, with the signal's default action, so the
    // shell sees the process killed by it.
    Write("\nstopping at once\n");
    std::signal(signal_number, SIG_DFL);
    std::raise(signal_number);
    return;
  }
  switch (signal_number) {
    case SIGINT:
      Write("\nSIGINT: finishing the current step, then writing a checkpoint and the summary "
            "(Ctrl-C again stops at once)\n");
      break;
    case SIGPIPE:
      Write("\nSIGPIPE: standard output was closed; finishing the current step, then writing a "
            "checkpoint and the summary\n");
      break;
    case SIGXFSZ:
      Write("\nSIGXFSZ: a file reached the file size limit (ulimit -f); finishing the current "
            "step, then trying to write a checkpoint and the summary\n");
      break;
    default:
      Write(signal_number == SIGHUP
                ? "\nSIGHUP: finishing the current step, then writing a checkpoint and the "
                  "summary (a second signal stops at once)\n"
                : "\nSIGTERM: finishing the current step, then writing a checkpoint and the "
                  "summary (a second signal stops at once)\n");
  }
}

}  // namespace

StopOnSignals::StopOnSignals() {
  g_stop_signal = 0;
  struct sigaction action {};
  action.sa_handler = Handle;
  sigemptyset(&action.sa_mask);
  // Restart interrupted system calls: the step in flight should not see EINTR.
  action.sa_flags = SA_RESTART;
  for (int i = 0; i < kStopSignalCount; ++i) sigaction(kStopSignals[i], &action, &g_previous[i]);
}

StopOnSignals::~StopOnSignals() {
  for (int i = 0; i < kStopSignalCount; ++i) sigaction(kStopSignals[i], &g_previous[i], nullptr);
}

int StopRequested() { return g_stop_signal.load(); }

void SetStopRequested(int signal_number) { g_stop_signal = signal_number; }

const char* SignalName(int signal_number) {
  switch (signal_number) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
    case SIGPIPE:
      return "SIGPIPE";
    case SIGXFSZ:
      return "SIGXFSZ";
    default:
      return "a signal";
  }
}

}  // namespace stillpoint
