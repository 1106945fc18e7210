// Runs that never lose work: the run directory's lock, the refusal to
// overwrite a finished run, the default directory that moves on to
// runs/<name>-N, and what --resume checks and restores.
#include "training/run_directory.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "framework/serialize.h"
#include "tests/scratch_path.h"
#include "training/checkpoint.h"
#include "training/cli/cli_commands.h"
#include "training/report/compare.h"
#include "training/config_schema.h"
#include "training/metrics.h"
#include "training/signals.h"
#include "training/trainer.h"

namespace stillpoint::run_directory_test {
namespace {

namespace fs = std::filesystem;

std::string ReadAll(const fs::path& path) { return ReadFileBytes(path.string()); }

class RunDirectoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing_support::ScratchPathForThisTest("rundir");
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!old_cwd_.empty()) fs::current_path(old_cwd_);
    fs::remove_all(dir_);
  }

  // A tiny reverse task; log.dir only when `with_dir`.
  std::string WriteConfig(const std::string& name,
                          bool with_dir = true,
                          const std::string& extra = "") {
    const std::string path = (dir_ / (name + ".yaml")).string();
    std::ofstream out(path);
    out << "seed: 3\nthreads: 1\n"
        << "task: {kind: reverse, length: 5, vocab_size: 5, train_examples: 64, "
           "test_examples: 32}\n"
        << "model:\n  kind: explicit\n  dim: 8\n  heads: 2\n  hidden: 16\n  max_length: 8\n"
        << "  num_layers: 2\n"
        << "train:\n  steps: 12\n  batch_size: 8\n  eval_every: 6\n  log_every: 1\n"
        << "  checkpoint_every: 4\n  optimizer: {lr: 0.01}\n  schedule: {warmup_steps: 2}\n";
    if (with_dir) {
      out << "log: {dir: " << RunPath(name).string() << ", progress: none}\n";
    } else {
      out << "log: {progress: none}\n";
    }
    out << extra;
    return path;
  }
  fs::path RunPath(const std::string& name) const { return dir_ / ("run_" + name); }

  int Train(const std::string& config,
            std::vector<std::string> overrides = {},
            bool resume = false,
            bool overwrite = false,
            int64_t stop_after = 0,
            bool force = false) {
    TrainArgs args;
    args.config_path = config;
    args.overrides = std::move(overrides);
    args.resume = resume;
    args.overwrite = overwrite;
    args.force = force;
    args.stop_after_steps = stop_after;
    out_.str("");
    err_.str("");
    return RunTrain(args, out_, err_);
  }

  void EnterScratchDirectory() {
    old_cwd_ = fs::current_path();
    fs::current_path(dir_);
  }

  fs::path dir_;
  fs::path old_cwd_;
  std::ostringstream out_, err_;
};

TEST_F(RunDirectoryTest, ASecondWriterIsRefusedNamingTheHolder) {
  const std::string run = (dir_ / "locked").string();
  {
    const RunDirectoryLock first(run);
    try {
      const RunDirectoryLock second(run);
      FAIL() << "a second lock on one directory was granted";
    } catch (const ConfigError& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("is in use by pid " + std::to_string(::getpid())), std::string::npos)
          << message;
      EXPECT_NE(message.find(run), std::string::npos) << message;
    }
    // A trainer pointed at the locked directory is refused with exit code 2.
    EXPECT_EQ(Train(WriteConfig("locked_train", true), {"log.dir=" + run}), 2);
    EXPECT_NE(err_.str().find("is in use by pid"), std::string::npos) << err_.str();
    EXPECT_FALSE(fs::exists(fs::path(run) / "config.yaml"));
  }
  // Released with its holder.
  EXPECT_NO_THROW(RunDirectoryLock again(run));
  EXPECT_TRUE(RunDirectoryIsEmpty(run));  // only the lock file
}

