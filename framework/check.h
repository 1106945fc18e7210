// Error tiers (as in Ceres): a programmer error (shape mismatch, wrong dtype,
// misuse of the graph) throws stillpoint::Error with a message that names the
// op and the shapes involved. Numerical trouble is never an exception: it
// propagates as IEEE values or is reported as a solver status.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace stillpoint {

// Thrown for misuse of the API. The message names the operation and the
// offending shapes or values.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

namespace detail {
// Builds a message from any streamable pieces: StrCat("matmul: ", shape).
template <typename... Args>
std::string StrCat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}
}  // namespace detail

}  // namespace stillpoint

// SP_CHECK(cond, pieces...): throws stillpoint::Error("pieces...") when cond is
// false. Use it for preconditions a caller can violate.
#define SP_CHECK(cond, ...)                                              \
  do {                                                                   \
    if (!(cond)) {                                                       \
      throw ::stillpoint::Error(::stillpoint::detail::StrCat(__VA_ARGS__)); \
    }                                                                    \
  } while (false)
