// Graceful stop on SIGINT (Ctrl-C) and SIGTERM.
//
// While a StopOnSignals object lives, the first SIGINT or SIGTERM only
// records the signal and prints one line; the trainer finishes the step in
// flight, writes a checkpoint of the step reached and the summary, and the
// program exits with 128 + the signal (130 for SIGINT, 143 for SIGTERM). A
// second signal ends the process at once with the default action: the last
// checkpoint stays intact, since checkpoints are only ever replaced by an
// atomic rename (training/checkpoint.h).
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

// The signal that asked the program to stop (SIGINT, SIGTERM), or 0.
int StopRequested();
// Records a stop request as the handler does (for tests), or clears it (0).
void SetStopRequested(int signal_number);
// "SIGINT", "SIGTERM" or "a signal".
const char* SignalName(int signal_number);

}  // namespace stillpoint
