// The `stillpoint` program as a process: what only a real process shows
// (signals, exit codes set by main, argument parsing before any command).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "framework/serialize.h"
#include "tests/scratch_path.h"
#include "training/checkpoint.h"

#ifndef STILLPOINT_CLI_PATH
#error "the build gives the path of the stillpoint program"
#endif

namespace stillpoint::cli_process_test {
namespace {

namespace fs = std::filesystem;

class CliProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing_support::ScratchPathForThisTest("cli");
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    fs::remove_all(dir_);
  }

  // Starts `stillpoint args...` with stdout and stderr in files; `in_child`
  // runs in the child before the exec (another stdout, a resource limit).
  void Start(const std::vector<std::string>& args,
             const std::function<void()>& in_child = nullptr) {
    pid_ = ::fork();
    ASSERT_GE(pid_, 0);
    if (pid_ == 0) {
      const int out = ::open((dir_ / "stdout").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int err = ::open((dir_ / "stderr").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(out, STDOUT_FILENO);
      ::dup2(err, STDERR_FILENO);
      if (in_child) in_child();
      std::vector<char*> argv;
      std::string program = STILLPOINT_CLI_PATH;
      argv.push_back(program.data());
      std::vector<std::string> copies = args;
      for (std::string& a : copies) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(program.c_str(), argv.data());
      ::_exit(127);
    }
  }

  // Waits for the process; returns its wait status.
  int Wait() {
    int status = 0;
    EXPECT_EQ(::waitpid(pid_, &status, 0), pid_);
    pid_ = -1;
    return status;
  }

  int RunToEnd(const std::vector<std::string>& args,
               const std::function<void()>& in_child = nullptr) {
    Start(args, in_child);
    const int status = Wait();
    EXPECT_TRUE(WIFEXITED(status)) << "status " << status;
    return WEXITSTATUS(status);
  }

  std::string Text(const std::string& name) const {
    std::ifstream in(dir_ / name);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  // Polls until pred() holds (true) or 120 s pass (false).
  template <typename Pred>
  bool WaitFor(Pred pred) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < deadline) {
      if (pred()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }

  int MetricsRows() const {
    std::ifstream in(dir_ / "run" / "metrics.csv");
    int lines = 0;
    std::string line;
    while (std::getline(in, line)) ++lines;
    return lines > 0 ? lines - 1 : 0;
  }

  // A run long enough never to end by itself within the test, with steps
  // slow enough (an implicit model solved to a tight tolerance) that a
  // signal arrives while one is in flight.
  std::vector<std::string> LongRun() {
    const std::string config = (dir_ / "long.yaml").string();
    std::ofstream(config)
        << "seed: 1\nthreads: 1\n"
        << "task: {kind: reverse, length: 8, vocab_size: 8, train_examples: 512, "
           "test_examples: 64}\n"
        << "model:\n  kind: implicit\n  dim: 32\n  heads: 2\n  hidden: 64\n  max_length: 8\n"
        << "  solver:\n    forward: {max_iterations: 60, relative_tolerance: 1e-9}\n"
        << "    backward: {max_iterations: 60, tolerance: 1e-9}\n"
        << "train:\n  steps: 100000\n  batch_size: 128\n  eval_every: 0\n  log_every: 1\n"
        << "  checkpoint_every: 3\n"
        << "log: {dir: " << (dir_ / "run").string() << ", progress: none}\n";
    return {"train", config};
  }

  fs::path dir_;
  pid_t pid_ = -1;
};

TEST_F(CliProcessTest, SigintFinishesTheStepCheckpointsAndExits130) {
  Start(LongRun());
  ASSERT_TRUE(WaitFor([&] { return MetricsRows() >= 4; })) << Text("stderr");
  ASSERT_EQ(::kill(pid_, SIGINT), 0);
  const int status = Wait();
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 130) << Text("stderr");
  // The checkpoint is of the step reached (not the last cadence one), and
  // every logged step is in it.
  const CheckpointState state = LoadCheckpoint((dir_ / "run" / "checkpoint.ckpt").string());
  EXPECT_EQ(state.step, MetricsRows());
  EXPECT_GE(state.step, 4);
  EXPECT_TRUE(fs::exists(dir_ / "run" / "summary.json"));
  const std::string err = Text("stderr");
  EXPECT_NE(err.find("stopped by SIGINT at step " + std::to_string(state.step) + " of 100000"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("Resume with:\n  stillpoint train "), std::string::npos) << err;
  EXPECT_NE(err.find(" --resume"), std::string::npos) << err;

  // The printed command continues the run.
  std::vector<std::string> resume = LongRun();
  resume.push_back("train.steps=" + std::to_string(state.step + 2));
  resume.push_back("--resume");
  EXPECT_EQ(RunToEnd(resume), 0) << Text("stderr");
  EXPECT_EQ(LoadCheckpoint((dir_ / "run" / "checkpoint.ckpt").string()).step, state.step + 2);
}

// With checkpoints off, the stop's checkpoint is the only one.
TEST_F(CliProcessTest, SigtermStopsTheSameWayWithExitCode143) {
  std::vector<std::string> args = LongRun();
  args.push_back("train.checkpoint_every=0");
  Start(args);
  ASSERT_TRUE(WaitFor([&] { return MetricsRows() >= 2; })) << Text("stderr");
  ASSERT_EQ(::kill(pid_, SIGTERM), 0);
  const int status = Wait();
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 143) << Text("stderr");
  EXPECT_EQ(LoadCheckpoint((dir_ / "run" / "checkpoint.ckpt").string()).step, MetricsRows());
  EXPECT_NE(Text("stderr").find("stopped by SIGTERM"), std::string::npos) << Text("stderr");
}

// A second Ctrl-C while the first is being honoured ends the process at
// once; the checkpoint on disk is the last complete one.
TEST_F(CliProcessTest, ASecondSigintStopsAtOnceAndKeepsTheLastCheckpoint) {
  Start(LongRun());
  ASSERT_TRUE(WaitFor([&] { return MetricsRows() >= 4; })) << Text("stderr");
  ASSERT_EQ(::kill(pid_, SIGINT), 0);
  ASSERT_TRUE(
      WaitFor([&] { return Text("stderr").find("SIGINT: finishing") != std::string::npos; }));
  ASSERT_EQ(::kill(pid_, SIGINT), 0);
  const int status = Wait();
  ASSERT_TRUE(WIFSIGNALED(status))
      << "exited with " << WEXITSTATUS(status) << " before the second signal arrived";
  EXPECT_EQ(WTERMSIG(status), SIGINT);
  // Either the last cadence checkpoint or, if the kill came after it, the
  // one of the step reached: complete and loadable in both cases.
  const CheckpointState state = LoadCheckpoint((dir_ / "run" / "checkpoint.ckpt").string());
  EXPECT_GE(state.step, 3);
}

// SIGHUP (the terminal closed) used to kill the run without the stop
// checkpoint and summary that SIGINT and SIGTERM get.
TEST_F(CliProcessTest, SighupStopsAsCtrlCDoesWithExitCode129) {
  std::vector<std::string> args = LongRun();
  args.push_back("train.checkpoint_every=0");
  Start(args);
  ASSERT_TRUE(WaitFor([&] { return MetricsRows() >= 2; })) << Text("stderr");
  ASSERT_EQ(::kill(pid_, SIGHUP), 0);
  const int status = Wait();
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 129) << Text("stderr");
  EXPECT_EQ(LoadCheckpoint((dir_ / "run" / "checkpoint.ckpt").string()).step, MetricsRows());
  EXPECT_TRUE(fs::exists(dir_ / "run" / "summary.json"));
  EXPECT_NE(Text("stderr").find("stopped by SIGHUP"), std::string::npos) << Text("stderr");
  EXPECT_NE(Text("stderr").find(" --resume"), std::string::npos) << Text("stderr");
}

// Item 4 of issue 48: `stillpoint train ... | head -1` killed training at
// the next progress line (exit 141, no message, no checkpoint, no summary).
// Now the closed pipe stops the run after its step as Ctrl-C does, and the
// resume command goes to stderr.
TEST_F(CliProcessTest, StdoutPipedToAReaderThatExitsStopsWithACheckpoint) {
  int pipe_ends[2];
  ASSERT_EQ(::pipe(pipe_ends), 0);
  std::vector<std::string> args = LongRun();
  args.push_back("train.checkpoint_every=0");
  args.push_back("log.progress=lines");
  Start(args, [&] {
    ::dup2(pipe_ends[1], STDOUT_FILENO);
    ::close(pipe_ends[0]);
  });
  ::close(pipe_ends[1]);
  // `head -1`: read the first line, then exit.
  char first = 0;
  ASSERT_EQ(::read(pipe_ends[0], &first, 1), 1);
  ::close(pipe_ends[0]);
  const int status = Wait();
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGPIPE) << Text("stderr");
  const std::string err = Text("stderr");
  EXPECT_NE(err.find("stopped by SIGPIPE"), std::string::npos) << err;
  EXPECT_NE(err.find("Resume with:\n  stillpoint train "), std::string::npos) << err;
  const CheckpointState state = LoadCheckpoint((dir_ / "run" / "checkpoint.ckpt").string());
  EXPECT_GE(state.step, 1);
  EXPECT_EQ(state.step, MetricsRows());
  EXPECT_TRUE(fs::exists(dir_ / "run" / "summary.json"));
}

