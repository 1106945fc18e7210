#include "training/train_hooks.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <sstream>
#include <utility>

#include "framework/buffer_pool.h"
#include "training/attention_report.h"
#include "training/gradient_check.h"
#include "training/statistics.h"
#include "training/svg_plot.h"
#include "training/trainer.h"
#include "training/data/text_corpus.h"

namespace stillpoint {
namespace {

// Held-out examples the energy attentions' collapse diagnostics are taken
// on at every eval (one extra traced solve per attention).
constexpr int64_t kDiagnosticExamples = 32;

// What train.on_unconverged reports about a step's adjoint solves: the
// model's own in detail, and the unconverged samples of every family.
std::string UnconvergedReport(int64_t step, const StepResult& result) {
  const SolverStats& backward = result.backward;
  std::ostringstream out;
  out << "step " << step << ": ";
  if (backward.not_converged > 0) {
    const int64_t samples = backward.converged + backward.not_converged + backward.inexact;
    out << "the adjoint (backward) solve left " << backward.not_converged << "/" << samples
        << " samples (" << std::fixed << std::setprecision(0)
        << 100.0 * static_cast<double>(backward.not_converged) / static_cast<double>(samples)
        << "%) above its tolerance: max rel residual " << ResidualCell(backward) << " ["
        << StatusCell(backward) << "]; " << backward.brief;
  } else {
    out << "adjoint solves left samples above their tolerance";
  }
  const std::string misses = result.solves.AdjointMisses();
  if (!misses.empty()) out << "; unconverged adjoint samples this step: " << misses;
  return out.str();
}

}  // namespace

// ---------------------------------------------------------------- NonFiniteHook

NonFiniteHook::NonFiniteHook(const TrainerOptions& options, Progress& progress,
                             MetricsWriter& metrics)
    : options_(options), progress_(progress), metrics_(metrics) {}

bool NonFiniteHook::StepEnded(TrainLoopState& state) {
  const StepResult& result = state.result;
  if (result.failure.empty()) {
    consecutive_skips_ = 0;
    return true;
  }
  TrainSummary& summary = *state.summary;
  ++summary.skipped_steps;
  ++consecutive_skips_;
  const bool stop_on_nonfinite = options_.on_nonfinite == "stop";
  std::ostringstream report;
  report << "step " << state.step << ": " << result.failure << " (loss " << result.loss << ")";
  if (!result.forward.brief.empty()) report << "; forward solver: " << result.forward.brief;
  if (!result.backward.brief.empty()) report << "; backward solver: " << result.backward.brief;
  progress_.Message(report.str() + (stop_on_nonfinite ? "; stopping (train.on_nonfinite: stop)"
                                                      : "; step skipped, parameters unchanged"));
  metrics_.Write({{"step", double(state.step)}, {"loss", result.loss}, {"skipped", 1.0}});
  if (stop_on_nonfinite || consecutive_skips_ >= options_.max_skipped_steps) {
    state.stop = true;
    summary.stopped_early = true;
    summary.stop_reason = stop_on_nonfinite ? report.str()
                                            : std::to_string(consecutive_skips_) +
                                                  " consecutive skipped steps; last: " +
                                                  report.str();
  }
  return false;
}

// ---------------------------------------------------------------- UnconvergedHook

UnconvergedHook::UnconvergedHook(const TrainerOptions& options, Progress& progress)
    : options_(options), progress_(progress) {}

bool UnconvergedHook::StepEnded(TrainLoopState& state) {
  const StepResult& result = state.result;
  if (!result.unconverged()) return true;
  TrainSummary& summary = *state.summary;
  last_ = UnconvergedReport(state.step, result);
  if (options_.on_unconverged == "stop") {
    progress_.Message(last_ + "; stopping before the update (train.on_unconverged: stop)");
    state.stop = true;
    summary.stopped_early = true;
    summary.stop_reason = last_;
    // The summaries describe the solves that stopped the run.
    summary.forward = result.forward;
    summary.backward = result.backward;
    return false;
  }
  if (options_.on_unconverged == "warn" && !reported_) {
    progress_.Message(last_ + " (train.on_unconverged: warn; reported again once per evaluation)");
    reported_ = true;
  } else {
    ++since_report_;
  }
  return true;
}

void UnconvergedHook::ReportSinceLast() {
  if (options_.on_unconverged != "warn" || since_report_ == 0) return;
  progress_.Message(std::to_string(since_report_) +
                    " more step(s) with unconverged adjoint samples since the last report; the "
                    "latest: " +
                    last_);
  since_report_ = 0;
}

// ---------------------------------------------------------------- SolveCountHook

bool SolveCountHook::StepEnded(TrainLoopState& state) {
  state.summary->solve_counts.AddStep(state.result.solves);
  return true;
}

// ---------------------------------------------------------------- SummaryHook

bool SummaryHook::StepEnded(TrainLoopState& state) {
  TrainSummary& summary = *state.summary;
  step_seconds_.push_back(state.step_seconds);
  summary.forward = state.result.forward;
  summary.backward = state.result.backward;
  summary.attention_forward = AttentionForwardStats(model_);
  summary.attention_backward = AttentionBackwardStats(model_);
  summary.final_train_loss = state.result.loss;
  summary.final_train_accuracy =
      state.result.counted
          ? double(state.result.correct) / double(state.result.counted)
          : 0.0;
  return true;
}

double SummaryHook::MedianStepSeconds() const { return Median(step_seconds_); }

// ---------------------------------------------------------------- LogHook

LogHook::LogHook(Context context, Progress& progress, MetricsWriter& metrics,
                 UnconvergedHook* unconverged)
    : context_(std::move(context)),
      progress_(progress),
      metrics_(metrics),
      unconverged_(unconverged),
      implicit_(context_.model->implicit() != nullptr) {}

bool LogHook::StepEnded(TrainLoopState& state) {
  const StepResult& result = state.result;
  const int64_t step = state.step;
  window_loss_ += result.loss;
  window_correct_ += static_cast<double>(result.correct);
  window_count_ += static_cast<double>(result.counted);
  window_steps_ += 1;

  const int64_t eval_every = context_.trainer.eval_every;
  const bool do_eval = (eval_every > 0 && step % eval_every == 0) || step == state.total_steps;
  if (step % context_.trainer.log_every != 0 && !do_eval) return true;
  std::map<std::string, double> row = {
      {"step", double(step)},
      {"lr", context_.learning_rate()},
      {"loss", window_loss_ / window_steps_},
      {"accuracy", window_count_ ? window_correct_ / window_count_ : 0.0},
      {"grad_norm", result.grad_norm},
      {"step_ms", 1000.0 * state.step_seconds},
      {"elapsed_s", state.elapsed_seconds},
      {"train_s", state.train_seconds},
      {"peak_rss_mb", PeakResidentMegabytes()},
      {"pool_peak_mb", GetBufferPoolStats().peak_bytes_in_use / 1048576.0},
      {"skipped", 0.0}};
  if (implicit_ && step > context_.trainer.pretrain_steps) {
    const SolverStats& forward = result.forward;
    const SolverStats& backward = result.backward;
    row["fwd_iters_mean"] = forward.iterations_mean;
    row["fwd_iters_max"] = forward.iterations_max;
    row["fwd_residual"] = forward.residual_max;
    row["fwd_unconverged"] = double(forward.not_converged);
    row["bwd_iters_mean"] = backward.iterations_mean;
    row["bwd_iters_max"] = backward.iterations_max;
    // Inexact modes measure no residual: the column stays empty.
    if (backward.HasResidual()) row["bwd_residual"] = backward.residual_max;
    row["bwd_unconverged"] = double(backward.not_converged);
  }
  const TrainSummary& summary = *state.summary;
  for (const auto& [column, value] :
       AttentionSolverColumns(summary.attention_forward, summary.attention_backward)) {
    row[column] = value;
  }
  if (do_eval) Evaluate(state, row);
  metrics_.Write(row);
  if (do_eval && context_.log.plots) WritePlots(context_.run_dir);
  progress_.Update(step, row["loss"], row["accuracy"], result.forward.iterations_mean, implicit_);
  window_loss_ = window_correct_ = window_count_ = window_steps_ = 0;
  return true;
}

void LogHook::Evaluate(TrainLoopState& state, std::map<std::string, double>& row) {
  TrainSummary& summary = *state.summary;
  SequenceModel& model = *context_.model;
  if (context_.before_eval) context_.before_eval();
  std::vector<std::string> warnings;
  for (const auto& [column, value] :
       AttentionDiagnosticColumns(model, *context_.test, kDiagnosticExamples, context_.dtype,
                                  &collapse_warned_, &warnings)) {
    row[column] = value;
  }
  for (const std::string& warning : warnings) progress_.Message(warning);
  // The energy model's block is the model's own fixed point, measured by the
  // gradient check below; in a transformer cell the block is an inner layer.
  if (row.count("attn_spectral_radius") && model.options().kind != ModelKind::kEnergy) {
    summary.equilibrium_monitor.AddSpectralRadius(SolveFamily::kAttention,
                                                  row["attn_spectral_radius"],
                                                  row["attn_spectral_eigenvalue"]);
  }
  if (row.count("attn_max_weight")) progress_.Message(AttentionSummaryLine(row));
  const EvalResult eval =
      stillpoint::Evaluate(model, *context_.test, context_.eval.batch_size, context_.dtype);
  row["test_loss"] = eval.loss;
  row["test_accuracy"] = eval.accuracy;
  if (context_.language_model) {
    row["test_bpc"] = BitsPerSymbol(eval.loss);
    char line[96];
    std::snprintf(line, sizeof(line), "step %lld: held-out %.4f nats/char, %.4f bits/char",
                  static_cast<long long>(state.step), eval.loss, BitsPerSymbol(eval.loss));
    progress_.Message(line);
  }
  if (implicit_) row["test_fwd_iters_mean"] = eval.forward.iterations_mean;
  if (!std::isnan(eval.path_independence.cosine)) {
    row["path_independence_cosine"] = eval.path_independence.cosine;
    row["path_independence_agreement"] = eval.path_independence.agreement;
  }
  summary.final_eval = eval;
  progress_.Eval(state.step, eval.loss, eval.accuracy);
  if (context_.gradient_check_batch.batch_size > 0) {
    // During pretraining the step trained with the unrolled gradient: the
    // check measures that one, and the verdict judges only the implicit
    // steps' gradients.
    const int64_t used_depth = implicit_ && state.step <= context_.trainer.pretrain_steps
                                   ? model.options().unroll_steps
                                   : 0;
    summary.gradient_check = CheckGradient(model, context_.gradient_check_batch, used_depth);
    summary.gradient_check_step = state.step;
    EquilibriumMonitor& monitor = summary.equilibrium_monitor;
    monitor.AddSpectralRadius(SolveFamily::kModel, summary.gradient_check.spectral_radius,
                              summary.gradient_check.spectral_eigenvalue);
    if (used_depth == 0) {
      monitor.AddGradientCheck(summary.gradient_check.cosine, summary.gradient_check.no_reference);
    }
    row["grad_cos"] = summary.gradient_check.cosine;
    row["grad_rel_err"] = summary.gradient_check.relative_error;
    if (!std::isnan(summary.gradient_check.spectral_radius)) {
      row["spectral_radius"] = summary.gradient_check.spectral_radius;
      row["spectral_eigenvalue"] = summary.gradient_check.spectral_eigenvalue;
    }
    progress_.Message("step " + std::to_string(state.step) + ": " +
                      summary.gradient_check.Line());
  }
  if (unconverged_) unconverged_->ReportSinceLast();
}

void LogHook::WritePlots(const std::string& run_dir) {
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
  // Models that solve: the agreement of the fixed points reached from zeros
  // and from a random start, at every evaluation.
  if (!column("path_independence_cosine").empty()) {
    PlotOptions path{"Path independence", "step", "agreement from zero and random starts",
                     false};
    WriteTextFile(run_dir + "/path_independence.svg",
                  LinePlotSvg({EvaluatedPoints("cosine of the fixed points", step,
                                               column("path_independence_cosine")),
                               EvaluatedPoints("prediction agreement", step,
                                               column("path_independence_agreement"))},
                              path));
  }
}

// ---------------------------------------------------------------- CheckpointHook

CheckpointHook::CheckpointHook(int64_t every, std::function<bool()> save)
    : every_(every), save_(std::move(save)) {}

bool CheckpointHook::StepEnded(TrainLoopState& state) {
  if (every_ > 0 && state.step % every_ == 0) save_();
  return true;
}

}  // namespace stillpoint
