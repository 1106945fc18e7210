// Graceful stop on every termination signal that can end a run: SIGINT
// (Ctrl-C), SIGTERM, SIGHUP (a closed terminal), SIGPIPE (stdout piped to a
// program that exited, e.g. `| head -1`) and SIGXFSZ (a file reached
// `ulimit -f`).
//
// While a StopOnSignals object lives, the first of them only records the
// signal and prints one line; the trainer finishes the step in flight,
// writes a checkpoint of the step reached and the summary, prints the
// resume command on stderr, and the program exits with 128 + the signal
// (130 SIGINT, 143 SIGTERM, 129 SIGHUP, 141 SIGPIPE, 153 SIGXFSZ). A second
// SIGINT, SIGTERM or SIGHUP ends the process at once with the default
// action: the last checkpoint stays intact, since checkpoints are only ever
// replaced by an atomic rename (training/checkpoint.h). SIGPIPE and SIGXFSZ
// never end it at once: they come again with every write to the closed pipe
// or past the limit, and those writes fail instead (EPIPE, EFBIG; a
// checkpoint that cannot be written past the limit is an error naming it,
// and its temporary is removed).
#pragma once

namespace stillpoint {

class StopOnSignals {
 public:
  // Installs the handlers (and clears an earlier request); the destructor
  // restores the previous handlers.
  StopOnSignals();
  ~StopOnSignals();
  StopOnSignals(const StopOnSignals&) = delete;
  StopOnSignals& operator=(const StopOnSignals&) = delete;
};

// The signal that asked the program to stop, or 0.
int StopRequested();
// Records a stop request as the handler does (for tests), or clears it (0).
void SetStopRequested(int signal_number);
// "SIGINT", "SIGTERM", "SIGHUP", "SIGPIPE", "SIGXFSZ" or "a signal".
const char* SignalName(int signal_number);

}  // namespace stillpoint