// `ulimit -f` (SIGXFSZ) used to kill the run mid-save with no message and
// leave checkpoint.ckpt.tmp.PID behind. Now the save fails with the path
// named, exit 1, and the temporary is removed.
TEST_F(CliProcessTest, AFileSizeLimitIsAnErrorNamingTheFileAndLeavesNoTemporary) {
  std::vector<std::string> args = LongRun();
  args.push_back("train.checkpoint_every=1");
  Start(args, [] {
    const struct rlimit limit = {16 << 10, 16 << 10};  // 16 KiB: less than a checkpoint
    ::setrlimit(RLIMIT_FSIZE, &limit);
  });
  const int status = Wait();
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 1) << Text("stderr");
  const std::string err = Text("stderr");
  EXPECT_NE(err.find("SIGXFSZ"), std::string::npos) << err;
  EXPECT_NE(err.find("cannot write '" + (dir_ / "run" / "checkpoint.ckpt").string() + "'"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("File too large"), std::string::npos) << err;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir_ / "run")) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp."), std::string::npos)
        << entry.path();
  }
}

// Item 5 of issue 48: a failed write to stdout (/dev/full, a full disk)
// exited 0 with truncated output.
TEST_F(CliProcessTest, AFailedWriteToStdoutIsExitOneNamingIt) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  const auto to_full = [] {
    const int full = ::open("/dev/full", O_WRONLY);
    ::dup2(full, STDOUT_FILENO);
  };
  EXPECT_EQ(RunToEnd({"config", "--json-schema"}, to_full), 1);
  EXPECT_NE(Text("stderr").find("writing to standard output failed: No space left on device"),
            std::string::npos)
      << Text("stderr");
  EXPECT_EQ(RunToEnd({"config", "--keys"}, to_full), 1);
  EXPECT_EQ(RunToEnd({"config", "--keys"}), 0);
  EXPECT_NE(Text("stdout").find("train.optimizer.lr"), std::string::npos);
}

