#include "training/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>

#include "framework/buffer_pool.h"
#include "framework/ops.h"
#include "framework/parallel.h"
#include "layers/energy_attention.h"
#include "solvers/regularizers.h"
#include "training/attention_report.h"
#include "training/checkpoint.h"
#include "training/config_schema.h"
#include "training/data_parallel.h"
#include "training/distributed.h"
#include "training/distributed_training.h"
#include "training/gradient_reducer.h"
#include "training/gradient_check.h"
#include "training/metrics.h"
#include "training/optimizer.h"
#include "training/progress.h"
#include "training/resume.h"
#include "training/run_directory.h"
#include "training/schedule.h"
#include "training/signals.h"
#include "training/summary_json.h"
#include "training/svg_plot.h"

namespace stillpoint {
namespace {

using Clock = std::chrono::steady_clock;

const std::vector<std::string> kColumns = {
    "step",           "lr",           "loss",          "accuracy",      "grad_norm",
    "fwd_iters_mean", "fwd_iters_max", "fwd_residual", "fwd_unconverged", "bwd_iters_mean",
    "bwd_iters_max",  "bwd_residual", "bwd_unconverged", "step_ms",     "peak_rss_mb",
    "pool_peak_mb",   "skipped",      "test_loss",     "test_accuracy", "test_fwd_iters_mean",
    "grad_cos",       "grad_rel_err"};

// Held-out examples the energy attentions' collapse diagnostics are taken
// on at every eval (one extra traced solve per attention).
constexpr int64_t kDiagnosticExamples = 32;

bool AllFinite(const NamedVars& parameters) {
  for (const auto& [name, p] : parameters) {
    if (HasNonFinite(p.value())) return false;
  }
  return true;
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

// The Hutchinson estimate of ||J_f(z*)||_F^2 / numel at this batch's fixed
// point, differentiable w.r.t. the cell's parameters and the injection.
Var JacobianPenalty(SequenceModel& model, const Batch& batch, int probes, Rng& rng) {
  const Var u = batch.features.defined()
                    ? model.EmbedFeatures(constant(batch.features))
                    : model.Embed(batch.tokens, Shape{batch.batch_size, batch.length});
  const std::shared_ptr<Cell> cell = model.cell(0);
  const int64_t rows = u.dim(0);
  CellFn f = [&](const Var& z, const std::vector<int64_t>& ids) {
    const bool all = static_cast<int64_t>(ids.size()) == rows;
    return cell->Forward(z, all ? u : gather(u, 0, ids), ids);
  };
  return JacobianFrobeniusPenalty(f, model.implicit()->last_result().z_star.value(), probes, rng);
}

// A term a shard adds to its loss after its forward pass (the Jacobian
// penalty), from its replica, its rows and its index.
using ShardPenalty = std::function<Var(SequenceModel& replica, const Batch& rows, int64_t shard)>;

// One step's forward and backward passes as data-parallel shards: the
// loss (each shard's mean over its counted targets, weighted by its share
// of the batch's counted targets, plus `penalty` when given) and, through
// *correct_counted, the batch's correct predictions and counted targets.
double ShardedBackward(DataParallel& data_parallel,
                       const Batch& batch,
                       std::pair<int64_t, int64_t>* correct_counted,
                       const ShardPenalty& penalty = nullptr) {
  int64_t counted = 0;
  for (int64_t target : batch.targets) counted += target != kIgnoreTarget;
  std::vector<std::pair<int64_t, int64_t>> per_shard(data_parallel.shards());
  const double loss =
      data_parallel.Backward(batch.batch_size, [&](Module& replica, ShardRange rows) {
        const Batch part = SliceBatch(batch, rows.begin, rows.end);
        SequenceModel& model = static_cast<SequenceModel&>(replica);
        const Var logits = ForwardBatch(model, part);
        const int64_t local = rows.shard - data_parallel.first_shard();
        per_shard[local] = CountCorrect(logits.value(), part);
        const int64_t shard_counted = per_shard[local].second;
        // A shard whose targets are all ignored adds nothing to the task loss.
        Var loss = shard_counted == 0
                       ? mul_scalar(sum(logits), 0.0)
                       : mul_scalar(BatchLoss(logits, part), static_cast<double>(shard_counted) /
                                                                 static_cast<double>(counted));
        if (penalty) loss = add(loss, penalty(model, part, rows.shard));
        return loss;
      });
  *correct_counted = {0, 0};
  for (const auto& [c, n] : per_shard) {
    correct_counted->first += c;
    correct_counted->second += n;
  }
  return loss;
}

// Solver statistics over the samples of every shard (each replica keeps
// those of its own last solve); the brief report is shard 0's.
SolverStats ShardedStats(const DataParallel& data_parallel,
                         SolverStats (*stats_of)(const SequenceModel&)) {
  SolverStats total;
  for (int64_t shard = 0; shard < data_parallel.shards(); ++shard) {
    total.Merge(stats_of(static_cast<const SequenceModel&>(data_parallel.replica(shard))));
  }
  return total;
}

// The run's curves from its metrics file; rewritten at every evaluation so
// a long run can be watched. Held-out values exist on evaluation rows only:
// EvaluatedPoints joins them into one line.
void WritePlots(const std::string& run_dir) {
  const auto m = ReadRunMetrics(run_dir);
  auto column = [&](const std::string& name) {
    auto it = m.find(name);
    return it == m.end() ? std::vector<double>{} : it->second;
  };
  const std::vector<double> step = column("step");
  PlotOptions loss{"Loss", "step", "cross-entropy (nats)", true};
  WriteTextFile(run_dir + "/loss.svg",
                LinePlotSvg({EvaluatedPoints("train", step, column("loss"), 1.0, false),
                             EvaluatedPoints("test", step, column("test_loss"))},
                            loss));
  PlotOptions accuracy{"Accuracy", "step", "accuracy (%)", false};
  WriteTextFile(run_dir + "/accuracy.svg",
                LinePlotSvg({EvaluatedPoints("train", step, column("accuracy"), 100.0, false),
                             EvaluatedPoints("test", step, column("test_accuracy"), 100.0)},
                            accuracy));
  PlotOptions solver{"Solver iterations", "step", "iterations (mean over samples)", false};
  WriteTextFile(run_dir + "/solver.svg",
                LinePlotSvg({EvaluatedPoints("forward", step, column("fwd_iters_mean"), 1.0, false),
                             EvaluatedPoints("backward", step, column("bwd_iters_mean"), 1.0,
                                             false)},
                            solver));
}

// {"CONVERGED": 30, "MAX_ITERATIONS": 2}
std::string StatusJson(const SolverStats& stats) {
  std::string out = "{";
  for (const auto& [status, count] : stats.status_counts) {
    if (out.size() > 1) out += ", ";
    out += JsonString(status) + ": " + std::to_string(count);
  }
  return out + "}";
}

// true / false, or null when there was no tolerance or no measured residual.
std::string ToleranceMetJson(const SolverStats& stats) {
  if (stats.tolerance <= 0 || !stats.HasResidual()) return "null";
  return stats.ToleranceMissed() ? "false" : "true";
}

// What train.on_unconverged reports about a step's adjoint solve.
std::string UnconvergedReport(int64_t step, const SolverStats& backward) {
  const int64_t samples = backward.converged + backward.not_converged + backward.inexact;
  std::ostringstream out;
  out << "step " << step << ": the adjoint (backward) solve left " << backward.not_converged
      << "/" << samples << " samples (" << std::fixed << std::setprecision(0)
      << 100.0 * static_cast<double>(backward.not_converged) / static_cast<double>(samples)
      << "%) above its tolerance: max rel residual " << ResidualCell(backward) << " ["
      << StatusCell(backward) << "]; " << backward.brief;
  return out.str();
}

std::string SummaryJson(const TrainSummary& s) {
  std::ostringstream out;
  out << "{\n  \"steps\": " << s.steps << ",\n  \"skipped_steps\": " << s.skipped_steps
      << ",\n  \"stopped_early\": " << (s.stopped_early ? "true" : "false")
      << ",\n  \"stop_reason\": " << JsonString(s.stop_reason)
      << ",\n  \"parameters\": " << s.num_parameters
      << ",\n  \"checkpoints_written\": " << s.checkpoints_written
      << ",\n  \"final_train_loss\": " << JsonNumber(s.final_train_loss)
      << ",\n  \"final_train_accuracy\": " << JsonNumber(s.final_train_accuracy)
      << ",\n  \"test_loss\": " << JsonNumber(s.final_eval.loss)
      << ",\n  \"test_accuracy\": " << JsonNumber(s.final_eval.accuracy)
      << ",\n  \"test_examples\": " << s.final_eval.examples
      << ",\n  \"test_forward_iterations_mean\": " << JsonNumber(s.final_eval.forward.iterations_mean)
      << ",\n  \"seconds_per_step\": " << JsonNumber(s.seconds_per_step)
      << ",\n  \"peak_rss_mb\": " << JsonNumber(s.peak_rss_mb)
      << ",\n  \"pool_peak_mb\": " << JsonNumber(s.pool_peak_mb)
      << ",\n  \"forward_iterations_mean\": " << JsonNumber(s.forward.iterations_mean)
      << ",\n  \"forward_residual_max\": " << JsonNumber(s.forward.residual_max)
      << ",\n  \"backward_iterations_mean\": " << JsonNumber(s.backward.iterations_mean)
      << ",\n  \"backward_residual_max\": " << JsonNumber(s.backward.residual_max)
      << ",\n  \"attention_iterations_mean\": " << JsonNumber(s.attention_forward.iterations_mean)
      << ",\n  \"attention_residual_max\": " << JsonNumber(s.attention_forward.residual_max)
      << ",\n  \"attention_backward_iterations_mean\": "
      << JsonNumber(s.attention_backward.iterations_mean)
      << ",\n  \"attention_backward_residual_max\": "
      << JsonNumber(s.attention_backward.residual_max)
      << ",\n  \"forward_tolerance\": " << JsonNumber(s.forward.tolerance)
      << ",\n  \"forward_tolerance_met\": " << ToleranceMetJson(s.forward)
      << ",\n  \"forward_status\": " << StatusJson(s.forward)
      << ",\n  \"backward_tolerance\": " << JsonNumber(s.backward.tolerance)
      << ",\n  \"backward_tolerance_met\": " << ToleranceMetJson(s.backward)
      << ",\n  \"backward_status\": " << StatusJson(s.backward)
      << ",\n  \"backward_unconverged_steps\": " << s.unconverged_backward_steps
      << ",\n  \"solvers\": {\"forward\": " << SolverStatsJson(s.forward)
      << ", \"backward\": " << SolverStatsJson(s.backward)
      << ", \"attention_forward\": " << SolverStatsJson(s.attention_forward)
      << ", \"attention_backward\": " << SolverStatsJson(s.attention_backward) << "}"
      << ",\n  \"provenance\": " << ProvenanceJson(s.provenance)
      << ",\n  \"gradient_check\": ";
  if (s.gradient_check.ran) {
    const GradientCheck& g = s.gradient_check;
    out << "{\"step\": " << s.gradient_check_step << ", \"cosine\": " << JsonNumber(g.cosine)
        << ", \"relative_error\": " << JsonNumber(g.relative_error)
        << ", \"reference\": \"ift/gmres, tolerance 1e-10\", \"reference_residual\": "
        << JsonNumber(g.reference_residual)
        << ", \"reference_status\": " << JsonString(g.reference_status)
        << ", \"spectral_radius\": " << JsonNumber(g.spectral_radius) << "}";
  } else {
    out << "null";
  }
  out << "\n}\n";
  return out.str();
}

}  // namespace

std::string TrainSummary::BriefReport() const {
  std::ostringstream out;
  out << std::fixed << std::setprecision(4) << "steps " << steps << ", train loss "
      << final_train_loss << ", test loss " << final_eval.loss << ", test accuracy "
      << std::setprecision(2) << 100.0 * final_eval.accuracy << "%, " << std::setprecision(1)
      << 1000.0 * seconds_per_step << " ms/step, peak RSS " << peak_rss_mb << " MiB";
  if (forward.iterations_max > 0) {
    out << ", forward iterations " << forward.iterations_mean << " (max "
        << forward.iterations_max << ")";
  }
  if (skipped_steps > 0) out << ", " << skipped_steps << " skipped steps";
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
  OnMainRank([&] { lock.emplace(summary.run_dir); });
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
  } else if (options.overwrite || options.resume) {
    OnMainRank([&] { RemoveRunFiles(summary.run_dir); });
  } else {
    OnMainRank([&] { RefuseNonEmptyRunDirectory(summary.run_dir); });
  }

