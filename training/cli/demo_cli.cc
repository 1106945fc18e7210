#include "training/cli/demo_cli.h"

#include <CLI/CLI.hpp>

#include <exception>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "training/cli/cli_commands.h"
#include "training/cli/exit_codes.h"
#include "training/config/config.h"
#include "training/demos/correction_demo.h"
#include "training/demos/exchangeable_demo.h"
#include "training/demos/hidden_state_demo.h"

namespace stillpoint {
namespace {

// check: option validation (any error is bad input); work: a ConfigError
// (an unusable run, input or output directory) is bad input, anything else
// a failure.
int Guard(std::ostream& err, const std::function<void()>& check,
          const std::function<void()>& work) {
  return GuardedCommand(err, check, [&] {
    work();
    return kOk;
  });
}

}  // namespace

struct SeedDemoCommands::State {
  CLI::App* demo = nullptr;
  CLI::App* exchangeable = nullptr;
  CLI::App* hidden_state = nullptr;
  CLI::App* correction = nullptr;
  CLI::App* correct = nullptr;
  ExchangeableDemoOptions exchangeable_options;
  HiddenStateDemoOptions hidden_state_options;
  CorrectionDemoOptions correction_options;
  CorrectArgs correct_args;
};

namespace {

CLI::App* AddExchangeableDemo(CLI::App& demo, ExchangeableDemoOptions& x) {
  CLI::App* command = demo.add_subcommand(
      "exchangeable",
      "Seed 003: attention over L exchangeable tokens converges to the kernel-weighted "
      "conditional mean like L^-1/2 (dot-product and RBF logits)");
  command->add_option("--out", x.out_dir, "Output directory")->required();
  command->add_flag("--overwrite", x.overwrite, "Write into an --out directory that holds files");
  command->add_option("--min-tokens", x.min_tokens, "Smallest L")->capture_default_str();
  command->add_option("--max-tokens", x.max_tokens, "Largest L")->capture_default_str();
  command->add_option("--trials", x.trials, "Trials (latents) per L")
      ->capture_default_str();
  command->add_option("--rbf-bandwidth", x.rbf_bandwidth, "Inverse bandwidth b")
      ->capture_default_str();
  command->add_option("--seed", x.seed, "Random seed")->capture_default_str();
  return command;
}

CLI::App* AddHiddenStateDemo(CLI::App& demo, HiddenStateDemoOptions& h) {
  CLI::App* command = demo.add_subcommand(
      "hidden-state",
      "Seeds 000/002: hidden-state distribution over an implicit solve and the layer-norm "
      "equilibrium's convergence rate against lambda2/lambda1");
  command->add_option("--out", h.out_dir, "Output directory")->required();
  command->add_flag("--overwrite", h.overwrite, "Write into an --out directory that holds files");
  command->add_option("--run", h.run,
                             "A trained run (directory or .ckpt) with an implicit layer; "
                             "without it, the layer-norm equilibrium model");
  command->add_option("--dim", h.dim, "State width D (without --run)")
      ->capture_default_str();
  command->add_option("--tokens", h.tokens, "Tokens (without --run)")
      ->capture_default_str();
  command->add_option("--iterations", h.iterations, "Iterations recorded")
      ->capture_default_str();
  command->add_option("--burn-in", h.burn_in, "Iterations left out of the rate")
      ->capture_default_str();
  command->add_option("--examples", h.examples, "Held-out examples (with --run)")
      ->capture_default_str();
  command->add_option("--seed", h.seed, "Random seed")->capture_default_str();
  return command;
}

CLI::App* AddCorrectionDemo(CLI::App& demo, CorrectionDemoOptions& c) {
  CLI::App* command = demo.add_subcommand(
      "correction",
      "Seed 004: clamped-value belief propagation (accuracy as positions are clamped) and "
      "online key adaptation on shifted digits");
  command->add_option("--out", c.out_dir, "Output directory")->required();
  command->add_flag("--overwrite", c.overwrite, "Write into an --out directory that holds files");
  command->add_option("--train-steps", c.train_steps, "Training steps of the segment model")
      ->capture_default_str();
  command->add_option("--observation-accuracy", c.observation_accuracy,
                           "Probability that a token shows its segment's label")
      ->capture_default_str();
  command->add_option("--belief-iterations", c.belief_iterations,
                           "EM iterations of the belief propagation")
      ->capture_default_str();
  command->add_option("--value-prior-precision", c.value_prior_precision,
                           "lambda_mu: precision of the prior around the trained values")
      ->capture_default_str();
  command->add_option("--prototype-steps", c.prototype_steps,
                           "Training steps of the digits prototype classifier")
      ->capture_default_str();
  command->add_option("--shift", c.shift_offset,
                           "Offset added to every pixel of the shifted digits (max intensity 1)")
      ->capture_default_str();
  command->add_option("--adaptation-iterations", c.adaptation_iterations,
                           "EM iterations of the key adaptation")
      ->capture_default_str();
  command->add_option("--key-prior-precision", c.key_prior_precision,
                           "lambda_xi: precision of the prior around the trained keys")
      ->capture_default_str();
  command->add_option("--seed", c.seed, "Random seed")->capture_default_str();
  return command;
}

CLI::App* AddCorrectCommand(CLI::App& app, CorrectArgs& r) {
  CLI::App* command = app.add_subcommand(
      "correct",
      "Clamp the values of some positions of one sequence and propagate them (clamped-value "
      "belief propagation) through a trained probabilistic-attention run");
  command->add_option("run", r.run, "Run directory or .ckpt file")->required();
  command->add_option("--input", r.input, "Token ids, separated by spaces or commas")
      ->required();
  command
      ->add_option("--clamp", r.clamps,
                   "POS=VALUE: position POS is known to be token VALUE (repeat for more)")
      ->required();
  command->add_option("--iterations", r.iterations, "EM iterations of the belief propagation")
      ->capture_default_str();
  command->add_option("--value-prior-precision", r.value_prior_precision,
                        "lambda_mu: precision of the prior around the trained values")
      ->capture_default_str();
  return command;
}

}  // namespace

SeedDemoCommands::SeedDemoCommands(CLI::App& app) : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.demo = app.add_subcommand(
      "demo", "Reproduce a seed paper's claim: CSV, SVG plots and summary.json (docs/seeds.md)");
  // Not require_subcommand: an unknown demo name is kept as an extra, so
  // Run can name it (CLI11 would only say that a subcommand is required).
  s.demo->allow_extras();
  s.exchangeable = AddExchangeableDemo(*s.demo, s.exchangeable_options);
  s.hidden_state = AddHiddenStateDemo(*s.demo, s.hidden_state_options);
  s.correction = AddCorrectionDemo(*s.demo, s.correction_options);
  s.correct = AddCorrectCommand(app, s.correct_args);
}

