#include "training/progress.h"

#include <unistd.h>

#include <cstdio>
#include <iomanip>
#include <iostream>
#include <sstream>

namespace stillpoint {

Progress::Progress(std::ostream* out, const std::string& mode, int64_t total_steps,
                   int64_t first_step)
    : out_(out), total_(total_steps), first_step_(first_step),
      start_(std::chrono::steady_clock::now()) {
  const bool terminal = out_ == &std::cout && ::isatty(STDOUT_FILENO);
  if (!out_ || mode == "none") return;
  bar_ = mode == "bar" || (mode == "auto" && terminal);
  lines_ = !bar_;
}

void Progress::Update(int64_t step, double loss, double accuracy, double solver_iterations,
                      bool show_solver) {
  if (!bar_ && !lines_) return;
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const int64_t done = step - first_step_;
  const double eta = done > 0 ? elapsed / done * static_cast<double>(total_ - step) : 0.0;
  std::ostringstream text;
  text << std::fixed << "step " << step << "/" << total_ << "  loss " << std::setprecision(4)
       << loss << "  acc " << std::setprecision(1) << 100.0 * accuracy << "%";
  if (show_solver) text << "  fwd iters " << std::setprecision(1) << solver_iterations;
  text << "  ETA " << static_cast<int64_t>(eta) / 60 << ":" << std::setw(2) << std::setfill('0')
       << static_cast<int64_t>(eta) % 60;
  if (bar_) {
    constexpr int kWidth = 24;
    const int filled = total_ > 0 ? static_cast<int>(kWidth * step / total_) : kWidth;
    *out_ << "\r[" << std::string(filled, '#') << std::string(kWidth - filled, '.') << "] "
          << text.str() << "   " << std::flush;
    bar_open_ = true;
  } else {
    *out_ << text.str() << "\n" << std::flush;
  }
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
  EndBarLine();
  *out_ << text << "\n" << std::flush;
}

void Progress::Finish() { EndBarLine(); }

void Progress::EndBarLine() {
  if (bar_open_) {
    *out_ << "\n";
    bar_open_ = false;
  }
}

}  // namespace stillpoint
