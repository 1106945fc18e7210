// The message of an error a call throws, for the tests that check that an
// error names what and where.
#pragma once

#include <exception>
#include <functional>
#include <string>

namespace stillpoint::testing_support {

// The what() of the E that `f` throws, or "" when it throws nothing. An
// exception of another type is not caught, so the test fails on it.
template <typename E = std::exception>
std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

}  // namespace stillpoint::testing_support