SeedDemoCommands::~SeedDemoCommands() = default;

bool SeedDemoCommands::Selected() const { return *state_->demo || *state_->correct; }

int SeedDemoCommands::Run(std::ostream& out, std::ostream& err) const {
  const State& s = *state_;
  // The demo command keeps unknown words as extras (see above); after a
  // demo's name they are unknown options or stray arguments of that demo.
  for (const CLI::App* demo : {s.exchangeable, s.hidden_state, s.correction}) {
    if (!*demo) continue;
    std::vector<std::string> extras = s.demo->remaining();
    const std::vector<std::string> own = demo->remaining();
    extras.insert(extras.end(), own.begin(), own.end());
    if (!extras.empty()) {
      err << "error: demo " << demo->get_name() << ": unknown option or argument '"
          << extras.front() << "' (stillpoint demo " << demo->get_name() << " --help)\n";
      return kBadInput;
    }
  }
  if (*s.exchangeable) {
    return Guard(
        err, [&] { CheckExchangeableDemoOptions(s.exchangeable_options); },
        [&] { RunExchangeableDemo(s.exchangeable_options, out); });
  }
  if (*s.hidden_state) {
    return Guard(
        err, [&] { CheckHiddenStateDemoOptions(s.hidden_state_options); },
        [&] { RunHiddenStateDemo(s.hidden_state_options, out); });
  }
  if (*s.correction) {
    return Guard(
        err, [&] { CheckCorrectionDemoOptions(s.correction_options); },
        [&] { RunCorrectionDemo(s.correction_options, out); });
  }
  if (*s.demo) {
    std::vector<std::string> names;
    for (const CLI::App* sub : s.demo->get_subcommands({})) names.push_back(sub->get_name());
    std::string known;
    for (const std::string& name : names) known += (known.empty() ? "" : ", ") + name;
    const std::vector<std::string> extras = s.demo->remaining();
    if (extras.empty()) {
      err << "error: demo needs a name: " << known << " (stillpoint demo --help)\n";
    } else {
      const std::string closest = ClosestName(extras.front(), names);
      err << "error: unknown demo '" << extras.front() << "'"
          << (closest.empty() ? "" : " (did you mean '" + closest + "'?)") << "; the demos are "
          << known << " (stillpoint demo --help)\n";
    }
    return kBadInput;
  }
  if (*s.correct) {
    return Guard(err, [] {}, [&] { RunCorrect(s.correct_args, out); });
  }
  return kBadInput;
}

}  // namespace stillpoint
