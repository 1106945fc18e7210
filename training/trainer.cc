#include "training/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>

#include "framework/buffer_pool.h"
#include "framework/ops.h"
#include "framework/parallel.h"
#include "training/attention_report.h"
#include "training/checkpoint.h"
#include "training/config_schema.h"
#include "training/distributed.h"
#include "training/distributed_training.h"
#include "training/gradient_reducer.h"
#include "training/gradient_check.h"
#include "training/metrics.h"
#include "training/optimizer.h"
#include "training/output_policy.h"
#include "training/progress.h"
#include "training/resume.h"
#include "training/run_directory.h"
#include "training/schedule.h"
#include "training/signals.h"
#include "training/summary_json.h"
#include "training/text_corpus.h"
#include "training/svg_plot.h"
#include "training/train_hooks.h"
#include "training/train_step.h"
#include "training/trainer_options.h"

namespace stillpoint {
namespace {

using Clock = std::chrono::steady_clock;

const std::vector<std::string> kColumns = {
    "step",           "lr",           "loss",          "accuracy",      "grad_norm",
    "fwd_iters_mean", "fwd_iters_max", "fwd_residual", "fwd_unconverged", "bwd_iters_mean",
    "bwd_iters_max",  "bwd_residual", "bwd_unconverged", "step_ms",     "peak_rss_mb",
    "pool_peak_mb",   "skipped",      "test_loss",     "test_accuracy", "test_fwd_iters_mean",
    "grad_cos",       "grad_rel_err", "spectral_radius", "spectral_eigenvalue", "elapsed_s",
    "path_independence_cosine", "path_independence_agreement"};

bool AllFinite(const NamedVars& parameters) {
  for (const auto& [name, p] : parameters) {
    if (HasNonFinite(p.value())) return false;
  }
  return true;
}

}  // namespace

std::string TrainSummary::BriefReport() const {
  std::ostringstream out;
  out << std::fixed << std::setprecision(4) << "steps " << steps << ", train loss "
      << final_train_loss;
  if (final_eval.examples > 0) {
    out << ", test loss " << final_eval.loss;
    if (language_model) out << " nats/char (" << test_bpc << " bpc)";
    out << ", test accuracy " << std::setprecision(2) << 100.0 * final_eval.accuracy << "%";
  } else {
    out << ", no evaluation ran";
  }
  out << ", " << std::setprecision(1) << 1000.0 * seconds_per_step << " ms/step, peak RSS "
      << peak_rss_mb << " MiB";
  if (forward.iterations_max > 0) {
    out << ", forward iterations " << forward.iterations_mean << " (max "
        << forward.iterations_max << ")";
  }
  if (skipped_steps > 0) out << ", " << skipped_steps << " skipped steps";
  if (equilibrium.applies) out << ", equilibrium " << VerdictCell(equilibrium.verdict);
  if (stopped_early) out << " [stopped: " << stop_reason << "]";
  if (stop_signal != 0) out << " [" << stop_reason << "]";
  return out.str();
}

double PeakResidentMegabytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) {
      std::istringstream fields(line.substr(6));
      double kib = 0;
      fields >> kib;
      return kib / 1024.0;
    }
  }
  return 0.0;
}

std::string RunDirectory(const Config& config, const std::string& config_path) {
  const std::string dir = config.GetString("log.dir");
  if (!dir.empty()) return dir;
  const std::string stem =
      config_path.empty() ? "run" : std::filesystem::path(config_path).stem().string();
  return (std::filesystem::path("runs") / stem).string();
}

