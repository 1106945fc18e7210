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

struct sigaction g_previous_int, g_previous_term;

void Write(const char* text) {
  // Only async-signal-safe calls in the handler: write(2), not iostreams.
  ssize_t ignored = ::write(STDERR_FILENO, text, std::strlen(text));
  (void)ignored;
}

void Handle(int signal_number) {
  int expected = 0;
  if (!g_stop_signal.compare_exchange_strong(expected, signal_number)) {
    // The second request: stop now, with the signal's default action, so the
    // shell sees the process killed by it.
    Write("\nstopping at once\n");
    std::signal(signal_number, SIG_DFL);
    std::raise(signal_number);
    return;
  }
  Write(signal_number == SIGINT
            ? "\nSIGINT: finishing the current step, then writing a checkpoint and the summary "
              "(Ctrl-C again stops at once)\n"
            : "\nSIGTERM: finishing the current step, then writing a checkpoint and the summary "
              "(a second signal stops at once)\n");
}

}  // namespace

StopOnSignals::StopOnSignals() {
  g_stop_signal = 0;
  struct sigaction action {};
  action.sa_handler = Handle;
  sigemptyset(&action.sa_mask);
  // Restart interrupted system calls: the step in flight should not see EINTR.
  action.sa_flags = SA_RESTART;
  sigaction(SIGINT, &action, &g_previous_int);
  sigaction(SIGTERM, &action, &g_previous_term);
}

StopOnSignals::~StopOnSignals() {
  sigaction(SIGINT, &g_previous_int, nullptr);
  sigaction(SIGTERM, &g_previous_term, nullptr);
}

int StopRequested() { return g_stop_signal.load(); }

void SetStopRequested(int signal_number) { g_stop_signal = signal_number; }

const char* SignalName(int signal_number) {
  switch (signal_number) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    default:
      return "a signal";
  }
}

}  // namespace stillpoint