TEST_F(RunDirectoryTest, APlainRunIntoAFinishedRunIsRefusedUnlessOverwrite) {
  const std::string config = WriteConfig("twice");
  ASSERT_EQ(Train(config), 0) << err_.str();
  const std::string checkpoint = ReadAll(RunPath("twice") / "checkpoint.ckpt");
  const std::string metrics = ReadAll(RunPath("twice") / "metrics.csv");

  EXPECT_EQ(Train(config, {"seed=4"}), 2);
  EXPECT_NE(err_.str().find("already holds a run"), std::string::npos) << err_.str();
  EXPECT_NE(err_.str().find("--overwrite"), std::string::npos) << err_.str();
  EXPECT_EQ(ReadAll(RunPath("twice") / "checkpoint.ckpt"), checkpoint);
  EXPECT_EQ(ReadAll(RunPath("twice") / "metrics.csv"), metrics);

  ASSERT_EQ(Train(config, {"seed=4"}, false, /*overwrite=*/true), 0) << err_.str();
  EXPECT_NE(ReadAll(RunPath("twice") / "checkpoint.ckpt"), checkpoint);
  EXPECT_EQ(LoadCheckpoint((RunPath("twice") / "checkpoint.ckpt").string()).step, 12);
}

// With no log.dir, repeating the command keeps the first result and writes
// the second beside it.
TEST_F(RunDirectoryTest, WithoutLogDirARepeatedRunGoesToTheNextFreeDirectory) {
  const std::string config = WriteConfig("again", false);
  EnterScratchDirectory();
  ASSERT_EQ(Train(config), 0) << err_.str();
  EXPECT_NE(out_.str().find("run directory runs/again\n"), std::string::npos) << out_.str();
  const std::string first = ReadAll(dir_ / "runs/again/checkpoint.ckpt");
  ASSERT_EQ(Train(config, {"seed=5"}), 0) << err_.str();
  EXPECT_NE(out_.str().find("run directory runs/again-2\n"), std::string::npos) << out_.str();
  EXPECT_EQ(ReadAll(dir_ / "runs/again/checkpoint.ckpt"), first);
  EXPECT_TRUE(fs::exists(dir_ / "runs/again-2/checkpoint.ckpt"));
  // The chosen directory is recorded in the resolved config.
  const Config resolved =
      Config::FromFile(StillpointSchema(), (dir_ / "runs/again-2/config.yaml").string());
  EXPECT_EQ(resolved.GetString("log.dir"), "runs/again-2");
}

TEST_F(RunDirectoryTest, CompareTwiceKeepsTheFirstReport) {
  const std::string config = WriteConfig("cmp", false, "compare: {variants: [explicit, tied]}\n");
  EnterScratchDirectory();
  CompareArgs args;
  args.config_path = config;
  args.overrides = {"train.steps=4"};
  std::ostringstream out, err;
  ASSERT_EQ(RunCompare(args, out, err), 0) << err.str();
  const std::string report = ReadAll(dir_ / "runs/cmp/report.md");
  std::ostringstream out2;
  ASSERT_EQ(RunCompare(args, out2, err), 0) << err.str();
  EXPECT_NE(out2.str().find("comparison in runs/cmp-2"), std::string::npos) << out2.str();
  EXPECT_TRUE(fs::exists(dir_ / "runs/cmp-2/report.md"));
  EXPECT_EQ(ReadAll(dir_ / "runs/cmp/report.md"), report);

  // An explicit log.dir that holds a comparison: refused before any training.
  args.overrides = {"train.steps=4", "log.dir=runs/cmp"};
  std::ostringstream err3;
  EXPECT_EQ(RunCompare(args, out, err3), 2);
  EXPECT_NE(err3.str().find("already holds a run"), std::string::npos) << err3.str();
  args.overwrite = true;
  EXPECT_EQ(RunCompare(args, out, err3), 0) << err3.str();
}

TEST_F(RunDirectoryTest, CompareChecksEveryVariantBeforeTrainingTheFirst) {
  const std::string config = WriteConfig("cmpbad", true);
  CompareArgs args;
  args.config_path = config;
  // The correction loss does not apply to the energy model (given to that
  // variant alone: compare sets a base key back for the variants it does not
  // fit): only the second variant fails, and it used to fail after the first
  // had trained.
  args.overrides = {"compare.variants=[implicit, energy]",
                    "compare.overrides=[energy:model.regularization.correction_weight=0.1]"};
  std::ostringstream out, err;
  EXPECT_EQ(RunCompare(args, out, err), 2);
  EXPECT_NE(err.str().find("variant 'energy'"), std::string::npos) << err.str();
  EXPECT_FALSE(fs::exists(RunPath("cmpbad") / "implicit"));

  args.overrides = {"compare.variants=[explicit, tied, explicit]"};
  std::ostringstream err2;
  EXPECT_EQ(RunCompare(args, out, err2), 2);
  EXPECT_NE(err2.str().find("variant 'explicit' appears twice"), std::string::npos) << err2.str();
}

