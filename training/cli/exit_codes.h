// The exit codes of every `stillpoint` command (README.md, "Exit codes").
#pragma once

namespace stillpoint {

inline constexpr int kOk = 0;
// A run that failed while working: a diverged step, a failed write.
inline constexpr int kRuntimeFailure = 1;
// Bad input, reported before any work: a malformed or unknown key, a
// missing or corrupt file, a bad flag.
inline constexpr int kBadInput = 2;

}  // namespace stillpoint
