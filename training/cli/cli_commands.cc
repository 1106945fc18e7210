#include "training/cli/cli_commands.h"

#include <cfloat>
#include <climits>
#include <cmath>
#include <yaml-cpp/yaml.h>
#include <filesystem>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
#include <ostream>

#include "framework/parallel.h"
#include "training/checkpoint.h"
#include "training/cli/exit_codes.h"
#include "training/config_reference.h"
#include "training/config_schema.h"
#include "training/distributed.h"
#include "training/experiment.h"
#include "training/gradient_check.h"
#include "training/memory_estimate.h"
#include "training/metrics.h"
#include "training/output_policy.h"
#include "training/report/compare.h"
#include "training/report/compare_report.h"
#include "training/retrieve.h"
#include "training/run_directory.h"
#include "training/signals.h"
#include "training/trainer.h"
#include "training/weights_file.h"

namespace stillpoint {
namespace {

// Exit code of a run stopped by a signal, as a shell reports one killed by it.
int SignalExitCode(int signal_number) { return 128 + signal_number; }

// With no log.dir, a plain run (no --resume, no --overwrite) goes to the
// first free runs/<config name>[-N], so repeating a command keeps the last
// result; the choice is recorded in the config (and so in config.yaml).
void ChooseRunDirectory(Config* config, const std::string& config_path, bool keep_default) {
  if (!config->GetString("log.dir").empty() || keep_default) return;
  // Rank 0's choice for every rank of a job: the others would see the
  // directory it has just made and choose the next one.
  std::string dir = AllGatherStrings(NextFreeRunDirectory(RunDirectory(*config, config_path)))
                        .front();
  std::string quoted;  // a YAML single-quoted scalar: ' doubled
  for (char ch : dir) quoted += ch == '\'' ? std::string("''") : std::string(1, ch);
  config->Set("log.dir='" + quoted + "'");
}

std::string ShellQuoted(const std::string& word) {
  if (!word.empty() && word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                              "0123456789_-./=:,+@%") == std::string::npos) {
    return word;
  }
  std::string quoted = "'";
  for (char ch : word) quoted += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return quoted + "'";
}

// The command that continues a run: the same config and overrides, the run
// directory named explicitly (it may have been chosen as runs/<name>-N).
std::string ResumeCommand(const TrainArgs& args, const std::string& run_dir) {
  std::string command = "stillpoint train " + ShellQuoted(args.config_path);
  // Any rank count with the same total of shards continues it bitwise.
  if (WorldSize() > 1) command = "mpirun -np " + std::to_string(WorldSize()) + " " + command;
  bool has_dir = false;
  for (const std::string& o : args.overrides) {
    if (o.rfind("log.dir=", 0) == 0) {
      has_dir = true;
      command += " " + ShellQuoted("log.dir=" + run_dir);
    } else {
      command += " " + ShellQuoted(o);
    }
  }
  if (!has_dir) command += " " + ShellQuoted("log.dir=" + run_dir);
  return command + " --resume";
}

}  // namespace

int GuardedCommand(std::ostream& err,
                   const std::function<void()>& setup,
                   const std::function<int()>& work) {
  try {
    setup();
  } catch (const std::exception& e) {
    err << "error: " << e.what() << "\n";
    return kBadInput;
  }
  try {
    return work();
  } catch (const ConfigError& e) {
    err << "error: " << e.what() << "\n";
    return kBadInput;
  } catch (const std::exception& e) {
    if (WorldSize() > 1) {
      // A failure the other ranks of the job may not learn of: they would
      // wait for this rank forever, so it ends the job (every rank).
      std::cerr << "error: rank " << WorldRank() << ": " << e.what() << "; ending the job\n";
      AbortJob(kRuntimeFailure);
    }
    err << "error: " << e.what() << "\n";
    return kRuntimeFailure;
  }
}