// A crash after step 8 with the last checkpoint at step 4: the resumed run
// writes steps 5-8 again, and the rows the crashed run wrote for them must
// not stay beside the new ones.
TEST_F(RunDirectoryTest, ResumeDropsMetricsRowsAfterTheCheckpoint) {
  const std::string config = WriteConfig("rows");
  const fs::path checkpoint = RunPath("rows") / "checkpoint.ckpt";
  ASSERT_EQ(Train(config, {}, false, false, /*stop_after=*/4), 0) << err_.str();
  const std::string at_step_4 = ReadAll(checkpoint);
  ASSERT_EQ(Train(config, {}, true, false, /*stop_after=*/4), 0) << err_.str();
  WriteFileAtomically(checkpoint.string(), at_step_4);  // the crash: step 8 never checkpointed
  // A row cut short by the crash.
  std::ofstream(RunPath("rows") / "metrics.csv", std::ios::app) << "9,0.01,2.";
  ASSERT_EQ(Train(config, {}, true), 0) << err_.str();
  for (const auto& metrics : {ReadMetricsCsv((RunPath("rows") / "metrics.csv").string()),
                              ReadMetricsJsonl((RunPath("rows") / "metrics.jsonl").string())}) {
    const std::vector<double>& steps = metrics.at("step");
    ASSERT_EQ(steps.size(), 12u);
    for (std::size_t i = 0; i < steps.size(); ++i) EXPECT_EQ(steps[i], double(i + 1));
  }
}

TEST_F(RunDirectoryTest, ResumeOfAFinishedRunChangesNothing) {
  const std::string config = WriteConfig("done");
  ASSERT_EQ(Train(config), 0) << err_.str();
  const std::string summary = ReadAll(RunPath("done") / "summary.json");
  const std::string checkpoint = ReadAll(RunPath("done") / "checkpoint.ckpt");
  ASSERT_EQ(Train(config, {}, /*resume=*/true), 0) << err_.str();
  EXPECT_NE(out_.str().find("is complete (step 12 of train.steps 12): nothing to train"),
            std::string::npos)
      << out_.str();
  EXPECT_EQ(ReadAll(RunPath("done") / "summary.json"), summary);
  EXPECT_EQ(ReadAll(RunPath("done") / "checkpoint.ckpt"), checkpoint);
  // More steps continue it.
  ASSERT_EQ(Train(config, {"train.steps=14"}, true), 0) << err_.str();
  EXPECT_EQ(LoadCheckpoint((RunPath("done") / "checkpoint.ckpt").string()).step, 14);
}

TEST_F(RunDirectoryTest, ResumeRefusesAnotherConfigUnlessForced) {
  const std::string config = WriteConfig("other");
  ASSERT_EQ(Train(config, {}, false, false, 4), 0) << err_.str();
  const std::string checkpoint = ReadAll(RunPath("other") / "checkpoint.ckpt");
  EXPECT_EQ(Train(config, {"seed=4"}, true), 2);
  EXPECT_NE(err_.str().find("seed: 3 -> 4"), std::string::npos) << err_.str();
  EXPECT_EQ(Train(config, {"model.kind=tied"}, true), 2);
  EXPECT_NE(err_.str().find("model.kind: explicit -> tied"), std::string::npos) << err_.str();
  EXPECT_EQ(ReadAll(RunPath("other") / "checkpoint.ckpt"), checkpoint);
  // The step budget and the cadence of evaluation and logging may change.
  ASSERT_EQ(Train(config, {"train.eval_every=3", "train.log_every=2"}, true, false, 2), 0)
      << err_.str();
  ASSERT_EQ(Train(config, {"seed=4"}, true, false, 2, /*force=*/true), 0) << err_.str();
  EXPECT_NE(out_.str().find("warning: --force: seed: 3 -> 4"), std::string::npos) << out_.str();
  EXPECT_EQ(LoadCheckpoint((RunPath("other") / "checkpoint.ckpt").string()).step, 8);
}

