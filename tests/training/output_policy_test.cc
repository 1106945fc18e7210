// The output policy (training/output_policy.h) through the commands that
// write: train and compare into log.dir, export, report, retrieve; and the
// other round-three cases of issue 48 that a run directory shows (resume by
// value, report of one run given twice, a run that did not train).
#include "training/output_policy.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "framework/serialize.h"
#include "tests/scratch_path.h"
#include "training/checkpoint.h"
#include "training/cli/cli_commands.h"
#include "training/config/config.h"
#include "training/run_directory.h"

namespace stillpoint::output_policy_test {
namespace {

namespace fs = std::filesystem;

class OutputPolicyTest : public testing_support::ScratchDirTest {
 protected:
  OutputPolicyTest() : ScratchDirTest("output") {}

  // A tiny reverse task trained for 4 steps; `lr` as written in the file.
  std::string WriteConfig(const fs::path& path, const std::string& log_dir,
                          const std::string& lr = "0.01") {
    fs::create_directories(path.parent_path());
    std::ofstream out(path);
    out << "# my notes: keep this comment\nseed: 3\nthreads: 1\n"
        << "task: {kind: reverse, length: 5, vocab_size: 5, train_examples: 32, "
           "test_examples: 16}\n"
        << "model: {kind: explicit, dim: 8, heads: 2, hidden: 16, max_length: 8, "
           "num_layers: 1}\n"
        << "train:\n  steps: 4\n  batch_size: 8\n  eval_every: 0\n  log_every: 1\n"
        << "  checkpoint_every: 2\n  optimizer: {lr: " << lr << "}\n"
        << "log: {dir: " << log_dir << ", progress: none, plots: false}\n";
    return path.string();
  }

  int Train(const std::string& config, std::vector<std::string> overrides = {},
            bool resume = false, bool overwrite = false, int64_t stop_after = 0) {
    TrainArgs args;
    args.config_path = config;
    args.overrides = std::move(overrides);
    args.resume = resume;
    args.overwrite = overwrite;
    args.stop_after_steps = stop_after;
    return Run([&] { return RunTrain(args, out_, err_); });
  }
  int Export(const std::string& run, const std::string& out, bool overwrite = false) {
    ExportArgs args;
    args.run = run;
    args.format = "npz";
    args.out = out;
    args.overwrite = overwrite;
    return Run([&] { return RunExport(args, out_, err_); });
  }
  int Report(const std::vector<std::string>& runs, const std::string& out,
             bool overwrite = false) {
    ReportArgs args;
    args.runs = runs;
    args.out_dir = out;
    args.overwrite = overwrite;
    return Run([&] { return RunReport(args, out_, err_); });
  }
  int Run(const std::function<int()>& command) {
    out_.str("");
    err_.str("");
    return command();
  }
  // A finished run in dir_/run.
  std::string FinishedRun() {
    const std::string run = (dir_ / "run").string();
    EXPECT_EQ(Train(WriteConfig(dir_ / "run.yaml", run)), 0) << err_.str();
    return run;
  }