void CheckTrainingConfig(const Config& c) {
  // The regularisers are taken at the model's own fixed point: a key of
  // model.regularization.* set away from its default for a model without one
  // (or, for the correction loss, without a solved cell) would change
  // nothing, so it is refused by name rather than ignored.
  const std::string kind = c.GetString("model.kind");
  const RegularizationOptions given = RegularizationOptions::FromConfig(c);
  const RegularizationOptions defaults;
  for (const auto& field : RegularizationOptions::Fields().fields()) {
    if (!field.in_config || field.Text(given) == field.Text(defaults)) continue;
    const std::string key = "model.regularization." + field.name;
    const bool needs_cell = field.name.rfind("correction_", 0) == 0;
    const bool fits = kind == "implicit" || (!needs_cell && kind == "energy");
    if (!fits) {
      throw ConfigError(c.Origin(key) + ": " + key + " needs model.kind implicit" +
                        (needs_cell ? std::string(" (the correction loss is taken on the "
                                                  "implicit solve's iterates)")
                                    : std::string(" or energy (a fixed point of the model's "
                                                  "own)")) +
                        ", not " + kind);
    }
  }
  if (c.GetDouble("train.progressive_loss.weight") > 0) {
    const int64_t k = c.GetInt("train.progressive_loss.steps");
    const int64_t total = c.GetInt("train.progressive_loss.iterations") > 0
                              ? c.GetInt("train.progressive_loss.iterations")
                              : c.GetInt("model.unroll_steps");
    if (total <= k) {
      throw ConfigError(c.Origin("train.progressive_loss.steps") +
                        ": train.progressive_loss.steps (" + std::to_string(k) +
                        ") must be below the most steps N = " + std::to_string(total) +
                        " (train.progressive_loss.iterations, 0: model.unroll_steps), so that n "
                        "can be drawn from [0, N - k)");
    }
  }
  if (c.GetStringList("log.formats").empty()) {
    throw ConfigError(c.Origin("log.formats") +
                      ": log.formats must name at least one of csv, jsonl");
  }
  const int64_t shards = c.GetInt("train.shards");
  if (shards > c.GetInt("train.batch_size")) {
    throw ConfigError(c.Origin("train.shards") + ": train.shards (" + std::to_string(shards) +
                      ") is more than train.batch_size (" +
                      std::to_string(c.GetInt("train.batch_size")) + ")");
  }
  // Under mpirun every rank runs train.shards shards of each batch.
  if (shards * WorldSize() > c.GetInt("train.batch_size")) {
    throw ConfigError(c.Origin("train.batch_size") + ": a batch of " +
                      std::to_string(c.GetInt("train.batch_size")) + " rows cannot be cut into " +
                      std::to_string(WorldSize()) + " ranks x train.shards " +
                      std::to_string(shards) + " = " + std::to_string(shards * WorldSize()) +
                      " shards (each shard needs a row); use fewer ranks or a larger batch");
  }
}

void CheckModelKindKeys(const Config& c) {
  const std::string kind = c.GetString("model.kind");
  if (c.GetString("model.solver.init") != "zeros" && kind != "implicit" && kind != "energy") {
    throw ConfigError(c.Origin("model.solver.init") + ": model.solver.init " +
                      c.GetString("model.solver.init") +
                      " needs model.kind implicit or energy (a model that solves for its state), "
                      "not " + kind);
  }
  if (c.GetDouble("train.progressive_loss.weight") > 0 && kind != "tied" && kind != "implicit") {
    throw ConfigError(c.Origin("train.progressive_loss.weight") +
                      ": train.progressive_loss.weight needs model.kind tied or implicit (a cell "
                      "that can run for any number of steps), not " + kind);
  }
  if (c.GetString("model.input_injection") != "every_step" && kind != "explicit" &&
      kind != "tied") {
    throw ConfigError(c.Origin("model.input_injection") + ": model.input_injection " +
                      c.GetString("model.input_injection") +
                      " needs model.kind explicit or tied: the fixed point of an " + kind +
                      " model would not depend on its input");
  }
}