// --force past a change of model size: the parameters cannot load, which
// is bad input (exit 2), not a runtime failure.
TEST_F(RunDirectoryTest, ForcedResumeIntoAnotherModelSizeIsBadInput) {
  const std::string config = WriteConfig("resize");
  ASSERT_EQ(Train(config, {}, false, false, 4), 0) << err_.str();
  EXPECT_EQ(Train(config, {"model.dim=12"}, true, false, 0, /*force=*/true), 2);
  EXPECT_NE(err_.str().find("checkpoint.ckpt: does not fit this model"), std::string::npos)
      << err_.str();
  EXPECT_EQ(LoadCheckpoint((RunPath("resize") / "checkpoint.ckpt").string()).step, 4);
  // The run's config.yaml still describes its checkpoint.
  EXPECT_EQ(Config::FromFile(StillpointSchema(), (RunPath("resize") / "config.yaml").string())
                .GetInt("model.dim"),
            8);
}

// eval exits 2 on a corrupt checkpoint; train --resume used to exit 1.
TEST_F(RunDirectoryTest, CorruptCheckpointUnderResumeIsBadInput) {
  const std::string config = WriteConfig("corrupt");
  ASSERT_EQ(Train(config, {}, false, false, 4), 0) << err_.str();
  const fs::path checkpoint = RunPath("corrupt") / "checkpoint.ckpt";
  std::string bytes = ReadAll(checkpoint);
  bytes[bytes.size() / 2] ^= 0x40;
  WriteFileAtomically(checkpoint.string(), bytes);
  EXPECT_EQ(Train(config, {}, true), 2);
  EXPECT_NE(err_.str().find("checksum mismatch"), std::string::npos) << err_.str();
  EXPECT_EQ(ReadAll(checkpoint), bytes);  // left for the user to inspect
}

// model.solver.backward.warm_start keeps the previous adjoint solution: with
// it in the checkpoint, a run split by a resume is bitwise the straight run,
// with one shard and with two (each replica keeps its own).
TEST_F(RunDirectoryTest, ResumeIsBitwiseWithAdjointWarmStarts) {
  for (const int shards : {1, 2}) {
    SCOPED_TRACE(shards);
    const std::string config = WriteConfig("warm" + std::to_string(shards));
    const std::vector<std::string> common = {"model.kind=implicit",
                                             "model.solver.backward.warm_start=true",
                                             "model.solver.backward.max_iterations=3", "threads=2",
                                             "train.shards=" + std::to_string(shards)};
    auto run = [&](const std::string& name, const std::vector<int64_t>& chunks) {
      std::vector<std::string> overrides = common;
      overrides.push_back("log.dir=" + (dir_ / name).string());
      for (std::size_t k = 0; k < chunks.size(); ++k) {
        EXPECT_EQ(Train(config, overrides, k > 0, false, chunks[k]), 0) << err_.str();
      }
      return LoadCheckpoint((dir_ / name / "checkpoint.ckpt").string());
    };
    const std::string suffix = std::to_string(shards);
    const CheckpointState straight = run("straight" + suffix, {12});
    const CheckpointState split = run("split" + suffix, {5, 7});
    ASSERT_EQ(split.step, 12);
    EXPECT_EQ(split.solver_state.size(), static_cast<std::size_t>(shards));
    ASSERT_EQ(straight.model.size(), split.model.size());
    for (std::size_t i = 0; i < straight.model.size(); ++i) {
      EXPECT_EQ(straight.model[i].second.ToVector(), split.model[i].second.ToVector())
          << straight.model[i].first;
    }
  }
}

