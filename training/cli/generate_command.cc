#include "training/cli/generate_command.h"

#include <CLI/CLI.hpp>

#include <iomanip>
#include <optional>
#include <ostream>

#include "training/cli/cli_commands.h"
#include "training/generate.h"
#include "training/metrics.h"

namespace stillpoint {

CLI::App* AddGenerateCommand(CLI::App& app, GenerateArgs& args) {
  CLI::App* command = app.add_subcommand(
      "generate", "Continue a prompt with a trained character-level model (task.kind text)");
  command->add_option("run", args.run, "Run directory or .ckpt file")->required();
  command->add_option("--prompt", args.prompt, "The text to continue")->required();
  command->add_option("--tokens", args.tokens, "Characters to generate (>= 1)")
      ->capture_default_str();
  command->add_option("--temperature", args.temperature,
                      "Divides the logits before sampling (> 0; lower is more conservative)")
      ->capture_default_str();
  command->add_option("--top-k", args.top_k, "Sample among the K most likely characters (0: all)")
      ->capture_default_str();
  command->add_option("--seed", args.seed, "Seed of the sampling")->capture_default_str();
  command->add_flag("--no-warm-start", args.no_warm_start,
                    "Implicit models: start every solve from zero, not from the previous "
                    "position's fixed point");
  command->add_option("--keep", args.keep,
                      "When the window (task.context) is full, go on from the last K characters "
                      "(incremental reading; 0: half the window; context - 1: the full-window "
                      "path's windows)")
      ->capture_default_str();
  command->add_flag("--full-window", args.full_window,
                    "Read the whole window again for every character (the reference path) "
                    "instead of each character once");
  command->add_flag("--json", args.json, "Print the result as JSON");
  return command;
}

int RunGenerate(const GenerateArgs& args, std::ostream& out, std::ostream& err) {
  std::optional<TextGenerator> generator;
  GenerateOptions options;
  return GuardedCommand(
      err,
      [&] {
        options.tokens = args.tokens;
        options.temperature = args.temperature;
        options.top_k = args.top_k;
        SP_CHECK(args.seed >= 0, "--seed must be >= 0, got ", args.seed);
        options.seed = static_cast<uint64_t>(args.seed);
        options.warm_start = !args.no_warm_start;
        options.incremental = !args.full_window;
        options.keep = args.keep;
        std::string error;
        SP_CHECK(options.IsValid(&error), error);
        SP_CHECK(!args.prompt.empty(), "--prompt is empty; give at least one character");
        generator.emplace(LoadTextGenerator(args.run));
        generator->CheckOptions(options);  // --keep against the run's task.context
        // The prompt's own checks (UTF-8) are bad input too.
        generator->vocabulary().EncodeText(args.prompt, nullptr);
      },
      [&] {
        const GenerateResult result = generator->Generate(args.prompt, options);
        if (args.json) {
          out << "{\"prompt\": " << JsonString(args.prompt)
              << ", \"text\": " << JsonString(result.text)
              << ", \"tokens\": " << options.tokens
              << ", \"prompt_unknown\": " << result.prompt_unknown
              << ", \"prompt_dropped\": " << result.prompt_dropped
              << ", \"iterations_per_token\": "
              << (result.iterations.empty() ? "null" : JsonNumber(result.IterationsMean()))
              << ", \"mode\": " << JsonString(result.mode)
              << ", \"full_window_reason\": " << JsonString(result.full_window_reason)
              << ", \"positions\": " << result.positions
              << ", \"restarts\": " << result.restarts
              << ", \"seconds\": " << JsonNumber(result.seconds) << "}\n";
          return 0;
        }
        out << args.prompt << result.text << "\n";
        if (result.prompt_unknown > 0) {
          err << "note: " << result.prompt_unknown
              << " prompt characters are not in the run's vocabulary; the model read them as "
                 "the unknown symbol\n";
        }
        if (result.prompt_dropped > 0) {
          err << "note: the model sees the last task.context characters; the first "
              << result.prompt_dropped << " of the prompt were not read\n";
        }
        err << std::fixed << std::setprecision(3) << options.tokens << " characters in "
            << result.seconds << " s (" << result.mode;
        if (!result.full_window_reason.empty()) err << ": " << result.full_window_reason;
        err << ", " << result.positions << " positions computed)";
        if (!result.iterations.empty()) {
          err << std::setprecision(2) << ", " << result.IterationsMean()
              << " forward iterations per character";
        }
        err << "\n";
        return 0;
      });
}

}  // namespace stillpoint