TrainSummary Train(Experiment& e, const TrainOptions& options) {
  const Config& c = e.config;
  SetNumThreads(static_cast<int>(c.GetInt("threads")));
  // Checked before the run directory is touched.
  CheckTrainingConfig(c);
  const int64_t shards = c.GetInt("train.shards");
  // A job of several ranks (mpirun): rank 0 alone writes the run directory.
  const RankShards rank_shards = RankShardsOf(shards);
  const bool ranks = WorldSize() > 1;
  const bool writes = IsMainRank();
  SequenceModel& model = *e.model;
  TrainSummary summary;
  summary.run_dir = RunDirectory(c, e.config_path);
  summary.provenance = CollectProvenance(c);
  // Held until Train returns: one writer per run directory.
  std::optional<RunDirectoryLock> lock;
  OnMainRank([&] {
    lock.emplace(summary.run_dir);
    for (const std::string& path : RemoveStaleTemporaries(summary.run_dir)) {
      if (options.progress) {
        *options.progress << "removed " << path << ", left by a writer that was killed\n";
      }
    }
  });
  const std::string checkpoint_path = summary.run_dir + "/checkpoint.ckpt";
  const bool resumed = options.resume && std::filesystem::exists(checkpoint_path);
  CheckpointState resume_state;
  if (resumed) {
    std::vector<std::string> forced;
    resume_state = LoadCheckpointForResume(checkpoint_path, CheckpointConfig(c, rank_shards),
                                           options.force, &forced);
    for (const std::string& line : forced) {
      if (options.progress) *options.progress << "warning: --force: " << line << "\n";
    }
    if (resume_state.step >= c.GetInt("train.steps")) {
      summary.already_complete = true;
      summary.steps = resume_state.step;
      summary.num_parameters = model.NumParameters();
      return summary;
    }
  } else {
    // A resume with no checkpoint starts afresh in the run it names.
    OnMainRank([&] {
      CheckRunDirectory(summary.run_dir,
                        options.overwrite || (options.resume && HoldsARun(summary.run_dir)),
                        e.config_path);
      if (options.overwrite || options.resume) RemoveRunFiles(summary.run_dir);
    });
  }

  const TrainerOptions trainer = TrainerOptions::FromConfig(c);
  const EvalOptions eval_options = EvalOptions::FromConfig(c);
  const LogOptions log_options = LogOptions::FromConfig(c);
  const RegularizationOptions regularization = RegularizationOptions::FromConfig(c);
  const NamedVars parameters = model.named_parameters();
  summary.num_parameters = model.NumParameters();
  const OptimizerOptions optimizer_options = OptimizerOptionsFromConfig(c);
  auto optimizer = Optimizer::Create(optimizer_options, parameters);
  const ScheduleOptions schedule = ScheduleOptionsFromConfig(c);
  const uint64_t seed = static_cast<uint64_t>(c.GetInt("seed"));
  Batcher batcher(*e.train, trainer.batch_size, seed, e.dtype);
  Rng rng(seed + 7919);

  int64_t step = 0;
  if (resumed) {
    const CheckpointState& state = resume_state;
    try {
      model.LoadParameters(state.model);
      optimizer->LoadState(state.optimizer);
    } catch (const Error& error) {
      // Reached with --force past a config difference: the checkpoint is
      // bad input for this model, not a runtime failure.
      throw ConfigError(checkpoint_path + ": does not fit this model: " + error.what());
    }
    // A checksummed file can still hold metadata that does not fit this
    // run: bad input naming the file, not an internal error.
    if (state.data_offset > e.train->size()) {
      throw ConfigError(checkpoint_path + ": its data position (offset " +
                        std::to_string(state.data_offset) + " in epoch " +
                        std::to_string(state.data_epoch) + ") lies beyond the training set of " +
                        std::to_string(e.train->size()) +
                        " examples; the checkpoint is of another dataset or damaged");
    }
    batcher.Restore({state.data_epoch, state.data_offset});
    if (!rng.LoadState(state.rng_state)) {
      throw ConfigError(checkpoint_path + ": its random number generator state does not parse; "
                        "the checkpoint is damaged");
    }
    step = state.step;
    // Rows written after the checkpoint (before a crash) are written again.
    if (writes) DropMetricsAfterStep(summary.run_dir, step);
  }
  std::vector<std::string> columns = kColumns;
  columns.insert(columns.end(), AttentionColumns().begin(), AttentionColumns().end());
  if (e.language_model) columns.push_back("test_bpc");
  MetricsWriter metrics =
      writes ? MetricsWriter(summary.run_dir, columns, resumed, log_options.formats)
             : MetricsWriter::Discard(columns);

  TrainStepOptions step_options;
  step_options.shards = shards;
  step_options.clip_norm = trainer.clip_norm;
  step_options.hold_unconverged = trainer.on_unconverged == "stop";
  // A comparison's variants of other kinds ignore the progressive loss.
  const bool progressive = trainer.progressive_loss_weight > 0.0 &&
                           (model.options().kind == ModelKind::kTied ||
                            model.options().kind == ModelKind::kImplicit);
  step_options.task_loss_weight = progressive ? 1.0 - trainer.progressive_loss_weight : 1.0;
  SP_CHECK(shards == 1 || e.make_replica != nullptr,
           "Train: the experiment cannot build model replicas");
  TrainStep train_step(e.model, *optimizer, step_options,
                       [&e, first = rank_shards.first](int64_t replica) {
                         return e.make_replica(first + replica);
                       });
  std::unique_ptr<GradientReducer> reducer;
  if (ranks) {
    reducer = std::make_unique<GradientReducer>(model.parameters(), shards);
    train_step.EnableRanks(
        rank_shards.first, rank_shards.total, reducer.get(),
        [&step](const std::string& failure, const std::vector<double>& shard_losses,
                std::pair<int64_t, int64_t> correct_counted, const SolverStats& forward,
                const SolverStats& backward) {
          return ExchangeStepTotals(step + 1, failure, shard_losses, correct_counted, forward,
                                    backward);
        });
    // This rank's first shard draws the dropout masks of that shard's replica.
    if (rank_shards.first > 0) {
      const std::shared_ptr<SequenceModel> first = e.make_replica(rank_shards.first);
      RestoreRandomStreamState(RandomStreamState({first.get()}), {&model}, "rank replica");
    }
  }
  auto save_checkpoint = [&] {
    if (!AllFinite(parameters)) return false;  // never replace a good one with NaNs
    CheckpointState state;
    state.step = step;
    const Batcher::Position position = batcher.position();
    state.data_epoch = position.epoch;
    state.data_offset = position.offset;
    state.rng_state = rng.SaveState();
    state.config_yaml = CheckpointConfig(c, rank_shards).ToYaml();
    state.model = model.NamedValues();
    state.optimizer = optimizer->SaveState();
    // Every rank's shards, named by global shard (collective).
    GatherShardState(train_step.models(), rank_shards.first, &state.solver_state,
                     &state.random_streams);
    if (writes) SaveCheckpoint(checkpoint_path, state);
    ++summary.checkpoints_written;
    return true;
  };
  if (resumed) {
    SelectShardState(resume_state.solver_state, resume_state.random_streams, rank_shards.first,
                     rank_shards.count, &resume_state.solver_state, &resume_state.random_streams);
    RestoreWarmStartState(resume_state.solver_state, train_step.models(), checkpoint_path);
    if (!RestoreRandomStreamState(resume_state.random_streams, train_step.models(),
                                  checkpoint_path) &&
        c.GetDouble("model.dropout") > 0 && options.progress) {
      *options.progress << "warning: the dropout masks after this resume differ from those of an "
                           "uninterrupted run (the checkpoint predates the dropout streams)\n";
    }
  }
  // Written once the checkpoint (if any) has loaded into this model.
  if (writes) {
    WriteTextFile(summary.run_dir + "/config.yaml", c.ToYaml());
    for (const auto& [name, content] : e.run_files) {
      WriteTextFile(summary.run_dir + "/" + name, content);
    }
  }
  const bool implicit = model.implicit() != nullptr;
  const int64_t check_size =
      HasImplicitLayer(model) ? eval_options.gradient_check_batch_size : 0;

  Progress progress(options.progress, log_options.progress, trainer.steps, step);
  SolveCountHook solve_count_hook;
  NonFiniteHook nonfinite_hook(trainer, progress, metrics);
  UnconvergedHook unconverged_hook(trainer, progress);
  SummaryHook summary_hook(model);
  LogHook::Context log_context;
  log_context.trainer = trainer;
  log_context.eval = eval_options;
  log_context.log = log_options;
  log_context.model = &model;
  log_context.test = e.test.get();
  log_context.dtype = e.dtype;
  log_context.language_model = e.language_model;
  if (check_size > 0) {
    log_context.gradient_check_batch = GradientProbeBatch(*e.train, check_size, e.dtype);
  }
  log_context.run_dir = summary.run_dir;
  log_context.before_eval = [&] {
    if (implicit) model.SetDepthOverride(0);
  };
  log_context.learning_rate = [&] { return optimizer->learning_rate(); };
  LogHook log_hook(std::move(log_context), progress, metrics, &unconverged_hook);
  CheckpointHook checkpoint_hook(trainer.checkpoint_every, save_checkpoint);
  const std::vector<TrainHook*> hooks = {&solve_count_hook, &nonfinite_hook, &unconverged_hook,
                                         &summary_hook, &log_hook, &checkpoint_hook};
  // The regularisers of model.regularization.*, each an extra loss at the
  // model's fixed point after pretraining; the Jacobian and spectral-radius
  // terms at a random fraction of the steps.
  // The Jacobian weight's ramp: the fraction of jacobian_weight at the
  // step being taken (set by extra_loss_at before the step runs).
  double jacobian_ramp = 1.0;
  const ExtraLoss jacobian_penalty = [&](SequenceModel& replica, const Batch& rows, Rng& draws,
                                         double scale) {
    return mul_scalar(
        replica.FixedPointJacobianPenalty(EmbedBatch(replica, rows),
                                          static_cast<int>(regularization.jacobian_probes), draws),
        regularization.jacobian_weight * jacobian_ramp * scale);
  };
  SpectralRadiusOptions spectral_estimate;
  spectral_estimate.max_iterations = static_cast<int>(regularization.spectral_radius_iterations);
  spectral_estimate.tolerance = 1e-3;
  const ExtraLoss spectral_penalty = [&](SequenceModel& replica, const Batch& rows, Rng&,
                                         double scale) {
    return mul_scalar(replica.FixedPointSpectralRadiusPenalty(
                          EmbedBatch(replica, rows), regularization.spectral_radius_target,
                          spectral_estimate),
                      regularization.spectral_radius_weight * scale);
  };
  FixedPointCorrectionOptions correction;
  correction.steps = static_cast<int>(regularization.correction_steps);
  correction.tau = regularization.correction_tau;
  correction.gamma = regularization.correction_gamma;
  const ExtraLoss correction_loss = [&](SequenceModel& replica, const Batch& rows, Rng&,
                                        double scale) {
    const auto task_loss = [&rows](const Var& logits) {
      const int64_t classes = logits.dim(-1);
      return BatchLoss(reshape(logits, Shape{logits.numel() / classes, classes}), rows);
    };
    return mul_scalar(
        replica.FixedPointCorrectionLoss(EmbedBatch(replica, rows), task_loss, correction),
        regularization.correction_weight * scale);
  };
  // Bansal et al.'s progressive loss: n detached steps of the cell, n
  // uniform in [0, N - k), then k with gradient (the rest of the weight is
  // the task loss's, TrainStepOptions::task_loss_weight).
  const int64_t progressive_total = trainer.progressive_loss_iterations > 0
                                        ? trainer.progressive_loss_iterations
                                        : model.options().unroll_steps;
  const ExtraLoss progressive_loss = [&](SequenceModel& replica, const Batch& rows, Rng& draws,
                                         double scale) {
    const int64_t k = trainer.progressive_loss_steps;
    const int64_t n = draws.UniformInt(progressive_total - k);
    replica.SetGridWidth(rows.grid_width);
    const Var logits = replica.ProgressiveLogits(EmbedBatch(replica, rows), n, k);
    const int64_t classes = logits.dim(-1);
    return mul_scalar(BatchLoss(reshape(logits, Shape{logits.numel() / classes, classes}), rows),
                      trainer.progressive_loss_weight * scale);
  };
  const auto extra_loss_at = [&](int64_t at) -> ExtraLoss {
    const bool regularized = implicit && at >= trainer.pretrain_steps;
    if (!regularized) return progressive ? progressive_loss : nullptr;
    std::vector<const ExtraLoss*> terms;
    if (progressive) terms.push_back(&progressive_loss);
    // A frequency draw is taken only for a term that is on, so a run
    // without it keeps the random stream it had before the term existed.
    if (regularization.jacobian_weight > 0 &&
        rng.Uniform() < regularization.jacobian_frequency) {
      const int64_t ramp = regularization.jacobian_ramp_steps;
      jacobian_ramp = ramp == 0 ? 1.0
                                : std::min(1.0, static_cast<double>(at - trainer.pretrain_steps + 1) /
                                                    static_cast<double>(ramp));
      terms.push_back(&jacobian_penalty);
    }
    if (regularization.spectral_radius_weight > 0 &&
        rng.Uniform() < regularization.spectral_radius_frequency) {
      terms.push_back(&spectral_penalty);
    }
    if (regularization.correction_weight > 0) terms.push_back(&correction_loss);
    if (terms.empty()) return nullptr;
    if (terms.size() == 1) return *terms.front();
    return [terms](SequenceModel& replica, const Batch& rows, Rng& draws, double scale) {
      Var total = (*terms.front())(replica, rows, draws, scale);
      for (size_t i = 1; i < terms.size(); ++i) {
        total = add(total, (*terms[i])(replica, rows, draws, scale));
      }
      return total;
    };
  };

  ResetBufferPoolStats();
  TrainLoopState state;
  state.total_steps = trainer.steps;
  state.summary = &summary;
  int64_t steps_this_call = 0;
  const auto loop_start = Clock::now();
  while (step < trainer.steps &&
         (options.stop_after_steps == 0 || steps_this_call < options.stop_after_steps) &&
         AgreedStopRequest() == 0 && !state.stop) {
    const auto start = Clock::now();
    optimizer->set_learning_rate(LearningRateAt(schedule, optimizer_options.learning_rate, step));
    if (implicit) {
      train_step.SetDepthOverride(step < trainer.pretrain_steps ? model.options().unroll_steps
                                                                : 0);
    }
    try {
      state.result = train_step.Run(batcher.Next(), extra_loss_at(step), &rng);
    } catch (const RankFailure& rank_failure) {
      summary.stopped_early = true;
      summary.stop_reason = "step " + std::to_string(step + 1) + ": " + rank_failure.what();
      progress.Message(summary.stop_reason + "; every rank stops");
      break;
    }
    state.step_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    state.elapsed_seconds = std::chrono::duration<double>(Clock::now() - loop_start).count();
    state.step = ++step;
    ++steps_this_call;
    for (TrainHook* hook : hooks) {
      if (!hook->StepEnded(state)) break;
    }
  }
  if (implicit) model.SetDepthOverride(0);
  progress.Finish();
  save_checkpoint();
  if (AgreedStopRequest() != 0 && step < trainer.steps) {
    summary.stop_signal = AgreedStopRequest();
    summary.stop_reason = std::string("stopped by ") + SignalName(summary.stop_signal) +
                          " at step " + std::to_string(step) + " of " +
                          std::to_string(trainer.steps);
  }

  summary.steps = step;
  summary.seconds_per_step = summary_hook.MedianStepSeconds();
  summary.peak_rss_mb = PeakResidentMegabytes();
  summary.pool_peak_mb = GetBufferPoolStats().peak_bytes_in_use / 1048576.0;
  if (summary.final_eval.examples == 0 && step >= trainer.steps) {
    summary.final_eval = Evaluate(model, *e.test, eval_options.batch_size, e.dtype);
  }
  summary.language_model = e.language_model;
  summary.test_unknown_symbols = e.test_unknown_symbols;
  if (e.language_model) summary.test_bpc = BitsPerSymbol(summary.final_eval.loss);
  summary.equilibrium = AssessEquilibrium(HasImplicitLayer(model), summary.solve_counts,
                                          summary.equilibrium_monitor,
                                          HealthOptions::FromConfig(c));
  if (summary.equilibrium.applies) progress.Message("equilibrium: " + summary.equilibrium.verdict);
  if (!writes) return summary;  // rank 0 writes the run directory
  if (log_options.plots) LogHook::WritePlots(summary.run_dir);
  const bool classification = !e.test->info().per_token_targets;
  if (classification && !ranks && step >= trainer.steps) {
    summary.confusion = ComputeConfusion(model, *e.test, eval_options.batch_size, e.dtype,
                                         e.class_names);
    if (log_options.plots) {
      WriteTextFile(summary.run_dir + "/confusion.svg",
                    ConfusionSvg(summary.confusion, "Held-out confusion matrix"));
    }
  }
  summary.provenance.end_time = UtcNow();
  WriteTextFile(summary.run_dir + "/summary.json", SummaryJson(summary));
  std::ostringstream md;
  md << "# Run summary\n\n" << summary.BriefReport() << "\n\nModel: " << model.Name() << ", "
     << summary.num_parameters << " parameters.\n\nProvenance: "
     << ProvenanceMarkdown(summary.provenance) << "\n";
  if (!summary.forward.brief.empty()) {
    md << "\nLast forward solve: " << summary.forward.brief << "\n\nForward residual "
       << ResidualCell(summary.forward) << "; samples: " << StatusCell(summary.forward) << "\n";
  }
  if (!summary.backward.brief.empty()) {
    md << "\nLast backward solve: " << summary.backward.brief << "\n\nBackward residual "
       << ResidualCell(summary.backward) << "; samples: " << StatusCell(summary.backward) << "\n";
  }
  if (summary.equilibrium.applies) {
    md << "\nEquilibrium: " << summary.equilibrium.verdict << "\n";
  }
  if (summary.gradient_check.ran) {
    md << "\nAt step " << summary.gradient_check_step << ", " << summary.gradient_check.Line()
       << "\n";
  }
  if (!summary.attention_forward.brief.empty()) {
    md << "\nEnergy attention, last inner solve (worst of the model's attentions): "
       << summary.attention_forward.brief << "\n";
  }
  if (!summary.attention_backward.brief.empty()) {
    md << "\nEnergy attention, last inner adjoint: " << summary.attention_backward.brief << "\n";
  }
  if (summary.language_model) {
    md << "\nHeld-out text: " << JsonNumber(summary.final_eval.loss) << " nats per character, "
       << JsonNumber(summary.test_bpc) << " bits per character; "
       << summary.test_unknown_symbols << " held-out characters outside the vocabulary.\n";
  }
  if (summary.confusion.classes() > 0) {
    md << "\nPer-class held-out accuracy (confusion matrix: confusion.svg):\n\n"
       << PerClassAccuracyMarkdown(summary.confusion);
  }
  WriteTextFile(summary.run_dir + "/summary.md", md.str());
  return summary;
}

}  // namespace stillpoint