// Item 11 of issue 48: under `ulimit -v 300000` the linked OpenBLAS (an
// OpenMP build, loaded before main through Ceres' LAPACK as well) retried a
// buffer allocation per core for ever. main.cc limits it to one thread
// before any library initialises (its preinit function).
TEST_F(CliProcessTest, StartsUnderAnAddressSpaceLimit) {
  Start({"--version"}, [] {
    const struct rlimit limit = {300000 << 10, 300000 << 10};  // ulimit -v 300000
    ::setrlimit(RLIMIT_AS, &limit);
  });
  ASSERT_TRUE(WaitFor([&] {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) != pid_) return false;
    pid_ = -1;
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    return true;
  })) << "stillpoint --version did not return under ulimit -v 300000";
  EXPECT_NE(Text("stdout").find("stillpoint "), std::string::npos) << Text("stderr");
}

TEST_F(CliProcessTest, AMisspeltCommandIsNamed) {
  EXPECT_EQ(RunToEnd({"trian", "x.yaml"}), 2);
  EXPECT_NE(Text("stderr").find("unknown command 'trian' (did you mean 'train'?)"),
            std::string::npos)
      << Text("stderr");
}

// A regulariser or stability key on a model without a fixed point of its own
// changes nothing: refused before any work, naming the key, exit 2.
TEST_F(CliProcessTest, ARegularizerOnAModelWithoutAFixedPointIsRefused) {
  EXPECT_EQ(RunToEnd({"train", std::string(STILLPOINT_SOURCE_DIR) + "/examples/configs/quickstart.yaml",
                      "model.kind=explicit", "model.regularization.jacobian_ramp_steps=50",
                      "log.dir=" + (dir_ / "refused").string()}),
            2);
  EXPECT_NE(Text("stderr").find("model.regularization.jacobian_ramp_steps needs model.kind "
                                "implicit or energy"),
            std::string::npos)
      << Text("stderr");
  EXPECT_FALSE(fs::exists(dir_ / "refused"));
}

}  // namespace
}  // namespace stillpoint::cli_process_test