int RunTrain(const TrainArgs& args, std::ostream& out, std::ostream& err,
             TrainSummary* summary_out) {
  Experiment experiment;
  return GuardedCommand(
      err,
      [&] {
        SP_CHECK(args.stop_after_steps >= 0, "--stop-after must be >= 0 (0: no limit), got ",
                 args.stop_after_steps);
        SP_CHECK(!args.force || args.resume, "--force applies to --resume only");
        SP_CHECK(!(args.resume && args.overwrite),
                 "--resume and --overwrite exclude each other (continue the run, or replace it)");
        Config config = Config::FromFile(StillpointSchema(), args.config_path, args.overrides);
        ChooseRunDirectory(&config, args.config_path, args.resume || args.overwrite);
        CheckMemoryFits(config, /*training=*/true);
        // Before the first line of output (under mpirun: on every rank).
        CheckTrainingConfig(config);
        CheckModelKindKeys(config);
        experiment = BuildExperiment(config, args.config_path);
      },
      [&] {
        TrainOptions options;
        options.resume = args.resume;
        options.force = args.force;
        options.overwrite = args.overwrite;
        options.stop_after_steps = args.stop_after_steps;
        options.progress = &out;
        const std::string run_dir = RunDirectory(experiment.config, experiment.config_path);
        // Before the first line: a closed stdout (SIGPIPE) stops the run too.
        const StopOnSignals stop_on_signals;
        out << "training " << experiment.model->Name() << " (" << experiment.model->NumParameters()
            << " parameters) on " << experiment.config.GetString("task.kind") << "; run directory "
            << run_dir << "\n";
        const TrainSummary summary = Train(experiment, options);
        if (summary_out != nullptr) *summary_out = summary;
        if (summary.already_complete) {
          out << run_dir << " is complete (step " << summary.steps << " of train.steps "
              << experiment.config.GetInt("train.steps")
              << "): nothing to train; its checkpoint, metrics and summary are unchanged\n";
          return kOk;
        }
        out << summary.BriefReport() << "\n";
        if (summary.stop_signal != 0) {
          err << summary.stop_reason << "; wrote " << run_dir << "/checkpoint.ckpt and the "
              << "summary. Resume with:\n  " << ResumeCommand(args, run_dir) << "\n";
          return SignalExitCode(summary.stop_signal);
        }
        if (summary.stopped_early) {
          err << "error: training stopped early: " << summary.stop_reason << "\n";
          return kRuntimeFailure;
        }
        // A run that reached its last step without training (lr 1e10: most
        // steps skipped as non-finite, the loss NaN) is a failure, not exit 0.
        if (!std::isfinite(summary.final_train_loss) ||
            2 * summary.skipped_steps > summary.steps) {
          err << "error: the run did not train: " << summary.skipped_steps << " of "
              << summary.steps << " steps were skipped as non-finite and the last training loss "
              << "is " << summary.final_train_loss << " (train.optimizer.lr is "
              << experiment.config.ValueText("train.optimizer.lr")
              << "; a smaller one, or train.clip_norm, keeps the steps finite)\n";
          return kRuntimeFailure;
        }
        return kOk;
      });
}

namespace {

// `stillpoint eval --json`: the evaluation (and the gradient check) as one
// JSON object.
void PrintEvalJson(std::ostream& out, const EvalArgs& args, const EvalResult& result,
                   int64_t tokens, int64_t depth, const GradientCheck& check) {
  // An explicit or tied model has no forward solve: its figures are null.
  const bool solved = result.forward.Ran();
  out << "{\"loss\": " << JsonNumber(result.loss)
      << ", \"accuracy\": " << JsonNumber(result.accuracy)
      << ", \"solved_fraction\": " << JsonNumber(result.solved_fraction)
      << ", \"examples\": " << result.examples
      << ", \"length\": " << tokens
      << ", \"iterations_budget\": " << depth
      << ", \"forward_iterations_mean\": " << JsonNumberIf(solved, result.forward.iterations_mean)
      << ", \"forward_iterations_max\": " << JsonNumberIf(solved, result.forward.iterations_max)
      << ", \"forward_residual_max\": " << JsonNumberIf(solved, result.forward.residual_max)
      << ", \"unconverged_samples\": "
      << (solved ? std::to_string(result.forward.not_converged) : std::string("null"));
  if (args.gradient_check) {
    out << ", \"gradient_check\": ";
    if (check.ran) {
      out << "{\"cosine\": " << JsonNumber(check.cosine)
          << ", \"relative_error\": " << JsonNumber(check.relative_error)
          << ", \"reference_residual\": " << JsonNumber(check.reference_residual)
          << ", \"reference_tolerance\": " << JsonNumber(check.reference_tolerance)
          << ", \"reference_status\": " << JsonString(check.reference_status)
          << ", \"no_reference\": "
          << (check.no_reference.empty() ? "null" : JsonString(check.no_reference))
          << ", \"spectral_radius\": " << JsonNumber(check.spectral_radius)
          << ", \"used\": " << JsonString(check.used_brief) << "}";
    } else {
      out << "null";
    }
  }
  out << "}\n";
}

// `stillpoint eval`: the evaluation (and the gradient check) as text.
void PrintEvalText(std::ostream& out, const EvalArgs& args, const EvalResult& result,
                   int64_t tokens, int64_t depth, const GradientCheck& check,
                   const std::string& checkpoint_path, int64_t step) {
  out << std::fixed << std::setprecision(4) << checkpoint_path << " (step " << step
      << "): test loss " << result.loss << ", test accuracy " << std::setprecision(2)
      << 100.0 * result.accuracy << "%, solved " << 100.0 * result.solved_fraction
      << "% over " << result.examples << " examples of length " << tokens
      << ", test-time depth " << depth;
  if (result.forward.iterations_max > 0) {
    out << std::setprecision(1) << ", forward iterations " << result.forward.iterations_mean
        << " (max " << result.forward.iterations_max << "), "
        << result.forward.not_converged << " samples unconverged";
  }
  out << "\n";
  if (args.gradient_check) {
    out << check.Line() << "\n";
    if (!check.used_brief.empty()) {
      out << "  the gradient used: " << check.used_brief << "\n";
    }
  }
}

}  // namespace

