#include "training/trainer_options.h"

#include <limits>

#include "solvers/forward_options.h"  // kMaxSolverIterations
#include "training/config/option_schema.h"

namespace stillpoint {
namespace {

constexpr double kInf = std::numeric_limits<double>::max();
constexpr int64_t kBig = int64_t{1} << 40;

}  // namespace

const OptionFields<TrainerOptions>& TrainerOptions::Fields() {
  using O = TrainerOptions;
  static const auto* fields =
      &(new OptionFields<O>)
           ->Int("steps", &O::steps, 0, kBig, "Optimizer steps")
           .Int("batch_size", &O::batch_size, 1, 1 << 20, "Examples per step")
           .Int("shards", &O::shards, 1, 256,
                "Data-parallel shards of each batch: forward and backward of each shard run side "
                "by side on a replica of the model, the threads meeting once per step (faster for "
                "small models; results depend on the count, to rounding). Under mpirun, per rank: "
                "the batch is cut into ranks x shards (docs/scale.md)")
           .Double("clip_norm", &O::clip_norm, 0.0, kInf,
                   "Clip the global gradient norm to this (0: off)")
           .Int("pretrain_steps", &O::pretrain_steps, 0, kBig,
                "implicit: first train this many steps as the tied unroll of the same cell "
                "(model.unroll_steps), then switch to the implicit solve")
           .Int("eval_every", &O::eval_every, 0, kBig,
                "Evaluate on the held-out set every this many steps (0: only at the end)")
           .Int("checkpoint_every", &O::checkpoint_every, 0, kBig,
                "Write a checkpoint every this many steps (0: only at the end)")
           .Int("log_every", &O::log_every, 1, kBig, "Write a metrics row every this many steps")
           .Choice("on_nonfinite", &O::on_nonfinite, {"skip", "stop"},
                   "A non-finite loss or gradient: skip the step (parameters unchanged) or stop "
                   "the run; either way it is reported with the solver summary")
           .Int("max_skipped_steps", &O::max_skipped_steps, 1, kBig,
                "skip: stop after this many consecutive skipped steps")
           .Choice("on_unconverged", &O::on_unconverged, {"ignore", "warn", "stop"},
                   "An adjoint (backward) solve of any implicit layer (the model's own, an energy "
                   "attention's inner adjoint, a Hopfield readout's) that leaves samples above its "
                   "tolerance: ignore; warn (print the fraction of samples, the residual, the "
                   "tolerance and the solver the first time, then once per evaluation); stop "
                   "(end the run before the update, exit 1, with the report). INEXACT backward "
                   "modes (jfb, phantom, unrolled, tolerance 0) never count")
           .Double("progressive_loss.weight", &O::progressive_loss_weight, 0.0, 1.0,
                   "tied and implicit: Bansal et al.'s progressive loss, the weight alpha of L = "
                   "(1 - alpha) L(model) + alpha L(n + k): n steps of the cell from zero without "
                   "gradient (n uniform in [0, N - k), drawn per step), then k with gradient, "
                   "the loss of the head after them (0: off)")
           .Int("progressive_loss.steps", &O::progressive_loss_steps, 1, 1 << 20,
                "progressive loss: k, the steps with gradient")
           .Int("progressive_loss.iterations", &O::progressive_loss_iterations, 0, 1 << 20,
                "progressive loss: N, the most steps n + k (0: model.unroll_steps); must exceed "
                "progressive_loss.steps");
  return *fields;
}

TrainerOptions TrainerOptions::FromConfig(const Config& config) {
  return ReadOptionKeys(config, "train.", Fields());
}

const OptionFields<EvalOptions>& EvalOptions::Fields() {
  using O = EvalOptions;
  static const auto* fields =
      &(new OptionFields<O>)
           ->Int("batch_size", &O::batch_size, 1, 1 << 20, "Examples per evaluation batch")
           .Int("max_examples", &O::max_examples, 0, 1 << 30,
                "Evaluate on the first N held-out examples only (every evaluation: the periodic "
                "and final ones, the iteration sweep, other lengths and sizes), for quick runs; "
                "summary.json's test_examples says how many were evaluated (0: all of them)")
           .Int("gradient_check_batch_size", &O::gradient_check_batch_size, 0, 1 << 20,
                "Models with an implicit layer: at every evaluation, the gradient the trainer "
                "uses (its backward modes, warm starts and pretraining) is compared with a "
                "reference (ift, GMRES to 1e-10 in float64, 1e-5 in float32; no cosine when it "
                "does not converge) on a fixed probe batch of this many training examples (the "
                "one gradient check: the metrics, the progress output, summary.json and compare's "
                "report; 0: off)")
           .Int("max_iterations", &O::max_iterations, 0, kMaxSolverIterations,
                "Test-time forward solver budget (implicit) or unrolled steps (tied), for inputs "
                "of every length (`eval --iters`; 0: the budget rule of "
                "eval.iterations_per_token)")
           .Double("iterations_per_token", &O::iterations_per_token,
                   OptionBounds::Closed(0, 1 << 20),
                   "The budget rule when eval.max_iterations is 0: an input of L tokens gets "
                   "max(trained, ceil(r L)) iterations (implicit) or unrolled steps (tied) for r "
                   "> 0; with r = 0, the trained budget per training token, so an input k times "
                   "longer than the training inputs gets k times the trained budget")
           .DoubleList("iterations_sweep", &O::iterations_sweep, 1, 1 << 20,
                       "Test-time budgets for the accuracy-vs-iterations curve (implicit); "
                       "explicit/tied models are evaluated at matching depths")
           .DoubleList("lengths", &O::lengths, 2, 1 << 20,
                       "Sequence lengths for the length-extrapolation curve and, with "
                       "eval.iterations_sweep, the report's length x iterations heat map")
           .DoubleList("sizes", &O::sizes, 2, 1 << 20,
                       "Problem sizes (task.size, e.g. a maze's cells per side) for the report's "
                       "size x iterations heat map; replaces eval.lengths as its rows");
  return *fields;
}

EvalOptions EvalOptions::FromConfig(const Config& config) {
  return ReadOptionKeys(config, "eval.", Fields());
}

const OptionFields<LogOptions>& LogOptions::Fields() {
  using O = LogOptions;
  static const auto* fields =
      &(new OptionFields<O>)
           ->String("dir", &O::dir,
                    "Run directory (default: runs/<config file name>, or runs/<config file "
                    "name>-N when that holds a run)")
           .StringList("formats", &O::formats, {"csv", "jsonl"}, "Metrics file formats")
           .Choice("progress", &O::progress, {"auto", "bar", "lines", "none"},
                   "auto: a progress bar on a terminal, periodic lines otherwise")
           .Bool("plots", &O::plots, "Write SVG plots of the curves into the run directory");
  return *fields;
}

const std::vector<std::pair<std::string, std::string>>& ImplicitModelRegularization() {
  static const std::vector<std::pair<std::string, std::string>> keys = {
      {"spectral_radius_weight", "100"},
      {"spectral_radius_target", "0.5"},
      {"spectral_radius_frequency", "0.25"},
      {"spectral_radius_iterations", "5"}};
  return keys;
}

LogOptions LogOptions::FromConfig(const Config& config) {
  return ReadOptionKeys(config, "log.", Fields());
}

const OptionFields<RegularizationOptions>& RegularizationOptions::Fields() {
  using O = RegularizationOptions;
  static const auto* fields =
      &(new OptionFields<O>)
           ->Double("jacobian_weight", &O::jacobian_weight, 0.0, kInf,
                    "Weight of the Hutchinson estimate of ||J_f(z*)||_F^2 / numel added to the "
                    "loss")
           .Int("jacobian_probes", &O::jacobian_probes, 1, 64, "Probe vectors per estimate")
           .Double("jacobian_frequency", &O::jacobian_frequency, 0.0, 1.0,
                   "Probability of adding the Jacobian term at a step")
           .Int("jacobian_ramp_steps", &O::jacobian_ramp_steps, 0, kBig,
                "Steps after pretraining over which the Jacobian weight rises linearly from 0 "
                "to jacobian_weight (0: the full weight from the first step)")
           .Double("spectral_radius_weight", &O::spectral_radius_weight, 0.0, kInf,
                   "Weight of the spectral-radius penalty, the mean over samples of max(0, rho - "
                   "target)^2 with rho the Arnoldi estimate of the spectral radius of "
                   "J_f(z*) (0: off)")
           .Double("spectral_radius_target", &O::spectral_radius_target, 0.0, kInf,
                   "Radius below which the spectral-radius penalty is zero (the fixed_point "
                   "adjoint and Picard converge below 1)")
           .Int("spectral_radius_iterations", &O::spectral_radius_iterations, 1, 1000,
                "Arnoldi steps (one VJP each) of the penalty's direction")
           .Double("spectral_radius_frequency", &O::spectral_radius_frequency, 0.0, 1.0,
                   "Probability of adding the spectral-radius term at a step")
           .Int("spectral_radius_samples", &O::spectral_radius_samples, 0, kBig,
                "Samples of the batch (of each shard) the spectral-radius penalty is taken on at "
                "each step, chosen by spectral_radius_rows; drawn at random, an unbiased estimate "
                "of the batch's mean at that share of its memory (0 or at least the batch: every "
                "sample)")
           .Choice("spectral_radius_rows", &O::spectral_radius_rows, {"random", "slowest"},
                   "Which spectral_radius_samples rows: random (drawn without replacement), or "
                   "slowest (those whose forward solve of the step took the most iterations, "
                   "ties to the larger residual: the samples nearest to not converging); with every "
                   "sample penalised there is nothing to choose")
           .Double("attention_spectral_radius_weight", &O::attention_spectral_radius_weight, 0.0,
                   kInf,
                   "Weight of the spectral-radius penalty of every energy attention's update map "
                   "at its inner fixed point, each one's mean over samples of max(0, rho - "
                   "target)^2, summed over the cells' attentions (0: off). For the energy model "
                   "kind, whose block is the model's own fixed point, use spectral_radius_*")
           .Double("attention_spectral_radius_target", &O::attention_spectral_radius_target, 0.0,
                   kInf,
                   "Radius below which the attention penalty is zero (the inner fixed_point "
                   "adjoint and Picard converge below 1)")
           .Int("attention_spectral_radius_iterations", &O::attention_spectral_radius_iterations,
                1, 1000, "Arnoldi steps (one VJP of the inner update each) of its directions")
           .Double("correction_weight", &O::correction_weight, 0.0, kInf,
                   "implicit: weight of the fixed-point correction loss, the task loss on "
                   "intermediate forward iterates (0: off)")
           .Int("correction_iterates", &O::correction_iterates, 1, 64,
                "Forward iterates the correction loss is taken on (evenly spaced over the "
                "iterations the solve ran, its last included)")
           .Int("correction_steps", &O::correction_steps, 1, 64,
                "Recorded damped steps of the cell applied to each iterate before its loss")
           .Double("correction_tau", &O::correction_tau, OptionBounds::OpenClosed(0.0, 1.0),
                   "Damping of those steps: z <- (1 - tau) z + tau f(z)")
           .Double("correction_gamma", &O::correction_gamma, OptionBounds::OpenClosed(0.0, 1.0),
                   "Iterate i of N is weighted gamma^(N - 1 - i): the last has weight 1");
  return *fields;
}

bool RegularizationKeyApplies(const std::string& field, const std::string& kind,
                              const std::string& attention) {
  if (field.rfind("attention_", 0) == 0) return kind != "energy" && attention != "softmax";
  if (field.rfind("correction_", 0) == 0) return kind == "implicit";
  return kind == "implicit" || kind == "energy";
}

RegularizationOptions RegularizationOptions::FromConfig(const Config& config) {
  return ReadOptionKeys(config, "model.regularization.", Fields());
}

}  // namespace stillpoint