  std::ostringstream out_, err_;
};

// Item 3: `train exp/config.yaml log.dir=exp`, where exp/ holds only the
// user's config, was refused as "already holds a run", and --overwrite then
// replaced the config (comments and all) with the resolved one.
TEST_F(OutputPolicyTest, TheConfigBeingTrainedIsNeverReplacedByItsRun) {
  const std::string exp = (dir_ / "exp").string();
  const std::string config = WriteConfig(dir_ / "exp" / "config.yaml", exp);
  const std::string text = ReadFileBytes(config);
  for (const bool overwrite : {false, true}) {
    EXPECT_EQ(Train(config, {}, false, overwrite), 2);
    EXPECT_EQ(err_.str().find("already holds a run"), std::string::npos) << err_.str();
    EXPECT_NE(err_.str().find("holds the config being trained, '" + exp + "/config.yaml'"),
              std::string::npos)
        << err_.str();
    EXPECT_EQ(ReadFileBytes(config), text);
  }
  // Beside it, in a directory of its own, the run trains.
  EXPECT_EQ(Train(config, {"log.dir=" + exp + "/run"}), 0) << err_.str();
  EXPECT_EQ(ReadFileBytes(config), text);
}

// The sibling for compare: it writes its report and plots at its root and
// each variant's run below it, never a config.yaml at the root, so a folder
// holding only the user's config is free for it, and --overwrite leaves that
// config alone.
TEST_F(OutputPolicyTest, CompareRunsBesideTheUsersConfigAndNeverReplacesIt) {
  const std::string exp = (dir_ / "exp").string();
  const std::string config = WriteConfig(dir_ / "exp" / "config.yaml", exp);
  {
    std::ofstream(config, std::ios::app) << "compare: {kinds: [explicit, tied]}\n";
  }
  const std::string text = ReadFileBytes(config);
  const auto compare = [&](bool overwrite) {
    CompareArgs args;
    args.config_path = config;
    args.overwrite = overwrite;
    return Run([&] { return RunCompare(args, out_, err_); });
  };
  ASSERT_EQ(compare(false), 0) << err_.str();
  EXPECT_EQ(ReadFileBytes(config), text);
  EXPECT_TRUE(fs::exists(dir_ / "exp" / "report.md"));
  EXPECT_TRUE(fs::exists(dir_ / "exp" / "explicit" / "config.yaml"));
  // Again: now a comparison is there, refused without --overwrite ...
  EXPECT_EQ(compare(false), 2);
  EXPECT_NE(err_.str().find("already holds a run"), std::string::npos) << err_.str();
  // ... and replaced with it, the user's config kept byte for byte.
  ASSERT_EQ(compare(true), 0) << err_.str();
  EXPECT_EQ(ReadFileBytes(config), text);
  EXPECT_TRUE(fs::exists(dir_ / "exp" / "report.md"));
}

// A folder of unrelated files is not a run; files named as a run's are the
// user's and are replaced only with --overwrite.
TEST_F(OutputPolicyTest, AFolderOfUnrelatedFilesIsNotARun) {
  const fs::path folder = dir_ / "folder";
  fs::create_directories(folder);
  std::ofstream(folder / "notes.txt") << "mine\n";
  const std::string config = WriteConfig(dir_ / "a.yaml", folder.string());
  ASSERT_EQ(Train(config), 0) << err_.str();
  EXPECT_EQ(ReadFileBytes((folder / "notes.txt").string()), "mine\n");
  EXPECT_TRUE(fs::exists(folder / "checkpoint.ckpt"));

  const fs::path other = dir_ / "other";
  fs::create_directories(other);
  std::ofstream(other / "loss.svg") << "my figure\n";
  const std::string second = WriteConfig(dir_ / "b.yaml", other.string());
  EXPECT_EQ(Train(second, {"log.plots=true"}), 2);
  EXPECT_NE(err_.str().find("holds '" + (other / "loss.svg").string() + "', which is not a run's"),
            std::string::npos)
      << err_.str();
  EXPECT_EQ(ReadFileBytes((other / "loss.svg").string()), "my figure\n");
  EXPECT_EQ(Train(second, {"log.plots=true"}, false, /*overwrite=*/true), 0) << err_.str();
  EXPECT_NE(ReadFileBytes((other / "loss.svg").string()), "my figure\n");
}

// Items 6 and 7 and the weak export case: export replaced the run's own
// checkpoint, renamed over device nodes and FIFOs, and replaced existing
// files and symlinks silently.
TEST_F(OutputPolicyTest, ExportRefusesRunFilesDevicesFifosAndExistingFiles) {
  const std::string run = FinishedRun();
  const std::string checkpoint = ReadFileBytes(run + "/checkpoint.ckpt");
  for (const std::string& out : {run + "/checkpoint.ckpt", run + "/../run/summary.json"}) {
    for (const bool overwrite : {false, true}) {
      EXPECT_EQ(Export(run, out, overwrite), 2) << out;
      EXPECT_NE(err_.str().find("is a file of the run in"), std::string::npos) << err_.str();
    }
  }
  EXPECT_EQ(ReadFileBytes(run + "/checkpoint.ckpt"), checkpoint);

  const std::string fifo = (dir_ / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  EXPECT_EQ(Export(run, fifo, true), 2);
  EXPECT_NE(err_.str().find("is a device, FIFO or socket"), std::string::npos) << err_.str();
  EXPECT_TRUE(fs::is_fifo(fifo));
  EXPECT_EQ(Export(run, "/dev/null", true), 2);
  EXPECT_TRUE(fs::is_character_file("/dev/null"));

  // An existing file, and a symlink: only with --overwrite, and then the
  // link is replaced, never its target.
  const std::string file = (dir_ / "weights.npz").string();
  std::ofstream(file) << "old";
  EXPECT_EQ(Export(run, file), 2);
  EXPECT_NE(err_.str().find("exists; --overwrite replaces it"), std::string::npos) << err_.str();
  EXPECT_EQ(ReadFileBytes(file), "old");
  const std::string target = (dir_ / "target.txt").string();
  std::ofstream(target) << "target";
  const std::string link = (dir_ / "link.npz").string();
  fs::create_symlink(target, link);
  EXPECT_EQ(Export(run, link), 2);
  EXPECT_NE(err_.str().find("a symlink"), std::string::npos) << err_.str();
  EXPECT_EQ(Export(run, link, true), 0) << err_.str();
  EXPECT_FALSE(fs::is_symlink(link));
  EXPECT_EQ(ReadFileBytes(target), "target");
  EXPECT_EQ(Export(run, file, true), 0) << err_.str();
  EXPECT_NE(ReadFileBytes(file), "old");
}

// A FIFO (or file) named as log.dir: exit 1 "cannot create the run
// directory" before; bad input now, and the FIFO is untouched.
TEST_F(OutputPolicyTest, ALogDirThatIsNotADirectoryIsBadInput) {
  const std::string fifo = (dir_ / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  EXPECT_EQ(Train(WriteConfig(dir_ / "f.yaml", fifo)), 2);
  EXPECT_NE(err_.str().find("log.dir '" + fifo + "' is not a directory"), std::string::npos)
      << err_.str();
  EXPECT_TRUE(fs::is_fifo(fifo));
}

// A log.dir that is a symlink to a directory is that directory: its run is
// found (and kept) as any other.
TEST_F(OutputPolicyTest, ASymlinkedLogDirIsTheDirectoryItNames) {
  fs::create_directories(dir_ / "real");
  const std::string link = (dir_ / "link").string();
  fs::create_directory_symlink(dir_ / "real", link);
  const std::string config = WriteConfig(dir_ / "s.yaml", link);
  ASSERT_EQ(Train(config), 0) << err_.str();
  EXPECT_TRUE(fs::exists(dir_ / "real" / "checkpoint.ckpt"));
  EXPECT_EQ(Train(config), 2);
  EXPECT_NE(err_.str().find("already holds a run"), std::string::npos) << err_.str();
}

// The atomic writer itself never renames over a device, FIFO or directory,
// whoever calls it.
TEST_F(OutputPolicyTest, TheAtomicWriterRefusesSpecialFiles) {
  const std::string fifo = (dir_ / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  EXPECT_THROW(WriteFileAtomically(fifo, "x"), Error);
  EXPECT_TRUE(fs::is_fifo(fifo));
  EXPECT_THROW(WriteFileAtomically(dir_.string(), "x"), Error);
  EXPECT_FALSE(fs::exists(TemporaryPathFor(fifo)));
}

// Item 8 and the weak report cases: one run given twice pooled as two
// seeds; report --out RUN overwrote the run's figures; an existing report
// directory was overwritten silently.
TEST_F(OutputPolicyTest, ReportRefusesARunTwiceARunDirectoryAndAnOccupiedFolder) {
  const std::string run = FinishedRun();
  EXPECT_EQ(Report({run, run}, (dir_ / "r1").string()), 2);
  EXPECT_NE(err_.str().find("are the same run, given twice"), std::string::npos) << err_.str();
  EXPECT_EQ(Report({run, run + "/"}, (dir_ / "r1").string()), 2);
  EXPECT_FALSE(fs::exists(dir_ / "r1"));

  for (const bool overwrite : {false, true}) {
    EXPECT_EQ(Report({run}, run, overwrite), 2);
    EXPECT_NE(err_.str().find("is a run directory"), std::string::npos) << err_.str();
  }
  ASSERT_EQ(Report({run}, (dir_ / "r2").string()), 0) << err_.str();
  const std::string first = ReadFileBytes((dir_ / "r2" / "report.md").string());
  EXPECT_EQ(Report({run}, (dir_ / "r2").string()), 2);
  EXPECT_NE(err_.str().find("already holds files; --overwrite"), std::string::npos) << err_.str();
  EXPECT_EQ(Report({run}, (dir_ / "r2").string(), true), 0) << err_.str();
}

// The weak retrieve case: an output folder was overwritten silently.
TEST_F(OutputPolicyTest, RetrieveRefusesAnOccupiedFolderWithoutOverwrite) {
  std::ofstream(dir_ / "p.csv") << "1,0\n0,1\n";
  std::ofstream(dir_ / "q.csv") << "1,0\n";
  RetrieveArgs args;
  args.patterns_path = (dir_ / "p.csv").string();
  args.queries_path = (dir_ / "q.csv").string();
  args.out_dir = (dir_ / "out").string();
  ASSERT_EQ(Run([&] { return RunRetrieve(args, out_, err_); }), 0) << err_.str();
  EXPECT_EQ(Run([&] { return RunRetrieve(args, out_, err_); }), 2);
  EXPECT_NE(err_.str().find("already holds files"), std::string::npos) << err_.str();
  args.overwrite = true;
  EXPECT_EQ(Run([&] { return RunRetrieve(args, out_, err_); }), 0) << err_.str();
  // Item 1: an endless patterns file is refused at the cap, naming the flag.
  args.patterns_path = "/dev/zero";
  args.max_file_mib = 1;
  EXPECT_EQ(Run([&] { return RunRetrieve(args, out_, err_); }), 2);
  EXPECT_NE(err_.str().find("'/dev/zero': more than 1 MiB (the cap of --max-file-mib"),
            std::string::npos)
      << err_.str();
}

// Item 1 through train: task.path=/dev/zero ended in std::bad_alloc.
TEST_F(OutputPolicyTest, AnEndlessDataFileIsRefusedNamingTheKey) {
  const std::string config = WriteConfig(dir_ / "csv.yaml", (dir_ / "csv").string());
  // The base config's example counts back at their defaults: a csv task
  // reads no such keys (training/data/task.h).
  EXPECT_EQ(Train(config, {"task.kind=csv", "task.path=/dev/zero", "task.test_path=/dev/zero",
                           "task.num_classes=5", "task.max_file_mib=2",
                           "task.train_examples=4096", "task.test_examples=512"}),
            2);
  EXPECT_NE(err_.str().find("'/dev/zero': more than 2 MiB (the cap of task.max_file_mib"),
            std::string::npos)
      << err_.str();
}

// The weak resume case: `lr: 1.0e-3` against `0.001` was "another config".
TEST_F(OutputPolicyTest, ResumeComparesValuesNotTheirText) {
  const std::string run = (dir_ / "lr").string();
  const std::string config = WriteConfig(dir_ / "lr.yaml", run, "1.0e-3");
  ASSERT_EQ(Train(config, {}, false, false, 2), 0) << err_.str();
  EXPECT_EQ(Train(config, {"train.optimizer.lr=0.001"}, true), 0) << err_.str();
  EXPECT_EQ(LoadCheckpoint(run + "/checkpoint.ckpt").step, 4);
  // A value that differs is still refused.
  EXPECT_EQ(Train(config, {"train.optimizer.lr=0.002", "train.steps=6"}, true), 2);
  EXPECT_NE(err_.str().find("train.optimizer.lr: 0.001 -> 0.002"), std::string::npos)
      << err_.str();
}

// The weak lr 1e10 case: most steps skipped, the final loss NaN, exit 0.
TEST_F(OutputPolicyTest, ARunThatDidNotTrainIsAFailure) {
  const std::string run = (dir_ / "nan").string();
  const std::string config = WriteConfig(dir_ / "nan.yaml", run, "1e10");
  EXPECT_EQ(Train(config, {"train.steps=20", "train.max_skipped_steps=1000"}), 1);
  EXPECT_NE(err_.str().find("the run did not train: "), std::string::npos) << err_.str();
  EXPECT_NE(err_.str().find("train.optimizer.lr is 1e10"), std::string::npos) << err_.str();
}

// A checksummed checkpoint whose data position does not fit the dataset:
// exit 1 naming Batcher::Restore before; now bad input naming the file.
TEST_F(OutputPolicyTest, ACheckpointWithAnImpossibleDataPositionIsBadInput) {
  const std::string run = (dir_ / "pos").string();
  const std::string config = WriteConfig(dir_ / "pos.yaml", run);
  ASSERT_EQ(Train(config, {}, false, false, 2), 0) << err_.str();
  CheckpointState state = LoadCheckpoint(run + "/checkpoint.ckpt");
  state.data_offset = 1000;
  SaveCheckpoint(run + "/checkpoint.ckpt", state);
  EXPECT_EQ(Train(config, {}, true), 2);
  EXPECT_NE(err_.str().find("lies beyond the training set of 32 examples"), std::string::npos)
      << err_.str();
  EXPECT_EQ(err_.str().find("Batcher"), std::string::npos) << err_.str();
}

// A writer killed mid-save leaves <file>.tmp.<pid>; the next run in that
// directory removes it, but never a live writer's.
TEST_F(OutputPolicyTest, StaleTemporariesAreRemovedAndLiveOnesKept) {
  const fs::path run = dir_ / "tmp";
  fs::create_directories(run);
  const std::string stale = (run / "checkpoint.ckpt.tmp.999999999").string();
  const std::string live =
      (run / ("checkpoint.ckpt.tmp." + std::to_string(::getppid()))).string();
  std::ofstream(stale) << "x";
  std::ofstream(live) << "x";
  std::ofstream(run / "notes.tmp.txt") << "x";
  EXPECT_EQ(RemoveStaleTemporaries(run.string()), std::vector<std::string>{stale});
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(run / "notes.tmp.txt"));
}

}  // namespace
}  // namespace stillpoint::output_policy_test
