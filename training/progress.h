// Progress display of a training run.
//
// On a terminal: one bar line on standard error, redrawn in place, as wide
// as the terminal (the width is read again after the terminal is resized,
// SIGWINCH): "[####....] step 150/300  loss 0.1234  acc 98.5%  fwd iters
// 12.3  12.4 ms/step  0:05 elapsed  ETA 0:05". The bar shrinks, and then
// goes, before the text is cut. A message (evaluations, warnings) clears
// the bar line, prints on the message stream, and the bar is drawn again
// below it, so no stale bar is left above a message.
// Elsewhere (a pipe, a file, an in-process stream): the same text as plain
// lines on the message stream. Mode "auto" picks the bar when the message
// stream is standard output and standard error is a terminal; "bar" and
// "lines" force one; "none" prints only messages.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

namespace stillpoint {

// Where the bar goes and how wide it may be; the defaults are the process's
// standard error and its terminal width. For tests.
struct ProgressTerminal {
  std::ostream* bar = nullptr;   // nullptr: std::cerr
  std::function<int()> columns;  // nullptr: the width of standard error's terminal (80 if unknown)
};

class Progress {
 public:
  // out may be null (silent). mode: auto | bar | lines | none.
  Progress(std::ostream* out,
           const std::string& mode,
           int64_t total_steps,
           int64_t first_step,
           ProgressTerminal terminal = {});

  void Update(
      int64_t step, double loss, double accuracy, double solver_iterations, bool show_solver);
  void Eval(int64_t step, double loss, double accuracy);
  // A line that must not be lost (failures, evaluations): clears the bar,
  // prints the line, draws the bar again.
  void Message(const std::string& text);
  // Ends the bar line (the last bar stays on screen).
  void Finish();

  // The terminal width of file descriptor fd, or 0 when it is not a
  // terminal.
  static int TerminalColumns(int fd);

 private:
  void DrawBar();
  std::ostream* out_;
  std::ostream* bar_out_ = nullptr;
  std::function<int()> columns_;
  int width_ = 0;  // columns of the bar line, read again after SIGWINCH
  bool bar_ = false;
  bool lines_ = false;
  bool bar_open_ = false;
  // The text of the last bar, redrawn after messages: the full line first,
  // then ever shorter forms for narrower terminals.
  std::vector<std::string> last_texts_;
  int64_t last_step_ = 0;
  int64_t total_;
  int64_t first_step_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_update_;
  int64_t last_update_step_;
};

}  // namespace stillpoint
