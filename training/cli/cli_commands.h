// The subcommands of the `stillpoint` program, as functions so tests can run
// them in-process. Each returns the process exit code: 0 success, 1 runtime
// failure, 2 bad input (command line, config, data files — reported before
// any work starts), and writes its output to out and its errors to err.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

#include "framework/serialize.h"    // ReadLimit
#include "training/provenance.h"  // StillpointVersion

namespace stillpoint {

struct TrainSummary;   // training/trainer.h
struct CompareReport;  // training/report/compare.h

// Runs setup, then work, and returns work's exit code; an exception from
// setup, or a ConfigError from work, is bad input (2), any other exception
// from work a runtime failure (1); either is printed to err as "error: ...".
int GuardedCommand(std::ostream& err,
                   const std::function<void()>& setup,
                   const std::function<int()>& work);

// With no log.dir in the config (and neither --resume nor --overwrite),
// train and compare write into the first free directory of runs/<config
// name>, runs/<config name>-2, ... and print it; a log.dir that holds a run
// is refused unless --resume or --overwrite (training/run_directory.h).
// SIGINT and SIGTERM stop them after the step in flight with a checkpoint
// and exit code 130 / 143 (training/signals.h).
struct TrainArgs {
  std::string config_path;
  std::vector<std::string> overrides;
  bool resume = false;
  bool force = false;      // resume despite config differences
  bool overwrite = false;  // replace the run in log.dir
  int64_t stop_after_steps = 0;
};
// When `summary` is given, it receives the trainer's summary of a run that
// started (the Python bindings return it).
int RunTrain(const TrainArgs& args, std::ostream& out, std::ostream& err,
             TrainSummary* summary = nullptr);

struct EvalArgs {
  std::string run;  // run directory or checkpoint file
  std::vector<std::string> overrides;
  // The test-time budget: `iterations` > 0 fixes it (--iters); else the
  // budget rule (training/experiment.h EvalDepth) gives it by input length.
  int64_t iterations = 0;
  int64_t length = 0;  // 0: as trained
  int64_t size = 0;    // 0: as trained (tasks with a size, e.g. maze)
  // --until-converged: each solve runs until it meets the forward solver's
  // tolerance, at most `cap` iterations (required).
  bool until_converged = false;
  int64_t cap = 0;
  bool json = false;
  // Also run the gradient check (training/gradient_check.h) on a probe batch
  // of eval.gradient_check_batch_size training examples (8 if that is 0).
  bool gradient_check = false;
};
int RunEval(const EvalArgs& args, std::ostream& out, std::ostream& err);

struct CompareArgs {
  std::string config_path;
  std::vector<std::string> overrides;
  bool overwrite = false;  // replace the comparison in log.dir
};
// When `report` is given, it receives the comparison's report (also one
// stopped by a signal).
int RunCompare(const CompareArgs& args, std::ostream& out, std::ostream& err,
               CompareReport* report = nullptr);

// `stillpoint report RUN...`: the comparison report (training/report/compare_report.h)
// of existing run directories: each RUN is a run directory (holding
// summary.json) or a directory holding several (a comparison). Written to
// out_dir, or to the first free runs/report[-N].
struct ReportArgs {
  std::vector<std::string> runs;
  std::string out_dir;
  bool overwrite = false;  // replace the report files of an existing out_dir
};
int RunReport(const ReportArgs& args, std::ostream& out, std::ostream& err);

// `stillpoint export RUN --format safetensors|npz [--out FILE]`: the
// parameters of a run (its checkpoint) in a format PyTorch and NumPy read
// (training/weights_file.h); FILE defaults to RUN/weights.<format>. The
// output policy (training/output_policy.h) applies to every command's
// outputs: an existing file or non-empty directory is replaced only with
// --overwrite, a run's own files, devices and FIFOs never.
struct ExportArgs {
  std::string run;  // run directory or checkpoint file
  std::string format;
  std::string out;
  bool overwrite = false;  // replace an existing file (never a run's own, a device, a FIFO)
};
int RunExport(const ExportArgs& args, std::ostream& out, std::ostream& err);

struct RetrieveArgs {
  std::string patterns_path;
  std::string queries_path;
  std::string out_dir;
  double beta = 8.0;
  std::string solver = "picard";
  double tolerance = 1e-6;
  int64_t max_iterations = 32;
  int threads = 1;
  std::string dtype = "float32";
  int64_t max_file_mib = ReadLimit::kDefaultMaxMib;  // cap of each CSV, decompressed
  bool overwrite = false;  // write into an out_dir that holds files
};
int RunRetrieve(const RetrieveArgs& args, std::ostream& out, std::ostream& err);

// `stillpoint config`: with a config file, the resolved config (every
// default filled in, overrides applied; --resolved says so explicitly);
// without one, the reference of every key as plain text, as Markdown
// (--doc), as a JSON Schema (--json-schema) or as key paths (--keys).
struct ConfigArgs {
  std::string config_path;
  std::vector<std::string> overrides;
  bool resolved = false;
  bool doc = false;
  bool json_schema = false;
  bool keys = false;
};
int RunConfig(const ConfigArgs& args, std::ostream& out, std::ostream& err);

int RunConfigDoc(std::ostream& out);

}  // namespace stillpoint
