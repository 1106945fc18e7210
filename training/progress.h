// Progress display of a training run: a one-line bar redrawn in place on a
// terminal (steps, loss, accuracy, solver iterations, ETA), or plain
// periodic lines when the output is a file or pipe. Mode "auto" picks by
// isatty; "none" prints only messages (failures, evaluations).
#pragma once

#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <string>

namespace stillpoint {

class Progress {
 public:
  // out may be null (silent). mode: auto | bar | lines | none.
  Progress(std::ostream* out, const std::string& mode, int64_t total_steps, int64_t first_step);

  void Update(int64_t step, double loss, double accuracy, double solver_iterations,
              bool show_solver);
  void Eval(int64_t step, double loss, double accuracy);
  // A line that must not be lost (failures); ends any bar line first.
  void Message(const std::string& text);
  void Finish();

 private:
  void EndBarLine();
  std::ostream* out_;
  bool bar_ = false;
  bool lines_ = false;
  bool bar_open_ = false;
  int64_t total_;
  int64_t first_step_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace stillpoint