int RunEval(const EvalArgs& args, std::ostream& out, std::ostream& err) {
  Experiment experiment;
  CheckpointState state;
  std::string checkpoint_path;
  return GuardedCommand(
      err,
      [&] {
        SP_CHECK(args.iterations >= 0 && args.iterations <= kMaxSolverIterations,
                 "--iters must be in [1, ", kMaxSolverIterations, "] (0: as trained), got ",
                 args.iterations);
        SP_CHECK(args.length >= 0, "--length must be >= 1 (0: as trained), got ", args.length);
        SP_CHECK(args.size >= 0, "--size must be >= 1 (0: as trained), got ", args.size);
        SP_CHECK(!args.until_converged || args.cap >= 1,
                 "--until-converged needs --cap N, the most iterations a solve may take (a solve "
                 "that never meets its tolerance would otherwise never end)");
        SP_CHECK(args.cap <= INT_MAX, "--cap ", args.cap, " is too large");
        SP_CHECK(args.cap == 0 || args.until_converged, "--cap applies to --until-converged only");
        SP_CHECK(!(args.until_converged && args.iterations > 0),
                 "--iters and --until-converged both set the budget: give one");
        checkpoint_path = std::filesystem::is_directory(args.run)
                              ? (std::filesystem::path(args.run) / "checkpoint.ckpt").string()
                              : args.run;
        state = LoadCheckpoint(checkpoint_path);
        Config config = Config::FromYaml(StillpointSchema(), state.config_yaml,
                                         checkpoint_path + " (stored config)", args.overrides);
        // The checkpoint holds the weights: model.init_from is not read again.
        config.Set("model.init_from=");
        if (args.iterations > 0 || args.until_converged) {
          const int64_t budget = args.until_converged ? args.cap : args.iterations;
          config.Set("eval.max_iterations=" + std::to_string(budget));
        }
        CheckMemoryFits(config, /*training=*/false);
        experiment = BuildExperiment(config, "", args.length, args.size);
        experiment.model->LoadParameters(state.model);
        if (args.until_converged && experiment.model->implicit() == nullptr) {
          throw ConfigError("--until-converged needs a model with a tolerance (model.kind "
                            "implicit); this one is " + config.GetString("model.kind") +
                            ": give its depth with --iters");
        }
      },
      [&] {
        const int64_t tokens = experiment.test->info().length;
        SetEvalDepth(*experiment.model, experiment.config, tokens);
        const EvalResult result = Evaluate(*experiment.model, *experiment.test,
                                           experiment.config.GetInt("eval.batch_size"),
                                           experiment.dtype);
        GradientCheck check;
        if (args.gradient_check) {
          const int64_t size = experiment.config.GetInt("eval.gradient_check_batch_size");
          check = CheckGradient(
              *experiment.model,
              GradientProbeBatch(*experiment.train, size > 0 ? size : 8, experiment.dtype));
        }
        const int64_t depth = TestTimeDepth(*experiment.model);
        if (args.json) {
          PrintEvalJson(out, args, result, tokens, depth, check);
        } else {
          PrintEvalText(out, args, result, tokens, depth, check, checkpoint_path, state.step);
        }
        return kOk;
      });
}

