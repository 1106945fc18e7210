#include "training/cli_commands.h"

#include <filesystem>
#include <iomanip>
#include <ostream>

#include "training/checkpoint.h"
#include "training/compare.h"
#include "training/config_schema.h"
#include "training/experiment.h"
#include "training/gradient_check.h"
#include "framework/parallel.h"
#include "training/metrics.h"
#include "training/retrieve.h"
#include "training/trainer.h"

namespace stillpoint {
namespace {

constexpr int kOk = 0;
constexpr int kRuntimeFailure = 1;
constexpr int kBadInput = 2;

// Runs setup (bad input -> 2) and then work (failure -> 1).
template <typename Setup, typename Work>
int Guarded(std::ostream& err, Setup setup, Work work) {
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
    err << "error: " << e.what() << "\n";
    return kRuntimeFailure;
  }
}

}  // namespace

// The build sets STILLPOINT_VERSION from project(... VERSION).
#ifndef STILLPOINT_VERSION
#define STILLPOINT_VERSION "unknown"
#endif
const char* StillpointVersion() { return STILLPOINT_VERSION; }

int RunTrain(const TrainArgs& args, std::ostream& out, std::ostream& err) {
  Experiment experiment;
  return Guarded(
      err,
      [&] {
        const Config config = Config::FromFile(StillpointSchema(), args.config_path, args.overrides);
        experiment = BuildExperiment(config, args.config_path);
      },
      [&] {
        TrainOptions options;
        options.resume = args.resume;
        options.stop_after_steps = args.stop_after_steps;
        options.progress = &out;
        out << "training " << experiment.model->Name() << " (" << experiment.model->NumParameters()
            << " parameters) on " << experiment.config.GetString("task.kind") << "; run directory "
            << RunDirectory(experiment.config, experiment.config_path) << "\n";
        const TrainSummary summary = Train(experiment, options);
        out << summary.BriefReport() << "\n";
        return summary.stopped_early ? kRuntimeFailure : kOk;
      });
}

int RunEval(const EvalArgs& args, std::ostream& out, std::ostream& err) {
  Experiment experiment;
  CheckpointState state;
  std::string checkpoint_path;
  return Guarded(
      err,
      [&] {
        checkpoint_path = std::filesystem::is_directory(args.run)
                              ? (std::filesystem::path(args.run) / "checkpoint.ckpt").string()
                              : args.run;
        state = LoadCheckpoint(checkpoint_path);
        Config config = Config::FromYaml(StillpointSchema(), state.config_yaml,
                                         checkpoint_path + " (stored config)", args.overrides);
        if (args.iterations > 0) {
          config.Set("eval.max_iterations=" + std::to_string(args.iterations));
        }
        experiment = BuildExperiment(config, "", args.length);
        experiment.model->LoadParameters(state.model);
      },
      [&] {
        SetEvalDepth(*experiment.model, experiment.config);
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
        if (args.json) {
          out << "{\"loss\": " << JsonNumber(result.loss)
              << ", \"accuracy\": " << JsonNumber(result.accuracy)
              << ", \"examples\": " << result.examples
              << ", \"length\": " << experiment.test->info().length
              << ", \"forward_iterations_mean\": " << JsonNumber(result.forward.iterations_mean)
              << ", \"forward_iterations_max\": " << JsonNumber(result.forward.iterations_max)
              << ", \"forward_residual_max\": " << JsonNumber(result.forward.residual_max)
              << ", \"unconverged_samples\": " << result.forward.not_converged;
          if (args.gradient_check) {
            out << ", \"gradient_check\": ";
            if (check.ran) {
              out << "{\"cosine\": " << JsonNumber(check.cosine)
                  << ", \"relative_error\": " << JsonNumber(check.relative_error)
                  << ", \"reference_residual\": " << JsonNumber(check.reference_residual)
                  << ", \"reference_status\": " << JsonString(check.reference_status)
                  << ", \"spectral_radius\": " << JsonNumber(check.spectral_radius)
                  << ", \"used\": " << JsonString(check.used_brief) << "}";
            } else {
              out << "null";
            }
          }
          out << "}\n";
        } else {
          out << std::fixed << std::setprecision(4) << checkpoint_path << " (step " << state.step
              << "): test loss " << result.loss << ", test accuracy " << std::setprecision(2)
              << 100.0 * result.accuracy << "% over " << result.examples
              << " examples of length " << experiment.test->info().length;
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
        return kOk;
      });
}

int RunCompare(const CompareArgs& args, std::ostream& out, std::ostream& err) {
  Config config;
  return Guarded(
      err,
      [&] {
        config = Config::FromFile(StillpointSchema(), args.config_path, args.overrides);
        ValidateCompareVariants(config);
      },
      [&] {
        const CompareReport report = RunComparison(config, args.config_path, &out);
        out << "\n" << report.table << "\nreport: " << report.markdown_path << " and "
            << report.html_path << "\n";
        return kOk;
      });
}

int RunRetrieve(const RetrieveArgs& args, std::ostream& out, std::ostream& err) {
  Tensor patterns, queries;
  ForwardSolverOptions options = RetrievalSolverOptions();
  return Guarded(
      err,
      [&] {
        DType dtype;
        SP_CHECK(StringToDType(args.dtype, &dtype), "--dtype: '", args.dtype,
                 "' is not float32 or float64");
        SP_CHECK(StringToForwardSolverType(args.solver, &options.type), "--solver: unknown solver '",
                 args.solver, "'");
        SP_CHECK(args.beta > 0, "--beta must be positive, got ", args.beta);
        SP_CHECK(args.threads >= 1, "--threads must be >= 1");
        options.relative_tolerance = args.tolerance;
        options.max_iterations = static_cast<int>(args.max_iterations);
        std::string error;
        SP_CHECK(options.IsValid(&error), "solver options: ", error);
        patterns = ReadCsvMatrix(args.patterns_path, dtype);
        queries = ReadCsvMatrix(args.queries_path, dtype);
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

int RunConfigDoc(std::ostream& out) {
  out << ConfigReferenceMarkdown();
  return kOk;
}

}  // namespace stillpoint
