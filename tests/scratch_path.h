// A scratch path for the running test, unique to this process: two test
// runs on one machine (two checkouts, or ctest -j over the same binary)
// never touch each other's files. ScratchDirTest: a fixture with one such
// directory per test.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <utility>

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

// A fixture whose dir_ is a fresh, empty scratch directory for each test
// (ScratchPathForThisTest(prefix), created), removed after it.
class ScratchDirTest : public ::testing::Test {
 protected:
  explicit ScratchDirTest(std::string prefix) : prefix_(std::move(prefix)) {}
  void SetUp() override {
    dir_ = ScratchPathForThisTest(prefix_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path dir_;

 private:
  std::string prefix_;
};

}  // namespace stillpoint::testing_support
