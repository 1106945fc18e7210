#include "training/train_session.h"

#include <filesystem>
#include <utility>

#include "framework/buffer_pool.h"
#include "framework/ops.h"
#include "training/attention_report.h"
#include "training/config_schema.h"
#include "training/confusion.h"
#include "training/distributed.h"
#include "training/gradient_check.h"
#include "training/output_policy.h"
#include "training/provenance.h"
#include "training/resume.h"
#include "training/signals.h"
#include "training/svg_plot.h"
#include "training/data/text_corpus.h"

namespace stillpoint {
namespace {

const std::vector<std::string> kColumns = {"step",
                                           "lr",
                                           "loss",
                                           "accuracy",
                                           "grad_norm",
                                           "fwd_iters_mean",
                                           "fwd_iters_max",
                                           "fwd_residual",
                                           "fwd_unconverged",
                                           "bwd_iters_mean",
                                           "bwd_iters_max",
                                           "bwd_residual",
                                           "bwd_unconverged",
                                           "step_ms",
                                           "peak_rss_mb",
                                           "pool_peak_mb",
                                           "skipped",
                                           "test_loss",
                                           "test_accuracy",
                                           "test_fwd_iters_mean",
                                           "grad_cos",
                                           "grad_rel_err",
                                           "spectral_radius",
                                           "spectral_eigenvalue",
                                           "elapsed_s",
                                           "train_s",
                                           "path_independence_cosine",
                                           "path_independence_agreement"};

bool AllFinite(const NamedVars& parameters) {
  for (const auto& [name, p] : parameters) {
    if (HasNonFinite(p.value())) return false;
  }
  return true;
}

}  // namespace

TrainSettings TrainSettings::FromConfig(const Config& c) {
  TrainSettings settings;
  settings.trainer = TrainerOptions::FromConfig(c);
  settings.eval = EvalOptions::FromConfig(c);
  settings.log = LogOptions::FromConfig(c);
  settings.regularization = RegularizationOptions::FromConfig(c);
  settings.optimizer = OptimizerOptionsFromConfig(c);
  settings.schedule = ScheduleOptionsFromConfig(c);
  settings.health = HealthOptions::FromConfig(c);
  settings.seed = static_cast<uint64_t>(c.GetInt("seed"));
  return settings;
}

OpenedRunDirectory::OpenedRunDirectory(const Experiment& e,
                                       const TrainOptions& options,
                                       const TrainSettings& settings,
                                       TrainSummary* summary) {
  const std::string& dir = summary->run_dir;
  OnMainRank([&] {
    lock_.emplace(dir);
    for (const std::string& path : RemoveStaleTemporaries(dir)) {
      if (options.progress) {
        *options.progress << "removed " << path << ", left by a writer that was killed\n";
      }
    }
  });
  checkpoint_path_ = dir + "/checkpoint.ckpt";
  resumed_ = options.resume && std::filesystem::exists(checkpoint_path_);
  if (!resumed_) {
    // A resume with no checkpoint starts afresh in the run it names.
    OnMainRank([&] {
      CheckRunDirectory(dir, options.overwrite || (options.resume && HoldsARun(dir)),
                        e.config_path);
      if (options.overwrite || options.resume) RemoveRunFiles(dir);
    });
    return;
  }
  std::vector<std::string> forced;
  resume_state_ = LoadCheckpointForResume(
      checkpoint_path_, CheckpointConfig(e.config, RankShardsOf(settings.trainer.shards)),
      options.force, &forced);
  for (const std::string& line : forced) {
    if (options.progress) *options.progress << "warning: --force: " << line << "\n";
  }
  if (resume_state_.step >= settings.trainer.steps) {
    summary->already_complete = true;
    summary->steps = resume_state_.step;
    summary->num_parameters = e.model->NumParameters();
  }
}

TrainSession::TrainSession(Experiment& e,
                           const TrainSettings& settings,
                           const TrainOptions& options,
                           OpenedRunDirectory& run_directory,
                           double task_loss_weight,
                           TrainSummary* summary)
    : e_(e),
      settings_(settings),
      options_(options),
      run_directory_(run_directory),
      summary_(*summary),
      model_(*e.model),
      rank_shards_(RankShardsOf(settings.trainer.shards)),
      ranks_(WorldSize() > 1),
      writes_(IsMainRank()),
      implicit_(e.model->implicit() != nullptr),
      parameters_(e.model->named_parameters()),
      optimizer_(Optimizer::Create(settings.optimizer, parameters_)),
      batcher_(*e.train, settings.trainer.batch_size, settings.seed, e.dtype, e.train_augment),
      rng_(settings.seed + 7919) {
  summary_.num_parameters = model_.NumParameters();
  if (run_directory_.resumed()) RestoreFromCheckpoint();
  std::vector<std::string> columns = kColumns;
  columns.insert(columns.end(), AttentionColumns().begin(), AttentionColumns().end());
  if (e_.language_model) columns.push_back("test_bpc");
  if (writes_) {
    metrics_.emplace(summary_.run_dir, columns, run_directory_.resumed(), settings_.log.formats);
  } else {
    metrics_.emplace(MetricsWriter::Discard(columns));
  }
  BuildStep(task_loss_weight);
  if (run_directory_.resumed()) RestoreShardState();
  WriteRunFiles();
  BuildHooks();
  ResetBufferPoolStats();
  state_.total_steps = settings_.trainer.steps;
  state_.summary = &summary_;
  loop_start_ = Clock::now();
}

TrainSession::~TrainSession() = default;

void TrainSession::RestoreFromCheckpoint() {
  const CheckpointState& state = run_directory_.resume_state();
  const std::string& path = run_directory_.checkpoint_path();
  try {
    model_.LoadParameters(state.model);
    optimizer_->LoadState(state.optimizer);
  } catch (const Error& error) {
    // Reached with --force past a config difference: the checkpoint is
    // bad input for this model, not a runtime failure.
    throw ConfigError(path + ": does not fit this model: " + error.what());
  }
  // A checksummed file can still hold metadata that does not fit this
  // run: bad input naming the file, not an internal error.
  if (state.data_offset > e_.train->size()) {
    throw ConfigError(path + ": its data position (offset " + std::to_string(state.data_offset) +
                      " in epoch " + std::to_string(state.data_epoch) +
                      ") lies beyond the training set of " + std::to_string(e_.train->size()) +
                      " examples; the checkpoint is of another dataset or damaged");
  }
  batcher_.Restore({state.data_epoch, state.data_offset});
  if (!rng_.LoadState(state.rng_state)) {
    throw ConfigError(path +
                      ": its random number generator state does not parse; "
                      "the checkpoint is damaged");
  }
  step_ = state.step;
  // Rows written after the checkpoint (before a crash) are written again.
  if (writes_) DropMetricsAfterStep(summary_.run_dir, step_);
}

void TrainSession::BuildStep(double task_loss_weight) {
  const int64_t shards = settings_.trainer.shards;
  TrainStepOptions step_options;
  step_options.shards = shards;
  step_options.clip_norm = settings_.trainer.clip_norm;
  step_options.hold_unconverged = settings_.trainer.on_unconverged == "stop";
  step_options.task_loss_weight = task_loss_weight;
  SP_CHECK(shards == 1 || e_.make_replica != nullptr,
           "Train: the experiment cannot build model replicas");
  train_step_ = std::make_unique<TrainStep>(e_.model, *optimizer_, step_options,
                                            [&e = e_, first = rank_shards_.first](int64_t replica) {
                                              return e.make_replica(first + replica);
                                            });
  if (!ranks_) return;
  reducer_ = std::make_unique<GradientReducer>(model_.parameters(), shards);
  train_step_->EnableRanks(
      rank_shards_.first, rank_shards_.total, reducer_.get(),
      [this](const std::string& failure, const std::vector<double>& shard_losses,
             std::pair<int64_t, int64_t> correct_counted, const SolverStats& forward,
             const SolverStats& backward) {
        return ExchangeStepTotals(step_ + 1, failure, shard_losses, correct_counted, forward,
                                  backward);
      });
  // This rank's first shard draws the dropout masks of that shard's replica.
  if (rank_shards_.first > 0) {
    const std::shared_ptr<SequenceModel> first = e_.make_replica(rank_shards_.first);
    RestoreRandomStreamState(RandomStreamState({first.get()}), {&model_}, "rank replica");
  }
}

void TrainSession::RestoreShardState() {
  CheckpointState& state = run_directory_.resume_state();
  const std::string& path = run_directory_.checkpoint_path();
  SelectShardState(state.solver_state, state.random_streams, rank_shards_.first, rank_shards_.count,
                   &state.solver_state, &state.random_streams);
  RestoreWarmStartState(state.solver_state, train_step_->models(), path);
  if (!RestoreRandomStreamState(state.random_streams, train_step_->models(), path) &&
      e_.config.GetDouble("model.dropout") > 0 && options_.progress) {
    *options_.progress << "warning: the dropout masks after this resume differ from those of an "
                          "uninterrupted run (the checkpoint predates the dropout streams)\n";
  }
}

// Written once the checkpoint (if any) has loaded into this model.
void TrainSession::WriteRunFiles() {
  if (!writes_) return;
  WriteTextFile(summary_.run_dir + "/config.yaml", e_.config.ToYaml());
  for (const auto& [name, content] : e_.run_files) {
    WriteTextFile(summary_.run_dir + "/" + name, content);
  }
}

void TrainSession::BuildHooks() {
  const TrainerOptions& trainer = settings_.trainer;
  progress_.emplace(options_.progress, settings_.log.progress, trainer.steps, step_);
  solve_count_hook_.emplace();
  nonfinite_hook_.emplace(trainer, *progress_, *metrics_);
  unconverged_hook_.emplace(trainer, *progress_);
  summary_hook_.emplace(model_);
  LogHook::Context log_context;
  log_context.trainer = trainer;
  log_context.eval = settings_.eval;
  log_context.log = settings_.log;
  log_context.model = &model_;
  log_context.test = e_.test.get();
  log_context.dtype = e_.dtype;
  log_context.language_model = e_.language_model;
  const int64_t check_size =
      HasImplicitLayer(model_) ? settings_.eval.gradient_check_batch_size : 0;
  if (check_size > 0) {
    log_context.gradient_check_batch = GradientProbeBatch(*e_.train, check_size, e_.dtype);
  }
  log_context.run_dir = summary_.run_dir;
  log_context.before_eval = [this] {
    if (implicit_) model_.SetDepthOverride(0);
  };
  log_context.learning_rate = [this] { return optimizer_->learning_rate(); };
  log_hook_.emplace(std::move(log_context), *progress_, *metrics_, &*unconverged_hook_);
  checkpoint_hook_.emplace(trainer.checkpoint_every, [this] { return SaveCheckpoint(); });
  hooks_ = {&*solve_count_hook_, &*nonfinite_hook_, &*unconverged_hook_,
            &*summary_hook_,     &*log_hook_,       &*checkpoint_hook_};
}

bool TrainSession::SaveCheckpoint() {
  if (!AllFinite(parameters_)) return false;  // never replace a good one with NaNs
  CheckpointState state;
  state.step = step_;
  const Batcher::Position position = batcher_.position();
  state.data_epoch = position.epoch;
  state.data_offset = position.offset;
  state.rng_state = rng_.SaveState();
  state.config_yaml = CheckpointConfig(e_.config, rank_shards_).ToYaml();
  state.model = model_.NamedValues();
  state.optimizer = optimizer_->SaveState();
  // Every rank's shards, named by global shard (collective).
  GatherShardState(train_step_->models(), rank_shards_.first, &state.solver_state,
                   &state.random_streams);
  if (writes_) stillpoint::SaveCheckpoint(run_directory_.checkpoint_path(), state);
  ++summary_.checkpoints_written;
  return true;
}

bool TrainSession::Continues() const {
  return step_ < settings_.trainer.steps &&
         (options_.stop_after_steps == 0 || steps_this_call_ < options_.stop_after_steps) &&
         AgreedStopRequest() == 0 && !state_.stop;
}

void TrainSession::SetLearningRateAndDepth() {
  optimizer_->set_learning_rate(
      LearningRateAt(settings_.schedule, settings_.optimizer.learning_rate, step_));
  if (implicit_) {
    train_step_->SetDepthOverride(
        step_ < settings_.trainer.pretrain_steps ? model_.options().unroll_steps : 0);
  }
}

bool TrainSession::Step(const ExtraLoss& extra_loss) {
  const auto start = Clock::now();
  try {
    state_.result = train_step_->Run(batcher_.Next(), extra_loss, &rng_);
  } catch (const RankFailure& rank_failure) {
    summary_.stopped_early = true;
    summary_.stop_reason = "step " + std::to_string(step_ + 1) + ": " + rank_failure.what();
    progress_->Message(summary_.stop_reason + "; every rank stops");
    return false;
  }
  state_.step_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  state_.train_seconds += state_.step_seconds;
  state_.elapsed_seconds = std::chrono::duration<double>(Clock::now() - loop_start_).count();
  state_.step = ++step_;
  ++steps_this_call_;
  return true;
}

void TrainSession::Finish() {
  const int64_t steps = settings_.trainer.steps;
  if (implicit_) model_.SetDepthOverride(0);
  progress_->Finish();
  SaveCheckpoint();
  if (AgreedStopRequest() != 0 && step_ < steps) {
    summary_.stop_signal = AgreedStopRequest();
    summary_.stop_reason = std::string("stopped by ") + SignalName(summary_.stop_signal) +
                           " at step " + std::to_string(step_) + " of " + std::to_string(steps);
  }
  summary_.steps = step_;
  summary_.seconds_per_step = summary_hook_->MedianStepSeconds();
  summary_.peak_rss_mb = PeakResidentMegabytes();
  summary_.pool_peak_mb = GetBufferPoolStats().peak_bytes_in_use / 1048576.0;
  const int64_t eval_batch = settings_.eval.batch_size;
  if (summary_.final_eval.examples == 0 && step_ >= steps) {
    summary_.final_eval = Evaluate(model_, *e_.test, eval_batch, e_.dtype);
  }
  summary_.language_model = e_.language_model;
  summary_.test_unknown_symbols = e_.test_unknown_symbols;
  if (e_.language_model) summary_.test_bpc = BitsPerSymbol(summary_.final_eval.loss);
  summary_.equilibrium = AssessEquilibrium(HasImplicitLayer(model_), summary_.solve_counts,
                                           summary_.equilibrium_monitor, settings_.health);
  if (summary_.equilibrium.applies) {
    progress_->Message("equilibrium: " + summary_.equilibrium.verdict);
  }
  if (!writes_) return;  // rank 0 writes the run directory
  if (settings_.log.plots) LogHook::WritePlots(summary_.run_dir);
  // The held-out evaluation's own counts: no second pass over the test set.
  if (!summary_.final_eval.confusion.empty() && step_ >= steps) {
    summary_.confusion = MakeConfusion(summary_.final_eval.confusion, e_.class_names);
    if (settings_.log.plots) {
      WriteTextFile(summary_.run_dir + "/confusion.svg",
                    ConfusionSvg(summary_.confusion, "Held-out confusion matrix"));
    }
  }
  summary_.provenance.end_time = UtcNow();
}

}  // namespace stillpoint
