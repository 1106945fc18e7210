#include "training/progress.h"

#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <sstream>

namespace stillpoint {
namespace {

// Set by SIGWINCH (the terminal was resized): the next bar reads its width
// again. Only an atomic store in the handler.
std::atomic<bool> terminal_resized{false};

void OnResize(int) { terminal_resized.store(true); }

void InstallResizeHandler() {
  static const bool installed = [] {
    struct sigaction action {};
    action.sa_handler = OnResize;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;  // a resize does not interrupt reads and writes
    sigaction(SIGWINCH, &action, nullptr);
    return true;
  }();
  (void)installed;
}

std::string MinutesSeconds(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds);
  std::ostringstream out;
  if (s >= 3600)
    out << s / 3600 << ":" << std::setw(2) << std::setfill('0') << (s % 3600) / 60;
  else
    out << s / 60;
  out << ":" << std::setw(2) << std::setfill('0') << s % 60;
  return out.str();
}

}  // namespace

int Progress::TerminalColumns(int fd) {
  struct winsize size {};
  if (::ioctl(fd, TIOCGWINSZ, &size) != 0 || size.ws_col == 0) return 0;
  return size.ws_col;
}

Progress::Progress(std::ostream* out,
                   const std::string& mode,
                   int64_t total_steps,
                   int64_t first_step,
                   ProgressTerminal terminal)
    : out_(out),
      bar_out_(terminal.bar ? terminal.bar : &std::cerr),
      columns_(std::move(terminal.columns)),
      total_(total_steps),
      first_step_(first_step),
      start_(std::chrono::steady_clock::now()),
      last_update_(start_),
      last_update_step_(first_step) {
  if (!out_ || mode == "none") return;
  const bool terminal_attached =
      out_ == &std::cout && bar_out_ == &std::cerr && ::isatty(STDERR_FILENO);
  bar_ = mode == "bar" || (mode == "auto" && terminal_attached);
  lines_ = !bar_;
  if (bar_) {
    if (!columns_) {
      columns_ = [] {
        const int columns = TerminalColumns(STDERR_FILENO);
        return columns > 0 ? columns : 80;
      };
    }
    InstallResizeHandler();
    width_ = columns_();
  }
}

void Progress::Update(
    int64_t step, double loss, double accuracy, double solver_iterations, bool show_solver) {
  if (!bar_ && !lines_) return;
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const int64_t done = step - first_step_;
  const double eta = done > 0 ? elapsed / done * static_cast<double>(total_ - step) : 0.0;
  // Wall time per step since the last update (evaluations included).
  const int64_t steps_since = step - last_update_step_;
  const double ms_per_step =
      steps_since > 0
          ? 1000.0 * std::chrono::duration<double>(now - last_update_).count() / steps_since
          : 0.0;
  last_update_ = now;
  last_update_step_ = step;
  const auto fixed = [](double value, int digits) {
    std::ostringstream text;
    text << std::fixed << std::setprecision(digits) << value;
    return text.str();
  };
  const std::string steps = std::to_string(step) + "/" + std::to_string(total_);
  const std::string acc = fixed(100.0 * accuracy, 1) + "%";
  const std::string iterations = show_solver ? fixed(solver_iterations, 1) : "";
  const std::string rate = fixed(ms_per_step, 1) + " ms/step";
  const std::string eta_text = "ETA " + MinutesSeconds(eta);
  std::string full = "step " + steps + "  loss " + fixed(loss, 4) + "  acc " + acc;
  if (show_solver) full += "  fwd iters " + iterations;
  const std::string without_elapsed = full + "  " + rate + "  " + eta_text;
  full += "  " + rate + "  " + MinutesSeconds(elapsed) + " elapsed  " + eta_text;
  if (bar_) {
    std::string compact = steps + " loss " + fixed(loss, 3) + " acc " + acc;
    if (show_solver) compact += " it " + iterations;
    last_texts_ = {full, without_elapsed, compact + " " + rate + " " + eta_text,
                   compact + " " + eta_text, steps + " acc " + acc};
    last_step_ = step;
    DrawBar();
  } else {
    *out_ << full << "\n" << std::flush;
  }
}

void Progress::DrawBar() {
  if (terminal_resized.exchange(false)) width_ = columns_();
  // One column stays free: writing the last column wraps on some terminals.
  const int usable = std::max(1, width_ - 1);
  // The fullest text that leaves the bar at least kMinBar columns (the bar
  // takes up to 40); when none does, the fullest text that fits alone, and
  // at the last the shortest one cut.
  constexpr int kMinBar = 8;
  std::string line;
  for (const std::string& text : last_texts_) {
    const int room = usable - static_cast<int>(text.size()) - 3;  // "[", "] "
    if (room < kMinBar) continue;
    const int bar_width = std::min(room, 40);
    const int filled = total_ > 0
                           ? static_cast<int>(bar_width * std::min(last_step_, total_) / total_)
                           : bar_width;
    line = "[" + std::string(filled, '#') + std::string(bar_width - filled, '.') + "] " + text;
    break;
  }
  if (line.empty()) {
    for (const std::string& text : last_texts_) {
      if (static_cast<int>(text.size()) <= usable) {
        line = text;
        break;
      }
    }
  }
  if (line.empty()) line = last_texts_.back().substr(0, static_cast<std::size_t>(usable));
  // \r to the line's start, the line, then clear what an earlier, longer
  // line left to its right.
  *bar_out_ << "\r" << line << "\033[K" << std::flush;
  bar_open_ = true;
}

void Progress::Eval(int64_t step, double loss, double accuracy) {
  if (!out_) return;
  std::ostringstream text;
  text << std::fixed << "eval at step " << step << ": test loss " << std::setprecision(4) << loss
       << ", test accuracy " << std::setprecision(2) << 100.0 * accuracy << "%";
  Message(text.str());
}

void Progress::Message(const std::string& text) {
  if (!out_) return;
  if (bar_open_) *bar_out_ << "\r\033[K" << std::flush;  // the bar line, cleared
  *out_ << text << "\n" << std::flush;
  if (bar_open_) DrawBar();
}

void Progress::Finish() {
  if (bar_open_) {
    *bar_out_ << "\n" << std::flush;
    bar_open_ = false;
  }
}

}  // namespace stillpoint