// Dropout draws its masks from each layer's own stream; with the streams in
// the checkpoint, a run split by a resume is bitwise the straight run, for
// the explicit stack and the implicit model (whose masks are frozen per
// solve), with one shard and with two. Without the streams (the checkpoint
// stripped of them, as files written before they were kept) the split run
// differs, which is what makes this test able to fail.
TEST_F(RunDirectoryTest, ResumeIsBitwiseWithDropout) {
  for (const std::string kind : {"explicit", "implicit"}) {
    for (const int shards : {1, 2}) {
      SCOPED_TRACE(kind + " " + std::to_string(shards));
      const std::string tag = kind + std::to_string(shards);
      const std::string config = WriteConfig("drop" + tag);
      const std::vector<std::string> common = {"model.kind=" + kind, "model.dropout=0.3",
                                               "threads=2",
                                               "train.shards=" + std::to_string(shards)};
      auto run = [&](const std::string& name, const std::vector<int64_t>& chunks,
                     bool strip_streams) {
        std::vector<std::string> overrides = common;
        overrides.push_back("log.dir=" + (dir_ / name).string());
        const std::string path = (dir_ / name / "checkpoint.ckpt").string();
        for (std::size_t k = 0; k < chunks.size(); ++k) {
          if (k > 0 && strip_streams) {
            CheckpointState state = LoadCheckpoint(path);
            EXPECT_FALSE(state.random_streams.empty());
            state.random_streams.clear();
            SaveCheckpoint(path, state);
          }
          EXPECT_EQ(Train(config, overrides, k > 0, false, chunks[k]), 0) << err_.str();
        }
        return LoadCheckpoint(path);
      };
      const CheckpointState straight = run("straight" + tag, {12}, false);
      const CheckpointState split = run("split" + tag, {5, 7}, false);
      const CheckpointState stripped = run("stripped" + tag, {5, 7}, true);
      EXPECT_NE(out_.str().find("the checkpoint predates the dropout streams"), std::string::npos)
          << out_.str();
      ASSERT_EQ(split.step, 12);
      ASSERT_EQ(straight.model.size(), split.model.size());
      bool stripped_differs = false;
      for (std::size_t i = 0; i < straight.model.size(); ++i) {
        EXPECT_EQ(straight.model[i].second.ToVector(), split.model[i].second.ToVector())
            << straight.model[i].first;
        stripped_differs = stripped_differs || straight.model[i].second.ToVector() !=
                                                   stripped.model[i].second.ToVector();
      }
      EXPECT_TRUE(stripped_differs);
    }
  }
}

// A stop request (as SIGINT's handler records it) ends a comparison after
// the current variant's step: no further variant trains, no report is
// written, and the variant's run directory holds its checkpoint.
TEST_F(RunDirectoryTest, AStopRequestEndsACompareWithoutAReport) {
  const std::string config =
      WriteConfig("cmpstop", true, "compare: {variants: [explicit, tied]}\n");
  SetStopRequested(SIGINT);
  const CompareReport report = RunComparison(
      Config::FromFile(StillpointSchema(), config), config, /*progress=*/nullptr);
  SetStopRequested(0);
  EXPECT_EQ(report.stop_signal, SIGINT);
  ASSERT_EQ(report.variants.size(), 1u);
  EXPECT_EQ(report.variants[0].name, "explicit");
  EXPECT_NE(report.variants[0].train.stop_reason.find("stopped by SIGINT at step 0 of 12"),
            std::string::npos)
      << report.variants[0].train.stop_reason;
  EXPECT_TRUE(fs::exists(RunPath("cmpstop") / "explicit" / "checkpoint.ckpt"));
  EXPECT_FALSE(fs::exists(RunPath("cmpstop") / "tied"));
  EXPECT_FALSE(fs::exists(RunPath("cmpstop") / "report.md"));
}

TEST_F(RunDirectoryTest, NegativeStopAfterAndConflictingFlagsAreBadInput) {
  const std::string config = WriteConfig("flags");
  EXPECT_EQ(Train(config, {}, false, false, -1), 2);
  EXPECT_NE(err_.str().find("--stop-after must be >= 0"), std::string::npos) << err_.str();
  EXPECT_EQ(Train(config, {}, true, true), 2);
  EXPECT_NE(err_.str().find("exclude each other"), std::string::npos) << err_.str();
  EXPECT_FALSE(fs::exists(RunPath("flags")));
}

}  // namespace
}  // namespace stillpoint::run_directory_test
