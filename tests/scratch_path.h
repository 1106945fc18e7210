// A scratch path for the running test, unique to this process: two test
// runs on one machine (two checkouts, or ctest -j over the same binary)
// never touch each other's files.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace stillpoint::testing_support {

// <temp>/stillpoint_<prefix>_<pid>_<test name>, emptied (not created).
inline std::filesystem::path ScratchPathForThisTest(const std::string& prefix) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() /
      ("stillpoint_" + prefix + "_" + std::to_string(::getpid()) + "_" +
       ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::remove_all(path);
  return path;
}

}  // namespace stillpoint::testing_support