int RunCompare(const CompareArgs& args, std::ostream& out, std::ostream& err,
               CompareReport* report_out) {
  Config config;
  return GuardedCommand(
      err,
      [&] {
        config = Config::FromFile(StillpointSchema(), args.config_path, args.overrides);
        ChooseRunDirectory(&config, args.config_path, args.overwrite);
        ValidateCompareVariants(config, args.config_path);
        const std::string root = RunDirectory(config, args.config_path);
        CheckRunDirectory(root, args.overwrite, args.config_path, ComparisonFileNames());
        out << "comparison in " << root << "\n";
      },
      [&] {
        const StopOnSignals stop_on_signals;
        const CompareReport report = RunComparison(config, args.config_path, &out, args.overwrite);
        if (report_out != nullptr) *report_out = report;
        if (report.stop_signal != 0) {
          const VariantResult& last = report.variants.back();
          err << last.train.stop_reason << " of variant " << last.name << " (checkpoint in "
              << last.run_dir << "); the comparison stopped there and wrote no report\n";
          return SignalExitCode(report.stop_signal);
        }
        out << "\n" << report.console_table << "\nreport (the full table): "
            << report.markdown_path << " and " << report.html_path << "\n";
        if (AnyStoppedEarly(report)) {
          for (const VariantResult& v : report.variants) {
            if (!v.train.stopped_early) continue;
            err << "error: variant " << v.name << " (seed " << v.seed
                << ") stopped early: " << v.train.stop_reason << "\n";
          }
          return kRuntimeFailure;
        }
        return kOk;
      });
}

int RunReport(const ReportArgs& args, std::ostream& out, std::ostream& err) {
  CompareReport report;
  ReportHeader header;
  std::string root;
  return GuardedCommand(
      err,
      [&] {
        SP_CHECK(!args.runs.empty(), "report: name at least one run directory");
        std::string listed, task;
        // Each run once: one counted twice would pool as two seeds of one
        // variant with a spread of zero.
        std::map<std::string, std::string> seen;  // canonical path -> as found
        for (const std::string& given : args.runs) {
          std::string path = given;
          while (path.size() > 1 && path.back() == '/') path.pop_back();
          for (const std::string& run : FindRunDirectories(path)) {
            std::error_code error;
            std::string canonical = std::filesystem::canonical(run, error).string();
            if (error) canonical = run;
            const auto [it, added] = seen.emplace(canonical, run);
            if (!added) {
              throw ConfigError("report: '" + run + "' and '" + it->second +
                                "' are the same run, given twice (directly or inside a "
                                "comparison); name each run once");
            }
            const std::string name =
                run == path ? path : std::filesystem::relative(run, path).string();
            VariantResult v = LoadVariantResult(run, name);
            const std::string config_path = run + "/config.yaml";
            if (std::filesystem::exists(config_path)) {
              try {
                const YAML::Node config = YAML::LoadFile(config_path);
                if (config["task"] && config["task"]["kind"] && task.empty()) {
                  task = config["task"]["kind"].as<std::string>();
                }
                if (config["seed"] && !std::filesystem::exists(run + "/variant.json")) {
                  v.seed = config["seed"].as<int64_t>();
                }
              } catch (const YAML::Exception& e) {
                throw ConfigError(config_path + ": malformed (" + e.msg + ")");
              }
            }
            report.variants.push_back(std::move(v));
          }
          listed += (listed.empty() ? "`" : ", `") + path + "`";
        }
        header.description = "Runs " + listed + (task.empty() ? "" : "; task `" + task + "`") +
                             " (stillpoint report).";
        root = args.out_dir.empty() ? NextFreeRunDirectory("runs/report") : args.out_dir;
        CheckOutputDirectory(root, args.overwrite);
      },
      [&] {
        WriteComparisonReport(root, header, &report);
        out << report.console_table << "\nreport (the full table): " << report.markdown_path
            << " and " << report.html_path << "\n";
        return kOk;
      });
}

int RunExport(const ExportArgs& args, std::ostream& out, std::ostream& err) {
  CheckpointState state;
  std::string path;
  return GuardedCommand(
      err,
      [&] {
        SP_CHECK(args.format == "safetensors" || args.format == "npz", "--format: '", args.format,
                 "' is not safetensors or npz");
        const bool directory = std::filesystem::is_directory(args.run);
        const std::string checkpoint =
            directory ? (std::filesystem::path(args.run) / "checkpoint.ckpt").string() : args.run;
        state = LoadCheckpoint(checkpoint);
        path = !args.out.empty()
                   ? args.out
                   : ((directory ? std::filesystem::path(args.run)
                                 : std::filesystem::path(args.run).parent_path()) /
                      ("weights." + args.format))
                         .string();
        CheckOutputFile(path, args.overwrite);
      },
      [&] {
        if (args.format == "safetensors") {
          WriteSafetensors(path, state.model);
        } else {
          WriteNpz(path, state.model);
        }
        out << "wrote " << state.model.size() << " tensors (step " << state.step << ") to "
            << path << "\n";
        return kOk;
      });
}

