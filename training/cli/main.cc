// `stillpoint`: train, evaluate and compare implicit and explicit models
// from YAML configs. Exit codes: 0 success, 1 runtime failure, 2 bad input
// (command line, config, data files), reported before any work starts; 130
// and 143 after a graceful stop on SIGINT and SIGTERM (training/signals.h).
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "layers/energy_block.h"
#include "training/cli/bench_command.h"
#include "training/cli/cli_commands.h"
#include "training/config/config.h"
#include "training/cli/demo_cli.h"
#include "training/cli/generate_command.h"
#include "training/distributed.h"
#include "training/output_policy.h"
#include "training/provenance.h"

namespace {

// The OpenMP build of OpenBLAS that Debian links (directly, and through
// Ceres' LAPACK) allocates a large buffer per thread while it loads, one
// thread per core unless OPENBLAS_NUM_THREADS (or, in older builds,
// OMP_NUM_THREADS) says otherwise, and retries a failed allocation for ever:
// under `ulimit -v 300000`, `stillpoint --version` never returned.
// stillpoint runs every BLAS call on one thread (framework/kernels/gemm.cc),
// so one buffer is all it needs, and nothing else in it uses OpenMP
// (ParallelFor is oneTBB).
//
// The variables must be set before OpenBLAS initialises, which is before
// main. An executable's .preinit_array runs before any shared library's
// initialiser, but libc's own initialiser then resets the environment to
// the one the process started with, so a setenv() there is lost. So this
// function, when either variable is unset, starts the program again
// (execve of /proc/self/exe, same arguments) with them set to 1; a user's
// own settings are kept, and if the exec fails the program goes on as it
// would have.
void LimitBlasBeforeItLoads(int, char** argv, char** envp) {
  const char* const wanted[] = {"OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=1"};
  bool present[2] = {false, false};
  int count = 0;
  for (; envp[count] != nullptr; ++count) {
    for (int w = 0; w < 2; ++w) {
      const std::size_t name = std::strchr(wanted[w], '=') - wanted[w] + 1;
      if (std::strncmp(envp[count], wanted[w], name) == 0) present[w] = true;
    }
  }
  if (present[0] && present[1]) return;
  std::vector<char*> environment(envp, envp + count);
  for (int w = 0; w < 2; ++w) {
    if (!present[w]) environment.push_back(const_cast<char*>(wanted[w]));
  }
  environment.push_back(nullptr);
  ::execve("/proc/self/exe", argv, environment.data());
  // Only on failure (no /proc): go on with the environment as it is.
}

__attribute__((section(".preinit_array"), used)) void (*const kPreinit)(int, char**, char**) =
    &LimitBlasBeforeItLoads;

CLI::App* AddTrainCommand(CLI::App& app, stillpoint::TrainArgs& train) {
  CLI::App* train_cmd = app.add_subcommand("train", "Train the model a config describes");
  train_cmd->add_option("config", train.config_path, "YAML config file")->required();
  train_cmd->add_option("overrides", train.overrides,
                        "Dotted overrides, e.g. train.steps=100 model.kind=explicit");
  train_cmd->add_flag("--resume", train.resume,
                      "Continue from the run directory's checkpoint when there is one (its "
                      "config must match, except steps and eval/log/checkpoint cadence)");
  train_cmd->add_flag("--force", train.force,
                      "With --resume: continue even if the config differs from the checkpoint's");
  train_cmd->add_flag("--overwrite", train.overwrite,
                      "Replace the run in log.dir (without it a non-empty log.dir is refused; "
                      "with no log.dir a new runs/<config name>-N is used)");
  train_cmd->add_option("--stop-after", train.stop_after_steps,
                        "Stop (with a checkpoint) after this many steps of this invocation");
  return train_cmd;
}

CLI::App* AddEvalCommand(CLI::App& app, stillpoint::EvalArgs& eval) {
  CLI::App* eval_cmd = app.add_subcommand(
      "eval", "Evaluate a trained run (run directory or checkpoint file) on held-out data");
  eval_cmd->add_option("run", eval.run, "Run directory or .ckpt file")->required();
  eval_cmd->add_option("overrides", eval.overrides, "Dotted overrides of the run's config");
  eval_cmd
      ->add_option("--iters", eval.iterations,
                   "Test-time forward solver budget (implicit) or unroll depth (tied); default: "
                   "the budget rule, eval.iterations_per_token")
      ->check(CLI::Range(int64_t{1}, int64_t{INT_MAX}));
  eval_cmd->add_option("--length", eval.length, "Evaluate on sequences of this length");
  eval_cmd->add_option("--size", eval.size,
                       "Evaluate on problems of this size (task.size, e.g. a maze's cells per "
                       "side)");
  eval_cmd->add_flag("--until-converged", eval.until_converged,
                     "Run each solve until it meets the forward solver's tolerance, at most "
                     "--cap iterations (implicit models)");
  eval_cmd->add_option("--cap", eval.cap, "The iteration cap of --until-converged (required)");
  eval_cmd->add_flag("--json", eval.json, "Print the result as JSON");
  eval_cmd->add_flag("--gradient-check", eval.gradient_check,
                     "Also compare the gradient the model trains with against a reference "
                     "(ift, GMRES to 1e-10) on a fixed probe batch of training examples");
  return eval_cmd;
}

CLI::App* AddCompareCommand(CLI::App& app, stillpoint::CompareArgs& compare) {
  CLI::App* compare_cmd = app.add_subcommand(
      "compare", "Train the variants of compare.variants on one task and write a report");
  compare_cmd->add_option("config", compare.config_path, "YAML config file")->required();
  compare_cmd->add_option("overrides", compare.overrides, "Dotted overrides");
  compare_cmd->add_flag("--overwrite", compare.overwrite,
                        "Replace the comparison in log.dir (without it a non-empty log.dir is "
                        "refused; with no log.dir a new runs/<config name>-N is used)");
  return compare_cmd;
}

CLI::App* AddReportCommand(CLI::App& app, stillpoint::ReportArgs& report) {
  CLI::App* report_cmd = app.add_subcommand(
      "report", "Write a comparison report (report.md, report.html) of existing run directories");
  report_cmd->add_option("runs", report.runs,
                         "Run directories, or directories holding them (a comparison)")
      ->required();
  report_cmd->add_option("--out", report.out_dir,
                         "Directory of the report (default: the first free runs/report[-N])");
  report_cmd->add_flag("--overwrite", report.overwrite,
                       "Write into an --out directory that holds files (never a run directory)");
  return report_cmd;
}

CLI::App* AddExportCommand(CLI::App& app, stillpoint::ExportArgs& export_args) {
  CLI::App* export_cmd = app.add_subcommand(
      "export", "Write a run's parameters as safetensors (PyTorch) or npz (NumPy)");
  export_cmd->add_option("run", export_args.run, "Run directory or .ckpt file")->required();
  export_cmd->add_option("--format", export_args.format, "safetensors or npz")->required();
  export_cmd->add_option("--out", export_args.out, "Output file (default RUN/weights.FORMAT)");
  export_cmd->add_flag("--overwrite", export_args.overwrite,
                       "Replace an existing output file (never a run's own file, a device or a "
                       "FIFO; a symlink is replaced as a link)");
  return export_cmd;
}

CLI::App* AddRetrieveCommand(CLI::App& app, stillpoint::RetrieveArgs& retrieve) {
  CLI::App* retrieve_cmd = app.add_subcommand(
      "retrieve", "Solve the Hopfield fixed point xi = X softmax(beta X^T xi) for each query");
  retrieve_cmd->add_option("--patterns", retrieve.patterns_path,
                           "CSV of stored patterns, one per row")->required();
  retrieve_cmd->add_option("--queries", retrieve.queries_path, "CSV of queries, one per row")
      ->required();
  retrieve_cmd->add_option("--out", retrieve.out_dir,
                           "Output directory (fixed_points.csv, stats.json)")->required();
  retrieve_cmd->add_option("--beta", retrieve.beta, "Inverse temperature")
      ->capture_default_str();
  retrieve_cmd->add_option("--solver", retrieve.solver,
                           "Forward solver (picard, anderson, broyden, ...)")
      ->capture_default_str();
  retrieve_cmd->add_option("--tol", retrieve.tolerance, "Relative residual tolerance")
      ->capture_default_str();
  retrieve_cmd->add_option("--max-iter", retrieve.max_iterations, "Iteration budget")
      ->capture_default_str();
  retrieve_cmd->add_option("--threads", retrieve.threads, "Worker threads")
      ->capture_default_str();
  retrieve_cmd->add_option("--dtype", retrieve.dtype, "float32 or float64")
      ->capture_default_str();
  retrieve_cmd->add_flag("--overwrite", retrieve.overwrite,
                         "Write into an --out directory that holds files");
  retrieve_cmd->add_option("--max-file-mib", retrieve.max_file_mib,
                           "The most MiB read from each CSV (after decompression)")
      ->capture_default_str();
  return retrieve_cmd;
}

CLI::App* AddConfigCommand(CLI::App& app, stillpoint::ConfigArgs& config) {
  CLI::App* config_cmd = app.add_subcommand(
      "config", "Print a config resolved (every default filled in), or the reference of every key");
  config_cmd->add_option("config", config.config_path,
                         "YAML config file: print it resolved, overrides applied");
  config_cmd->add_option("overrides", config.overrides, "Dotted overrides");
  config_cmd->add_flag("--resolved", config.resolved,
                       "Print the resolved config of CONFIG (the default when one is given)");
  config_cmd->add_flag("--doc", config.doc, "The reference as Markdown, as in docs/config.md");
  config_cmd->add_flag("--json-schema", config.json_schema,
                       "A JSON Schema of config files, for editors' YAML support");
  config_cmd->add_flag("--keys", config.keys, "Every key path, one a line");
  return config_cmd;
}

CLI::App* AddBenchCommand(CLI::App& app, stillpoint::BenchArgs& bench) {
  CLI::App* bench_cmd = app.add_subcommand(
      "bench", "Time a workload of bench/SPEC.md (w1, w2, w4: training steps; w3: retrieval; "
               "allreduce: the gradient reduction across mpirun ranks)");
  bench_cmd->add_option("workload", bench.workload,
                        "w1, w2, w3, w4, allreduce or scale (time and memory against length, depth)")
      ->required();
  bench_cmd->add_option("--model", bench.model, "implicit (default) or explicit (w1, w2)");
  bench_cmd->add_option("--attention", bench.attention,
                        "The cell's attention (w1, w2): softmax (default) or an energy attention "
                        "(" + stillpoint::BuiltinEnergyBlockList() + "), nested solve");
  bench_cmd->add_flag("--no-warm-start", bench.no_warm_start,
                      "With an energy --attention: start every inner solve cold");
  bench_cmd->add_option("--iters", bench.iterations,
                        "Forward and adjoint iterations (default 16; w3: at most, default 32)");
  bench_cmd->add_option("--threads", bench.threads, "Worker threads")->capture_default_str();
  bench_cmd
      ->add_option("--shards", bench.shards,
                   "Data-parallel shards of the batch (w1, w2; see training/data_parallel.h)")
      ->capture_default_str();
  bench_cmd->add_option("--steps", bench.steps, "Timed steps")->capture_default_str();
  bench_cmd->add_option("--warmup", bench.warmup, "Untimed warm-up steps")->capture_default_str();
  bench_cmd->add_flag(
      "--scaling", bench.scaling,
      "Alternate 1-thread and --threads steps; report both and their ratio (w1, w2)");
  bench_cmd->add_flag("--json", bench.json, "Print the result as one JSON object");
  bench_cmd->add_option("--weights", bench.weights_path,
                        "Start from exported weights and batch (deq_tiny.json layout)");
  bench_cmd->add_option("--dtype", bench.dtype, "float32 or float64")->capture_default_str();
  bench_cmd->add_option("--seed", bench.seed, "Seed of the initialisation and the batch")
      ->capture_default_str();
  bench_cmd->add_flag("--no-overlap", bench.no_overlap,
                      "Under mpirun: reduce gradients after the whole backward pass");
  bench_cmd->add_option("--bucket-kb", bench.bucket_kb,
                        "Under mpirun: KiB of gradient per reduction bucket")
      ->capture_default_str();
  AddBenchScaleOptions(*bench_cmd, bench.scale);
  return bench_cmd;
}

// std::cout written through a CheckedOutputBuffer for the guard's life; on
// every return from main std::cout gets its own buffer back (it outlives
// main).
struct CheckedStdout {
  stillpoint::CheckedOutputBuffer buffer{STDOUT_FILENO};
  std::streambuf* previous = std::cout.rdbuf(&buffer);
  ~CheckedStdout() {
    std::cout.flush();
    std::cout.rdbuf(previous);
  }
};

// Whether `name` is one of the app's commands; if not, says so (with a
// did-you-mean and the list of commands) on stderr.
bool IsCommand(const CLI::App& app, const std::string& name) {
  std::vector<std::string> commands;
  for (const CLI::App* command : app.get_subcommands({})) {
    commands.push_back(command->get_name());
  }
  if (std::find(commands.begin(), commands.end(), name) != commands.end()) return true;
  std::string known;
  for (const std::string& command : commands) known += (known.empty() ? "" : ", ") + command;
  const std::string closest = stillpoint::ClosestName(name, commands);
  std::cerr << "error: unknown command '" << name << "'"
            << (closest.empty() ? "" : " (did you mean '" + closest + "'?)")
            << "; the commands are " << known << " (stillpoint --help)\n";
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace stillpoint;
  // Under mpirun or srun each process is one rank of the job (training/
  // distributed.h); rank 0 speaks for the job, the others print nothing.
  try {
    InitializeDistributed(&argc, &argv);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  // stdout through a buffer that keeps the reason of a failed write
  // (training/output_policy.h); &std::cout stays the stream commands see.
  CheckedStdout stdout_guard;
  std::ostream silent(nullptr);
  std::ostream& out = IsMainRank() ? std::cout : silent;
  std::ostream& err = IsMainRank() ? std::cerr : silent;
  SetCommandLine(argc, argv);
  CLI::App app{
      "stillpoint: deep implicit layers. Attention as an energy, solved to its fixed point, "
      "differentiated implicitly; train, evaluate and compare from YAML configs.\n"
      "Exit codes: 0 ok, 1 runtime failure, 2 bad input, 130/143 stopped by SIGINT/SIGTERM "
      "(with a checkpoint)."};
  app.set_version_flag("--version", std::string("stillpoint ") + StillpointVersion());
  app.require_subcommand(1);

  TrainArgs train;
  CLI::App* train_cmd = AddTrainCommand(app, train);
  EvalArgs eval;
  CLI::App* eval_cmd = AddEvalCommand(app, eval);
  CompareArgs compare;
  CLI::App* compare_cmd = AddCompareCommand(app, compare);
  ReportArgs report;
  CLI::App* report_cmd = AddReportCommand(app, report);
  ExportArgs export_args;
  CLI::App* export_cmd = AddExportCommand(app, export_args);
  RetrieveArgs retrieve;
  CLI::App* retrieve_cmd = AddRetrieveCommand(app, retrieve);
  BenchArgs bench;
  CLI::App* bench_cmd = AddBenchCommand(app, bench);
  GenerateArgs generate;
  CLI::App* generate_cmd = AddGenerateCommand(app, generate);

  ConfigArgs config;
  CLI::App* config_cmd = AddConfigCommand(app, config);
  const SeedDemoCommands seed_demos(app);  // demo, correct

  // A misspelt command would otherwise read as a stray argument, and CLI11
  // says only "A subcommand is required".
  if (argc >= 2 && argv[1][0] != '-' && !IsCommand(app, argv[1])) return 2;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = IsMainRank() ? app.exit(e) : e.get_exit_code();
    return code == 0 ? 0 : 2;
  }
  const auto run = [&]() -> int {
    if (*train_cmd) return RunTrain(train, out, err);
    if (*eval_cmd) return RunEval(eval, out, err);
    if (*compare_cmd) return RunCompare(compare, out, err);
    if (*report_cmd) return RunReport(report, out, err);
    if (*export_cmd) return RunExport(export_args, out, err);
    if (*retrieve_cmd) return RunRetrieve(retrieve, out, err);
    if (*bench_cmd) return RunBench(bench, out, err);
    if (*config_cmd) return RunConfig(config, out, err);
    if (*generate_cmd) return RunGenerate(generate, out, err);
    if (seed_demos.Selected()) return seed_demos.Run(out, err);
    return 2;
  };
  int code = run();
  // A failed or short write to stdout (a full disk, /dev/full) is a failure,
  // not exit 0 with truncated output (training/output_policy.h).
  if (IsMainRank() && !CheckStandardOutput(std::cout, std::cerr, &stdout_guard.buffer) && code == 0) {
    code = 1;
  }
  return code;
}