  const NamedVars parameters = model.named_parameters();
  VarList parameter_list;
  for (const auto& [name, p] : parameters) parameter_list.push_back(p);
  summary.num_parameters = model.NumParameters();
  const OptimizerOptions optimizer_options = OptimizerOptionsFromConfig(c);
  auto optimizer = Optimizer::Create(optimizer_options, parameters);
  const ScheduleOptions schedule = ScheduleOptionsFromConfig(c);
  const uint64_t seed = static_cast<uint64_t>(c.GetInt("seed"));
  Batcher batcher(*e.train, c.GetInt("train.batch_size"), seed, e.dtype);
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
    batcher.Restore({state.data_epoch, state.data_offset});
    SP_CHECK(rng.LoadState(state.rng_state), checkpoint_path, ": unreadable RNG state");
    step = state.step;
    // Rows written after the checkpoint (before a crash) are written again.
    if (writes) DropMetricsAfterStep(summary.run_dir, step);
  }
  std::vector<std::string> columns = kColumns;
  columns.insert(columns.end(), AttentionColumns().begin(), AttentionColumns().end());
  MetricsWriter metrics =
      writes ? MetricsWriter(summary.run_dir, columns, resumed, c.GetStringList("log.formats"))
             : MetricsWriter::Discard(columns);
  std::unique_ptr<DataParallel> data_parallel;
  // The model and its data-parallel replicas, whose solvers keep warm starts.
  auto warm_start_models = [&] {
    std::vector<SequenceModel*> models = {&model};
    for (int64_t shard = 1; data_parallel && shard < shards; ++shard) {
      models.push_back(&static_cast<SequenceModel&>(data_parallel->replica(shard)));
    }
    return models;
  };
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
    GatherShardState(warm_start_models(), rank_shards.first, &state.solver_state,
                     &state.random_streams);
    if (writes) SaveCheckpoint(checkpoint_path, state);
    ++summary.checkpoints_written;
    return true;
  };

  const int64_t total_steps = c.GetInt("train.steps");
  const int64_t log_every = c.GetInt("train.log_every");
  const int64_t eval_every = c.GetInt("train.eval_every");
  const int64_t checkpoint_every = c.GetInt("train.checkpoint_every");
  const int64_t pretrain_steps = c.GetInt("train.pretrain_steps");
  const int64_t unroll_steps = c.GetInt("model.unroll_steps");
  const double clip_norm = c.GetDouble("train.clip_norm");
  const bool stop_on_nonfinite = c.GetString("train.on_nonfinite") == "stop";
  const int64_t max_skipped = c.GetInt("train.max_skipped_steps");
  const std::string on_unconverged = c.GetString("train.on_unconverged");
  bool unconverged_reported = false;
  int64_t unconverged_since_report = 0;
  std::string last_unconverged;
  const double jacobian_weight = c.GetDouble("model.regularization.jacobian_weight");
  std::unique_ptr<GradientReducer> reducer;
  if (shards > 1 || ranks) {
    SP_CHECK(e.make_replica != nullptr, "Train: the experiment cannot build model replicas");
    data_parallel = std::make_unique<DataParallel>(
        e.model, shards,
        [&e, next = rank_shards.first + 1]() mutable { return e.make_replica(next++); });
  }
  if (ranks) {
    data_parallel->set_layout(rank_shards.first, rank_shards.total);
    reducer = std::make_unique<GradientReducer>(model.parameters(), shards);
    data_parallel->set_reduction(reducer.get());
    // This rank's first shard draws the dropout masks of that shard's replica.
    if (rank_shards.first > 0) {
      const std::shared_ptr<SequenceModel> first = e.make_replica(rank_shards.first);
      RestoreRandomStreamState(RandomStreamState({first.get()}), {&model}, "rank replica");
    }
  }
  if (resumed) {
    SelectShardState(resume_state.solver_state, resume_state.random_streams, rank_shards.first,
                     rank_shards.count, &resume_state.solver_state, &resume_state.random_streams);
    RestoreWarmStartState(resume_state.solver_state, warm_start_models(), checkpoint_path);
    if (!RestoreRandomStreamState(resume_state.random_streams, warm_start_models(),
                                  checkpoint_path) &&
        c.GetDouble("model.dropout") > 0 && options.progress) {
      *options.progress << "warning: the dropout masks after this resume differ from those of an "
                           "uninterrupted run (the checkpoint predates the dropout streams)\n";
    }
  }
  // Written once the checkpoint (if any) has loaded into this model.
  if (writes) WriteTextFile(summary.run_dir + "/config.yaml", c.ToYaml());
  const int jacobian_probes = static_cast<int>(c.GetInt("model.regularization.jacobian_probes"));
  const double jacobian_frequency = c.GetDouble("model.regularization.jacobian_frequency");
  const int64_t eval_batch = c.GetInt("eval.batch_size");
  const bool implicit = model.implicit() != nullptr;
  const bool checked = HasImplicitLayer(model);
  const int64_t check_size = checked ? c.GetInt("eval.gradient_check_batch_size") : 0;
  const Batch check_batch =
      check_size > 0 ? GradientProbeBatch(*e.train, check_size, e.dtype) : Batch();

  Progress progress(options.progress, c.GetString("log.progress"), total_steps, step);
  std::set<std::string> collapse_warned;  // energy attentions already warned about
  ResetBufferPoolStats();
  std::vector<double> step_seconds;
  double window_loss = 0, window_correct = 0, window_count = 0, window_steps = 0;
  int64_t consecutive_skips = 0;
  int64_t steps_this_call = 0;
  SolverStats last_forward, last_backward;

  while (step < total_steps &&
         (options.stop_after_steps == 0 || steps_this_call < options.stop_after_steps) &&
         AgreedStopRequest() == 0) {
    const auto start = Clock::now();
    optimizer->set_learning_rate(LearningRateAt(schedule, optimizer_options.learning_rate, step));
    if (implicit) {
      const int64_t depth = step < pretrain_steps ? unroll_steps : 0;
      model.SetDepthOverride(depth);
      for (int64_t shard = 1; shard < shards; ++shard) {
        static_cast<SequenceModel&>(data_parallel->replica(shard)).SetDepthOverride(depth);
      }
    }
    const Batch batch = batcher.Next();
    double loss_value = 0;
    SolverStats forward, backward_stats;
    std::pair<int64_t, int64_t> correct_counted;
    std::string failure;
    double grad_norm = 0;
    if (data_parallel == nullptr) {
      Var logits = ForwardBatch(model, batch);
      Var loss = BatchLoss(logits, batch);
      const bool use_jacobian = implicit && jacobian_weight > 0 && step >= pretrain_steps &&
                                rng.Uniform() < jacobian_frequency;
      if (use_jacobian) {
        loss = add(
            loss, mul_scalar(JacobianPenalty(model, batch, jacobian_probes, rng), jacobian_weight));
      }
      loss_value = loss.item();
      forward = ForwardStats(model);
      correct_counted = CountCorrect(logits.value(), batch);
      if (!std::isfinite(loss_value)) failure = "non-finite loss";
      if (failure.empty()) {
        optimizer->ZeroGrad();
        backward(loss);
      }
      backward_stats = BackwardStats(model);
    } else {
      optimizer->ZeroGrad();
      // The Jacobian penalty per shard: each shard's estimate is the mean over
      // its samples, weighted by its share of the batch, with probes from a
      // generator of its own seeded from the step's draw (so the result does
      // not depend on which thread runs which shard).
      ShardPenalty penalty;
      if (implicit && jacobian_weight > 0 && step >= pretrain_steps &&
          rng.Uniform() < jacobian_frequency) {
        const uint64_t probe_seed = rng.NextU64();
        penalty = [&, probe_seed](SequenceModel& replica, const Batch& part, int64_t shard) {
          Rng shard_rng(probe_seed + static_cast<uint64_t>(shard));
          const double share =
              static_cast<double>(part.batch_size) / static_cast<double>(batch.batch_size);
          return mul_scalar(JacobianPenalty(replica, part, jacobian_probes, shard_rng),
                            jacobian_weight * share);
        };
      }
      if (!ranks) {
        loss_value = ShardedBackward(*data_parallel, batch, &correct_counted, penalty);
        forward = ShardedStats(*data_parallel, ForwardStats);
        backward_stats = ShardedStats(*data_parallel, BackwardStats);
      } else {
        // Every rank learns of a failure on any rank, and stops with it.
        std::string error;
        try {
          ShardedBackward(*data_parallel, batch, &correct_counted, penalty);
        } catch (const std::exception& ex) {
          error = ex.what();
        }
        try {
          const StepTotals totals = ExchangeStepTotals(
              step + 1, error, data_parallel->shard_losses(), correct_counted,
              ShardedStats(*data_parallel, ForwardStats),
              ShardedStats(*data_parallel, BackwardStats));
          loss_value = totals.loss;
          correct_counted = {totals.correct, totals.counted};
          forward = totals.forward;
          backward_stats = totals.backward;
          if (totals.nonfinite_rank >= 0) {
            failure = "non-finite loss on rank " + std::to_string(totals.nonfinite_rank);
          }
        } catch (const RankFailure& rank_failure) {
          summary.stopped_early = true;
          summary.stop_reason = "step " + std::to_string(step + 1) + ": " + rank_failure.what();
          progress.Message(summary.stop_reason + "; every rank stops");
          break;
        }
      }
      if (!std::isfinite(loss_value) && failure.empty()) failure = "non-finite loss";
    }
    if (failure.empty()) {
      grad_norm = GradNorm(parameter_list);
      if (!std::isfinite(grad_norm)) failure = "non-finite gradient";
    }
    ++step;
    ++steps_this_call;
    if (!failure.empty()) {
      ++summary.skipped_steps;
      ++consecutive_skips;
      optimizer->ZeroGrad();
      std::ostringstream report;
      report << "step " << step << ": " << failure << " (loss " << loss_value << ")";
      if (!forward.brief.empty()) report << "; forward solver: " << forward.brief;
      if (!backward_stats.brief.empty()) report << "; backward solver: " << backward_stats.brief;
      progress.Message(report.str() + (stop_on_nonfinite ? "; stopping (train.on_nonfinite: stop)"
                                                         : "; step skipped, parameters unchanged"));
      metrics.Write({{"step", double(step)}, {"loss", loss_value}, {"skipped", 1.0}});
      if (stop_on_nonfinite || consecutive_skips >= max_skipped) {
        summary.stopped_early = true;
        summary.stop_reason = stop_on_nonfinite
                                  ? report.str()
                                  : std::to_string(consecutive_skips) +
                                        " consecutive skipped steps; last: " + report.str();
        break;
      }
      continue;
    }
    consecutive_skips = 0;
    if (backward_stats.not_converged > 0) {
      ++summary.unconverged_backward_steps;
      last_unconverged = UnconvergedReport(step, backward_stats);
      if (on_unconverged == "stop") {
        progress.Message(last_unconverged + "; stopping before the update (train.on_unconverged: "
                                            "stop)");
        summary.stopped_early = true;
        summary.stop_reason = last_unconverged;
        // The summaries describe the solves that stopped the run.
        last_forward = forward;
        last_backward = backward_stats;
        break;
      }
      if (on_unconverged == "warn" && !unconverged_reported) {
        progress.Message(last_unconverged +
                         " (train.on_unconverged: warn; reported again once per evaluation)");
        unconverged_reported = true;
      } else {
        ++unconverged_since_report;
      }
    }
    if (clip_norm > 0) ClipGradNorm(parameter_list, clip_norm);
    optimizer->Step();
    step_seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    last_forward = forward;
    last_backward = backward_stats;
    summary.attention_forward = AttentionForwardStats(model);
    summary.attention_backward = AttentionBackwardStats(model);

    const auto [correct, counted] = correct_counted;
    window_loss += loss_value;
    window_correct += static_cast<double>(correct);
    window_count += static_cast<double>(counted);
    window_steps += 1;
    summary.final_train_loss = loss_value;
    summary.final_train_accuracy = counted ? double(correct) / double(counted) : 0.0;

    const bool do_eval = (eval_every > 0 && step % eval_every == 0) || step == total_steps;
    if (step % log_every == 0 || do_eval) {
      std::map<std::string, double> row = {
          {"step", double(step)},
          {"lr", optimizer->learning_rate()},
          {"loss", window_loss / window_steps},
          {"accuracy", window_count ? window_correct / window_count : 0.0},
          {"grad_norm", grad_norm},
          {"step_ms", 1000.0 * step_seconds.back()},
          {"peak_rss_mb", PeakResidentMegabytes()},
          {"pool_peak_mb", GetBufferPoolStats().peak_bytes_in_use / 1048576.0},
          {"skipped", 0.0}};
      if (implicit && step > pretrain_steps) {
        row["fwd_iters_mean"] = forward.iterations_mean;
        row["fwd_iters_max"] = forward.iterations_max;
        row["fwd_residual"] = forward.residual_max;
        row["fwd_unconverged"] = double(forward.not_converged);
        row["bwd_iters_mean"] = backward_stats.iterations_mean;
        row["bwd_iters_max"] = backward_stats.iterations_max;
        // Inexact modes measure no residual: the column stays empty.
        if (backward_stats.HasResidual()) row["bwd_residual"] = backward_stats.residual_max;
        row["bwd_unconverged"] = double(backward_stats.not_converged);
      }
      for (const auto& [column, value] :
           AttentionSolverColumns(summary.attention_forward, summary.attention_backward)) {
        row[column] = value;
      }
      if (do_eval) {
        if (implicit) model.SetDepthOverride(0);
        std::vector<std::string> warnings;
        for (const auto& [column, value] : AttentionDiagnosticColumns(
                 model, *e.test, kDiagnosticExamples, e.dtype, &collapse_warned, &warnings)) {
          row[column] = value;
        }
        for (const std::string& warning : warnings) progress.Message(warning);
        if (row.count("attn_max_weight")) progress.Message(AttentionSummaryLine(row));
        const EvalResult eval = Evaluate(model, *e.test, eval_batch, e.dtype);
        row["test_loss"] = eval.loss;
        row["test_accuracy"] = eval.accuracy;
        if (implicit) row["test_fwd_iters_mean"] = eval.forward.iterations_mean;
        summary.final_eval = eval;
        progress.Eval(step, eval.loss, eval.accuracy);
        if (check_size > 0) {
          summary.gradient_check = CheckGradient(model, check_batch);
          summary.gradient_check_step = step;
          row["grad_cos"] = summary.gradient_check.cosine;
          row["grad_rel_err"] = summary.gradient_check.relative_error;
          progress.Message("step " + std::to_string(step) + ": " + summary.gradient_check.Line());
        }
        if (on_unconverged == "warn" && unconverged_since_report > 0) {
          progress.Message(std::to_string(unconverged_since_report) +
                           " more step(s) with unconverged adjoint samples since the last "
                           "report; the latest: " +
                           last_unconverged);
          unconverged_since_report = 0;
        }
      }
      metrics.Write(row);
      if (do_eval && c.GetBool("log.plots")) WritePlots(summary.run_dir);
      progress.Update(step, row["loss"], row["accuracy"], forward.iterations_mean, implicit);
      window_loss = window_correct = window_count = window_steps = 0;
    }
    if (checkpoint_every > 0 && step % checkpoint_every == 0) save_checkpoint();
  }
  if (implicit) model.SetDepthOverride(0);
  progress.Finish();
  save_checkpoint();
  if (AgreedStopRequest() != 0 && step < total_steps) {
    summary.stop_signal = AgreedStopRequest();
    summary.stop_reason = std::string("stopped by ") + SignalName(summary.stop_signal) +
                          " at step " + std::to_string(step) + " of " +
                          std::to_string(total_steps);
  }

  summary.steps = step;
  summary.seconds_per_step = Median(step_seconds);
  summary.peak_rss_mb = PeakResidentMegabytes();
  summary.pool_peak_mb = GetBufferPoolStats().peak_bytes_in_use / 1048576.0;
  summary.forward = last_forward;
  summary.backward = last_backward;
  if (summary.final_eval.examples == 0 && step >= total_steps) {
    summary.final_eval = Evaluate(model, *e.test, eval_batch, e.dtype);
  }
  if (!writes) return summary;  // rank 0 writes the run directory
  if (c.GetBool("log.plots")) WritePlots(summary.run_dir);
  summary.provenance.end_time = UtcNow();
  WriteTextFile(summary.run_dir + "/summary.json", SummaryJson(summary));
  std::ostringstream md;
  md << "# Run summary\n\n" << summary.BriefReport() << "\n\nModel: " << model.Name() << ", "
     << summary.num_parameters << " parameters.\n\nProvenance: "
     << ProvenanceMarkdown(summary.provenance) << "\n";
  if (!last_forward.brief.empty()) {
    md << "\nLast forward solve: " << last_forward.brief << "\n\nForward residual "
       << ResidualCell(last_forward) << "; samples: " << StatusCell(last_forward) << "\n";
  }
  if (!last_backward.brief.empty()) {
    md << "\nLast backward solve: " << last_backward.brief << "\n\nBackward residual "
       << ResidualCell(last_backward) << "; samples: " << StatusCell(last_backward) << "\n";
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
  WriteTextFile(summary.run_dir + "/summary.md", md.str());
  return summary;
}

}  // namespace stillpoint