int RunRetrieve(const RetrieveArgs& args, std::ostream& out, std::ostream& err) {
  Tensor patterns, queries;
  ForwardSolverOptions options = RetrievalSolverOptions();
  return GuardedCommand(
      err,
      [&] {
        DType dtype;
        SP_CHECK(StringToDType(args.dtype, &dtype), "--dtype: '", args.dtype,
                 "' is not float32 or float64");
        SP_CHECK(StringToForwardSolverType(args.solver, &options.type), "--solver: unknown solver '",
                 args.solver, "'");
        SP_CHECK(std::isfinite(args.beta) && args.beta > 0, "--beta must be a positive finite "
                 "number, got ", args.beta);
        SP_CHECK(dtype != DType::kFloat32 || args.beta <= FLT_MAX, "--beta ", args.beta,
                 " does not fit in float32 (--dtype float64 holds it)");
        SP_CHECK(args.threads >= 1 && args.threads <= kMaxThreads, "--threads must be in [1, ",
                 kMaxThreads, "], got ", args.threads);
        SP_CHECK(args.max_iterations >= 1 && args.max_iterations <= kMaxSolverIterations,
                 "--max-iter must be in [1, ", kMaxSolverIterations, "], got ",
                 args.max_iterations);
        SP_CHECK(std::isfinite(args.tolerance) && args.tolerance >= 0, "--tol must be a finite "
                 "number >= 0, got ", args.tolerance);
        CheckOutputDirectory(args.out_dir, args.overwrite);
        options.relative_tolerance = args.tolerance;
        options.max_iterations = static_cast<int>(args.max_iterations);
        std::string error;
        SP_CHECK(options.IsValid(&error), "--solver ", args.solver, ": ", error);
        SP_CHECK(args.max_file_mib >= 1 && args.max_file_mib <= (int64_t{1} << 24),
                 "--max-file-mib must be in [1, ", int64_t{1} << 24, "], got ",
                 args.max_file_mib);
        ReadLimit limit;
        limit.max_bytes = static_cast<uint64_t>(args.max_file_mib) << 20;
        limit.raised_by = "--max-file-mib";
        patterns = ReadCsvMatrix(args.patterns_path, dtype, limit);
        queries = ReadCsvMatrix(args.queries_path, dtype, limit);
        SP_CHECK(patterns.dim(1) == queries.dim(1), args.queries_path, ": queries have ",
                 queries.dim(1), " columns but the patterns in ", args.patterns_path, " have ",
                 patterns.dim(1));
      },
      [&] {
        SetNumThreads(args.threads);
        const RetrievalResult result = RetrieveHopfield(patterns, queries, args.beta, options);
        WriteRetrieval(args.out_dir, result, args.beta);
        out << queries.dim(0) << " queries against " << patterns.dim(0) << " patterns: "
            << result.summary.BriefReport() << "; " << result.seconds << " s; wrote "
            << args.out_dir << "/fixed_points.csv and stats.json\n";
        return kOk;
      });
}

int RunConfig(const ConfigArgs& args, std::ostream& out, std::ostream& err) {
  std::string text;
  return GuardedCommand(
      err,
      [&] {
        const int forms = int(args.doc) + int(args.json_schema) + int(args.keys);
        SP_CHECK(forms <= 1, "config: --doc, --json-schema and --keys exclude each other");
        if (!args.config_path.empty()) {
          SP_CHECK(forms == 0, "config: --doc, --json-schema and --keys describe the schema; "
                   "they take no config file");
          text = Config::FromFile(StillpointSchema(), args.config_path, args.overrides).ToYaml();
          return;
        }
        SP_CHECK(!args.resolved, "config --resolved needs a config file: stillpoint config "
                 "CONFIG [overrides] --resolved");
        SP_CHECK(args.overrides.empty(), "config: overrides need a config file");
        if (args.doc) {
          text = ConfigReferenceMarkdown();
        } else if (args.json_schema) {
          text = ConfigJsonSchema(StillpointSchema());
        } else if (args.keys) {
          text = ConfigKeyList(StillpointSchema());
        } else {
          text = ConfigReferenceText(StillpointSchema());
        }
      },
      [&] {
        out << text;
        return kOk;
      });
}

int RunConfigDoc(std::ostream& out) {
  out << ConfigReferenceMarkdown();
  return kOk;
}

}  // namespace stillpoint
