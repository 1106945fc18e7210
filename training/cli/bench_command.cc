#include "training/cli/bench_command.h"

#include <time.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <numeric>
#include <ostream>
#include <sstream>

#include "framework/autograd.h"
#include "framework/backend_info.h"
#include "framework/ops.h"
#include "framework/parallel.h"
#include "framework/random.h"
#include "layers/energy_attention.h"
#include "layers/energy_block.h"
#include "training/cli/exit_codes.h"
#include "training/config/config.h"
#include "training/metrics.h"
#include "training/retrieve.h"

namespace stillpoint {
namespace {

// The most timed (or warm-up) steps one bench invocation takes.
constexpr int64_t kMaxBenchSteps = 100000;

// W3 (bench/SPEC.md).
constexpr int64_t kPatterns = 1024;
constexpr int64_t kPatternDim = 64;
constexpr double kHopfieldBeta = 32.0;
constexpr double kZeroedFraction = 0.25;

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// Step-time statistics over the timed steps.
struct TimeStats {
  double median = 0, min = 0, max = 0, p25 = 0, p75 = 0;
};

// The q-quantile of sorted values, interpolating linearly between ranks (as
// numpy's default), so both sides of a comparison summarise alike.
double Quantile(const std::vector<double>& sorted, double q) {
  const double position = q * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(position));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double fraction = position - static_cast<double>(lo);
  return sorted[lo] + fraction * (sorted[hi] - sorted[lo]);
}

TimeStats Summarise(std::vector<double> seconds) {
  std::sort(seconds.begin(), seconds.end());
  TimeStats stats;
  stats.median = Quantile(seconds, 0.5);
  stats.p25 = Quantile(seconds, 0.25);
  stats.p75 = Quantile(seconds, 0.75);
  stats.min = seconds.front();
  stats.max = seconds.back();
  return stats;
}

// What one run measured, printed as text or JSON.
struct BenchReport {
  std::string workload;
  std::string model;  // empty for W3
  std::string attention;  // empty for W3
  int iterations = 0;
  int threads = 0;
  int64_t shards = 1;
  int64_t steps = 0;
  int64_t warmup = 0;
  std::string dtype;
  TimeStats time;         // seconds
  double cpu_median = 0;  // process CPU seconds per timed unit, median
  double flops = 0;       // per timed unit (step, or whole retrieval)
  int64_t peak_bytes = 0;
  // --scaling: the 1-thread steps (seconds) and the per-round ratios.
  bool scaling = false;
  TimeStats one_thread;
  TimeStats ratio;
  // W1/W2.
  std::vector<double> losses;  // every step, warm-up included
  std::string forward_report, adjoint_report;
  int forward_iterations = -1, adjoint_iterations = -1;
  // With an energy attention (--attention): its inner solves over the timed
  // steps, per step, and the iterations of the last inner adjoint solve.
  bool inner = false;
  bool warm_start = false;
  double inner_solves = 0, inner_iterations = 0, inner_warm_starts = 0;
  double inner_adjoint_solves = 0, inner_adjoint_vjps = 0, inner_adjoint_warm_starts = 0;
  int inner_adjoint_iterations = -1;
  // W3.
  double accuracy = -1;
  double iterations_mean = 0;
  int iterations_max = 0;
  int64_t evaluations = 0;
  int64_t queries = 0;
  // Under mpirun (training/cli/bench_ranks.h): text lines and JSON fields.
  std::string ranks_text, ranks_json;
};

void PrintText(const BenchReport& r, std::ostream& out) {
  const double ms = 1e3;
  out << std::fixed << "stillpoint " << r.workload;
  if (!r.model.empty()) out << " " << r.model;
  if (!r.attention.empty() && r.attention != "softmax") out << " " << r.attention << " attention";
  out << " (K=" << r.iterations << ", threads " << r.threads;
  if (r.shards > 1) out << ", " << r.shards << " shards";
  out << ", " << r.dtype << "): median " << std::setprecision(3) << r.time.median * ms
      << " ms (min " << r.time.min * ms << ", max " << r.time.max * ms << ", IQR "
      << r.time.p25 * ms << "-" << r.time.p75 * ms << ") over " << r.steps << " "
      << (r.model.empty() ? "runs" : "steps") << " after " << r.warmup << " warm-up; CPU "
      << r.cpu_median * ms << " ms; ";
  if (r.flops > 0) {
    out << r.flops / 1e9 << " GFLOP, " << std::setprecision(1) << r.flops / r.time.median / 1e9
        << " GFLOP/s; ";
  }
  out << "peak RSS " << std::setprecision(1)
      << static_cast<double>(r.peak_bytes) / (1 << 20) << " MiB\n";
  if (r.scaling) {
    out << std::setprecision(3) << "  scaling: 1 thread median " << r.one_thread.median * ms
        << " ms (IQR " << r.one_thread.p25 * ms << "-" << r.one_thread.p75 * ms << "), "
        << r.threads << " threads " << r.time.median * ms << " ms; per-round ratio median "
        << std::setprecision(2) << r.ratio.median << "x (min " << r.ratio.min << ", max "
        << r.ratio.max << ") over " << r.steps << " rounds\n";
  }
  if (!r.losses.empty()) {
    out << std::setprecision(6) << "  loss: first " << r.losses.front();
    if (r.losses.size() > 1) out << ", after one step " << r.losses[1];
    out << ", last " << r.losses.back() << "\n";
  }
  out << r.ranks_text;
  if (!r.forward_report.empty()) out << "  forward: " << r.forward_report << "\n";
  if (!r.adjoint_report.empty()) out << "  adjoint: " << r.adjoint_report << "\n";
  if (r.inner) {
    out << std::setprecision(2) << "  inner solves (" << (r.warm_start ? "warm" : "cold")
        << " start): " << r.inner_solves << " per step, " << r.inner_iterations
        << " forward iterations per step ("
        << (r.inner_solves > 0 ? r.inner_iterations / r.inner_solves : 0.0) << " per solve), "
        << r.inner_warm_starts << " warm-started per step\n"
        << "  inner adjoint solves: " << r.inner_adjoint_solves << " per step, "
        << r.inner_adjoint_vjps << " VJPs per step, " << r.inner_adjoint_warm_starts
        << " warm-started per step; the last took " << r.inner_adjoint_iterations
        << " iterations\n";
  }
  if (r.accuracy >= 0) {
    out << std::setprecision(4) << "  accuracy " << r.accuracy << " over " << r.queries
        << " queries; iterations mean " << std::setprecision(2) << r.iterations_mean << ", max "
        << r.iterations_max << "; " << r.evaluations << " query evaluations\n";
  }
  out.unsetf(std::ios_base::floatfield);
}

void PrintJson(const BenchReport& r, std::ostream& out) {
  const double ms = 1e3;
  out << "{\"framework\": \"stillpoint\", \"workload\": " << JsonString(r.workload)
      << ", \"model\": " << (r.model.empty() ? "null" : JsonString(r.model))
      << ", \"attention\": " << (r.attention.empty() ? "null" : JsonString(r.attention))
      << ", \"iters\": " << r.iterations << ", \"threads\": " << r.threads
      << ", \"shards\": " << r.shards << ", \"steps\": " << r.steps << ", \"warmup\": " << r.warmup
      << ", \"dtype\": " << JsonString(r.dtype)
      << ", \"gemm\": " << JsonString(MatrixProductBackendName())
      << ", \"median_ms\": " << JsonNumber(r.time.median * ms)
      << ", \"min_ms\": " << JsonNumber(r.time.min * ms)
      << ", \"max_ms\": " << JsonNumber(r.time.max * ms)
      << ", \"p25_ms\": " << JsonNumber(r.time.p25 * ms)
      << ", \"p75_ms\": " << JsonNumber(r.time.p75 * ms)
      << ", \"cpu_median_ms\": " << JsonNumber(r.cpu_median * ms)
      << ", \"flops\": " << (r.flops > 0 ? JsonNumber(r.flops) : "null")
      << ", \"gflops_per_s\": " << (r.flops > 0 ? JsonNumber(r.flops / r.time.median / 1e9) : "null")
      << ", \"peak_rss_mb\": " << JsonNumber(static_cast<double>(r.peak_bytes) / (1 << 20));
  if (r.scaling) {
    out << ", \"one_thread_median_ms\": " << JsonNumber(r.one_thread.median * ms)
        << ", \"one_thread_p25_ms\": " << JsonNumber(r.one_thread.p25 * ms)
        << ", \"one_thread_p75_ms\": " << JsonNumber(r.one_thread.p75 * ms)
        << ", \"scaling_median\": " << JsonNumber(r.ratio.median)
        << ", \"scaling_min\": " << JsonNumber(r.ratio.min)
        << ", \"scaling_max\": " << JsonNumber(r.ratio.max);
  }
  if (!r.losses.empty()) {
    out << ", \"loss_first\": " << JsonNumber(r.losses.front())
        << ", \"loss_after_one_step\": " << (r.losses.size() > 1 ? JsonNumber(r.losses[1]) : "null")
        << ", \"loss_last\": " << JsonNumber(r.losses.back());
  }
  if (r.forward_iterations >= 0) {
    out << ", \"forward_iterations\": " << r.forward_iterations
        << ", \"adjoint_iterations\": " << r.adjoint_iterations;
  }
  if (r.inner) {
    out << ", \"warm_start\": " << (r.warm_start ? "true" : "false")
        << ", \"inner_solves_per_step\": " << JsonNumber(r.inner_solves)
        << ", \"inner_iterations_per_step\": " << JsonNumber(r.inner_iterations)
        << ", \"inner_iterations_per_solve\": "
        << JsonNumber(r.inner_solves > 0 ? r.inner_iterations / r.inner_solves : 0.0)
        << ", \"inner_warm_starts_per_step\": " << JsonNumber(r.inner_warm_starts)
        << ", \"inner_adjoint_iterations\": " << r.inner_adjoint_iterations
        << ", \"inner_adjoint_solves_per_step\": " << JsonNumber(r.inner_adjoint_solves)
        << ", \"inner_adjoint_vjps_per_step\": " << JsonNumber(r.inner_adjoint_vjps)
        << ", \"inner_adjoint_warm_starts_per_step\": "
        << JsonNumber(r.inner_adjoint_warm_starts);
  }
  if (r.accuracy >= 0) {
    out << ", \"accuracy\": " << JsonNumber(r.accuracy) << ", \"queries\": " << r.queries
        << ", \"iterations_mean\": " << JsonNumber(r.iterations_mean)
        << ", \"iterations_max\": " << r.iterations_max << ", \"evaluations\": " << r.evaluations;
  }
  out << r.ranks_json << "}\n";
}

// ---- W3

struct RetrievalData {
  Tensor patterns;  // [N, d]
  Tensor queries;   // [N, d]: pattern q with a quarter of its entries zeroed
};

RetrievalData MakeRetrievalData(DType dtype, uint64_t seed) {
  Rng rng(seed);
  std::vector<double> patterns(kPatterns * kPatternDim);
  const double scale = 1.0 / std::sqrt(static_cast<double>(kPatternDim));  // |x| = 1
  for (double& v : patterns) v = rng.UniformInt(2) == 0 ? -scale : scale;
  std::vector<double> queries = patterns;
  const int64_t zeroed = static_cast<int64_t>(kZeroedFraction * kPatternDim);
  std::vector<int64_t> order(kPatternDim);
  for (int64_t q = 0; q < kPatterns; ++q) {
    // A fresh random subset of exactly `zeroed` entries per query.
    std::iota(order.begin(), order.end(), 0);
    for (int64_t i = 0; i < zeroed; ++i) {
      std::swap(order[i], order[i + rng.UniformInt(kPatternDim - i)]);
      queries[q * kPatternDim + order[i]] = 0.0;
    }
  }
  return {Tensor::FromVector(Shape{kPatterns, kPatternDim}, patterns, dtype),
          Tensor::FromVector(Shape{kPatterns, kPatternDim}, queries, dtype)};
}

BenchReport RunRetrievalBench(const BenchArgs& args, int iterations, DType dtype) {
  const RetrievalData data = MakeRetrievalData(dtype, args.seed);
  ForwardSolverOptions options = RetrievalSolverOptions();
  options.max_iterations = iterations;
  BenchReport report;
  std::vector<double> seconds, cpu;
  RetrievalResult result;
  for (int64_t run = 0; run < args.warmup + args.steps; ++run) {
    // Wall and CPU time of the solve alone; the float64 diagnostics
    // (nearest pattern, energy) are computed once, after the timed runs.
    const double cpu_start = ProcessCpuSeconds();
    result = SolveHopfield(data.patterns, data.queries, kHopfieldBeta, options);
    const double cpu_seconds = ProcessCpuSeconds() - cpu_start;
    if (run >= args.warmup) {
      seconds.push_back(result.seconds);
      cpu.push_back(cpu_seconds);
    }
  }
  DiagnoseHopfield(data.patterns, kHopfieldBeta, &result);
  report.time = Summarise(seconds);
  report.cpu_median = Summarise(cpu).median;
  int64_t correct = 0;
  for (int64_t q = 0; q < kPatterns; ++q) correct += result.nearest[q] == q ? 1 : 0;
  report.queries = kPatterns;
  report.accuracy = static_cast<double>(correct) / static_cast<double>(kPatterns);
  const std::vector<int>& per_query = result.summary.sample_iterations;
  report.iterations_mean =
      std::accumulate(per_query.begin(), per_query.end(), 0.0) / static_cast<double>(kPatterns);
  report.iterations_max = *std::max_element(per_query.begin(), per_query.end());
  report.evaluations = result.summary.function_evaluations;
  // Per evaluated query: scores (2 N d) and the weighted sum (2 N d).
  report.flops = 4.0 * kPatterns * kPatternDim * static_cast<double>(report.evaluations);
  report.forward_report = result.summary.BriefReport();
  return report;
}

// ---- W1 / W2

// The shapes of a W1 or W2 run: the exported model's, or the workload's.
TransformerShapes ShapesOf(const BenchArgs& args, const WeightsExport* weights) {
  if (weights != nullptr) return weights->shapes;
  return args.workload == "w2" ? W2Shapes() : W1Shapes();  // W4 has W1's shapes
}

BenchReport RunTransformerBench(const BenchArgs& args,
                                ModelKind kind,
                                int iterations,
                                DType dtype,
                                const WeightsExport* weights) {
  const TransformerShapes shapes = ShapesOf(args, weights);
  ModelOptions options = BenchModelOptions(shapes, kind, iterations, dtype, args.seed);
  const std::string attention = args.attention.empty() ? "softmax" : args.attention;
  SetBenchAttention(&options, attention, !args.no_warm_start);
  GradientReducerOptions reduction;
  reduction.overlap = !args.no_overlap;
  reduction.bucket_bytes = args.bucket_kb * 1024;
  RankBench ranks(reduction);
  TransformerBench bench(options,
                         weights != nullptr ? weights->batch : ReversalBatch(shapes, args.seed),
                         weights != nullptr ? weights->parameters : NamedTensors{}, args.shards,
                         &ranks);
  BenchReport report;
  // The energy attentions of the model (none with softmax) and their inner
  // counts over the timed steps.
  const auto attentions = FindEnergyAttentions(bench.model());
  // One step on `threads` threads: its wall and CPU seconds.
  auto timed_step = [&](int threads, double* wall, double* cpu_seconds) {
    SetNumThreads(threads);
    const double cpu_start = ProcessCpuSeconds();
    const Clock::time_point start = Clock::now();
    report.losses.push_back(bench.Step());
    *wall = Seconds(start);
    *cpu_seconds = ProcessCpuSeconds() - cpu_start;
  };
  std::vector<double> seconds, cpu, one_thread_seconds, ratios;
  for (int64_t round = 0; round < args.warmup + args.steps; ++round) {
    if (round == args.warmup) {
      for (const auto& named : attentions) named.second->ResetInnerCounts();
    }
    double wall = 0, cpu_seconds = 0;
    if (!args.scaling) {
      timed_step(args.threads, &wall, &cpu_seconds);
    } else {
      // The 1-thread step first in even rounds and second in odd ones, so
      // neither always runs on caches the other warmed.
      double one_wall = 0, one_cpu = 0;
      if (round % 2 == 0) timed_step(1, &one_wall, &one_cpu);
      timed_step(args.threads, &wall, &cpu_seconds);
      if (round % 2 == 1) timed_step(1, &one_wall, &one_cpu);
      if (round >= args.warmup) {
        one_thread_seconds.push_back(one_wall);
        ratios.push_back(one_wall / wall);
      }
    }
    if (round >= args.warmup) {
      seconds.push_back(wall);
      cpu.push_back(cpu_seconds);
      ranks.Record();
    }
  }
  SetNumThreads(args.threads);
  report.time = Summarise(seconds);
  report.cpu_median = Summarise(cpu).median;
  if (args.scaling) {
    report.scaling = true;
    report.one_thread = Summarise(one_thread_seconds);
    report.ratio = Summarise(ratios);
  }
  // With an energy attention the count depends on the inner iterations.
  report.flops = attentions.empty() ? TransformerStepFlops(shapes, kind, iterations) : 0.0;
  if (!attentions.empty()) {
    report.inner = true;
    report.warm_start = !args.no_warm_start;
    const double units = static_cast<double>(args.steps * (args.scaling ? 2 : 1));
    for (const auto& named : attentions) {
      const EnergyAttention::InnerCounts& counts = named.second->inner_counts();
      report.inner_solves += static_cast<double>(counts.solves) / units;
      report.inner_iterations += static_cast<double>(counts.forward_iterations) / units;
      report.inner_warm_starts += static_cast<double>(counts.warm_starts) / units;
      report.inner_adjoint_solves += static_cast<double>(counts.adjoint_solves) / units;
      report.inner_adjoint_vjps += static_cast<double>(counts.adjoint_vjps) / units;
      report.inner_adjoint_warm_starts += static_cast<double>(counts.adjoint_warm_starts) / units;
    }
    if (const auto adjoint = attentions.back().second->implicit().backward_summary()) {
      report.inner_adjoint_iterations = adjoint->iterations;
    }
  }
  std::ostringstream ranks_text, ranks_json;
  ranks.PrintText(ranks_text);
  ranks.PrintJsonFields(ranks_json);
  report.ranks_text = ranks_text.str();
  report.ranks_json = ranks_json.str();
  if (const Implicit* implicit = bench.model().implicit()) {
    report.forward_iterations = implicit->forward_summary().iterations;
    report.forward_report = implicit->forward_summary().BriefReport();
    if (const auto adjoint = implicit->backward_summary()) {
      report.adjoint_iterations = adjoint->iterations;
      report.adjoint_report = adjoint->BriefReport();
    }
  }
  return report;
}

}  // namespace

// ---------------------------------------------------------------- pieces

TransformerShapes W1Shapes() { return TransformerShapes{}; }

TransformerShapes W2Shapes() {
  TransformerShapes shapes;
  shapes.batch = 8;
  shapes.length = 256;
  return shapes;
}

TokenBatch ReversalBatch(const TransformerShapes& shapes, uint64_t seed) {
  Rng rng(seed + 1);  // apart from the parameter stream of the same seed
  TokenBatch batch;
  batch.shape = Shape{shapes.batch, shapes.length};
  batch.ids.resize(shapes.batch * shapes.length);
  batch.targets.resize(batch.ids.size());
  for (int64_t& id : batch.ids) id = rng.UniformInt(shapes.vocab_size);
  for (int64_t b = 0; b < shapes.batch; ++b) {
    for (int64_t t = 0; t < shapes.length; ++t) {
      batch.targets[b * shapes.length + t] = batch.ids[b * shapes.length + shapes.length - 1 - t];
    }
  }
  return batch;
}

ModelOptions BenchModelOptions(
    const TransformerShapes& shapes, ModelKind kind, int iterations, DType dtype, uint64_t seed) {
  ModelOptions options;
  options.kind = kind;
  options.vocab_size = shapes.vocab_size;
  options.max_length = shapes.length;
  options.dim = shapes.dim;
  options.cell = "deq_transformer";
  options.cell_options.heads = shapes.heads;
  options.cell_options.hidden = shapes.hidden;
  options.cell_options.ln_eps = 1e-5;
  options.cell_options.causal = false;
  options.cell_options.dropout = 0.0;
  options.num_layers = shapes.num_layers;
  options.head_ln_eps = 1e-5;
  options.dtype = dtype;
  options.seed = seed;

  ForwardSolverOptions& forward = options.implicit.forward;
  forward.type = ForwardSolverType::kAnderson;
  forward.anderson_type = AndersonType::kTypeII;
  forward.anderson_memory = 5;
  forward.anderson_lambda = 1e-4;
  forward.anderson_beta = 1.0;
  // The DEQ-literature Anderson has no safeguard; with it on, a rejected
  // step would cost an extra evaluation and break the fixed budget.
  forward.anderson_safeguard_factor = 0.0;
  // Tolerance 0: a fixed budget of exactly `iterations` iterations.
  forward.max_iterations = iterations;
  forward.stop_mode = StopMode::kRelative;
  forward.relative_tolerance = 0.0;
  forward.absolute_tolerance = 0.0;
  forward.fallback_chain.clear();

  BackwardOptions& backward = options.implicit.backward;
  backward.mode = BackwardMode::kIft;
  backward.solver = AdjointSolverType::kFixedPoint;
  backward.max_iterations = iterations;
  backward.tolerance = 0.0;
  backward.warm_start = false;

  if (kind == ModelKind::kEnergy) {
    // W4: the probabilistic-attention block with constant precisions
    // alpha = 1/sqrt(dh) (beta 0: the default) and beta = 1/dh
    // (value_precision 1), biases on its projections, plain EM on unscaled
    // values.
    EnergyBlockOptions& block = options.energy;
    block.layer = "probabilistic";
    block.dim = shapes.dim;
    block.heads = shapes.heads;
    block.beta = 0.0;
    block.value_precision = 1.0;
    block.value_contraction = 0.0;  // the workload (and its PyTorch peer) has plain values
    block.normalize_input = true;
    block.projection_bias = true;
    block.learn_precisions = false;
    block.dtype = dtype;
    forward.type = ForwardSolverType::kPicard;
  }
  return options;
}

std::vector<std::string> BenchAttentionNames() {
  std::vector<std::string> names = {"softmax"};
  for (const std::string& name : EnergyBlockRegistry().Names()) names.push_back(name);
  return names;
}

void SetBenchAttention(ModelOptions* options, const std::string& attention, bool warm_start) {
  if (attention == "softmax") return;
  CellOptions& cell = options->cell_options;
  cell.attention = attention;
  cell.energy = EnergyBlockOptions{};  // the block's defaults, as model.attention = NAME
  cell.attention_warm_start = warm_start;
  ImplicitOptions inner = DefaultAttentionSolverOptions();
  inner.forward.type = ForwardSolverType::kPicard;  // the block's update: EM for probabilistic
  inner.forward.max_iterations = 16;
  inner.forward.stop_mode = StopMode::kRelative;
  inner.forward.relative_tolerance = 1e-4;
  inner.backward.solver = AdjointSolverType::kFixedPoint;
  inner.backward.max_iterations = 16;
  inner.backward.tolerance = 1e-5;
  cell.attention_solver = inner;
}

OptimizerOptions BenchOptimizerOptions() {
  OptimizerOptions options;
  options.type = "adamw";
  options.learning_rate = 1e-3;
  options.beta1 = 0.9;
  options.beta2 = 0.999;
  options.epsilon = 1e-8;
  options.weight_decay = 0.01;
  return options;
}

double TransformerStepFlops(const TransformerShapes& s, ModelKind kind, int iterations) {
  const double bt = static_cast<double>(s.batch * s.length);
  const double d = static_cast<double>(s.dim);
  const double feed_forward = 4.0 * bt * d * static_cast<double>(s.hidden);
  const double linear = 8.0 * bt * d * d + feed_forward;
  const double attention = 4.0 * bt * static_cast<double>(s.length) * d;
  const double cell = linear + attention;
  const double vjp_state = linear + 2.0 * attention;
  const double vjp_all = 2.0 * linear + 2.0 * attention;
  const double head = 6.0 * bt * d * static_cast<double>(s.vocab_size);
  if (kind == ModelKind::kExplicit) {
    // The first cell starts from z0 = 0, where its attention is one row
    // (MultiHeadAttention::ForwardAtZero): only its feed-forward block is
    // done in full, forward and backward.
    return static_cast<double>(s.num_layers - 1) * (cell + vjp_all) + 3.0 * feed_forward + head;
  }
  // The solver's first evaluation, at z0 = 0, is likewise the feed-forward
  // block alone (DEQCell::Forward on a zero state); its last, at z*, is the
  // recorded one (SolveImplicit), so there are K full evaluations.
  const double k = static_cast<double>(iterations);
  if (kind == ModelKind::kEnergy) {
    // W4. An EM map F(v) is two products per head, beta v m^T and w m
    // (4 B T T d in all), its VJP in v two more; the scores alpha q k^T and
    // the start v0 = softmax(alpha q k^T) m are computed once; the recorded
    // F(v*) and its VJP into q, k and m (two products for m, two for the
    // scores) once. The four projections are 8 B T d^2 forward and twice
    // that backward, the feed-forward sublayer likewise.
    const double projections = 8.0 * bt * d * d;
    const double em = attention;
    const double scores_and_start = em;  // alpha q k^T and softmax(.) m: two products
    return 3.0 * projections + scores_and_start + (k + 1.0) * em + k * em + 2.0 * em +
           3.0 * feed_forward + head;
  }
  return k * cell + feed_forward + k * vjp_state + vjp_all + head;
}

double ProcessCpuSeconds() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

int64_t PeakResidentBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) {
      std::istringstream fields(line.substr(6));
      int64_t kilobytes = 0;
      fields >> kilobytes;
      return kilobytes * 1024;
    }
  }
  return 0;
}

// ---------------------------------------------------------------- weights

namespace {

Tensor ReadExportTensor(const YAML::Node& node, const std::string& where) {
  SP_CHECK(node && node.IsMap() && node["shape"] && node["data"], where,
           ": expected {\"shape\": [...], \"data\": [...]}");
  std::vector<int64_t> dims;
  for (const YAML::Node& d : node["shape"]) dims.push_back(d.as<int64_t>());
  std::vector<double> data;
  data.reserve(node["data"].size());
  for (const YAML::Node& v : node["data"]) data.push_back(v.as<double>());
  const Shape shape(dims);
  SP_CHECK(static_cast<int64_t>(data.size()) == shape.numel(), where, ": shape ", shape, " needs ",
           shape.numel(), " values, got ", data.size());
  return Tensor::FromVector(shape, data, DType::kFloat64);
}

std::vector<int64_t> ReadIdRows(const YAML::Node& rows,
                                const std::string& where,
                                int64_t* batch,
                                int64_t* length) {
  SP_CHECK(rows && rows.IsSequence() && rows.size() > 0, where, ": expected a list of rows");
  std::vector<int64_t> ids;
  *batch = static_cast<int64_t>(rows.size());
  *length = -1;
  for (const YAML::Node& row : rows) {
    SP_CHECK(row.IsSequence(), where, ": every row must be a list of ids");
    SP_CHECK(*length < 0 || static_cast<int64_t>(row.size()) == *length, where,
             ": rows differ in length");
    *length = static_cast<int64_t>(row.size());
    for (const YAML::Node& id : row) ids.push_back(id.as<int64_t>());
  }
  return ids;
}

}  // namespace

WeightsExport LoadWeightsExport(const std::string& path, ModelKind kind) {
  SP_CHECK(kind == ModelKind::kImplicit || kind == ModelKind::kExplicit ||
               kind == ModelKind::kEnergy,
           "LoadWeightsExport: only implicit, explicit and energy (W4) models are exported");
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    SP_CHECK(false, path, ": cannot read the weights file: ", e.what());
  }
  WeightsExport result;
  try {
    const YAML::Node config = root["config"];
    SP_CHECK(config && config.IsMap(), path, ": no \"config\" object");
    for (const char* key : {"V", "T", "B", "d", "heads", "hidden"}) {
      SP_CHECK(config[key], path, ": config has no \"", key, "\"");
    }
    TransformerShapes& shapes = result.shapes;
    shapes.vocab_size = config["V"].as<int64_t>();
    shapes.length = config["T"].as<int64_t>();
    shapes.batch = config["B"].as<int64_t>();
    shapes.dim = config["d"].as<int64_t>();
    shapes.heads = config["heads"].as<int64_t>();
    shapes.hidden = config["hidden"].as<int64_t>();

    int64_t batch = 0, length = 0, target_batch = 0, target_length = 0;
    result.batch.ids = ReadIdRows(root["x"], path + ": x", &batch, &length);
    result.batch.targets = ReadIdRows(root["y"], path + ": y", &target_batch, &target_length);
    SP_CHECK(batch == shapes.batch && length == shapes.length && target_batch == batch &&
                 target_length == length,
             path, ": x and y must be [B, T] = [", shapes.batch, ", ", shapes.length, "]");
    result.batch.shape = Shape{batch, length};
    for (size_t i = 0; i < result.batch.ids.size(); ++i) {
      SP_CHECK(result.batch.ids[i] >= 0 && result.batch.ids[i] < shapes.vocab_size &&
                   result.batch.targets[i] >= 0 && result.batch.targets[i] < shapes.vocab_size,
               path, ": token ids and targets must lie in [0, V = ", shapes.vocab_size, ")");
    }

    const char* section_name = ToString(kind);
    const YAML::Node section = root[section_name];
    SP_CHECK(section && section["params"] && section["params"].IsMap(), path, ": no \"",
             section_name, ".params\" object");
    if (kind == ModelKind::kExplicit) {
      SP_CHECK(section["n_layers"], path, ": no \"explicit.n_layers\"");
      shapes.num_layers = section["n_layers"].as<int64_t>();
    }
    for (const auto& entry : section["params"]) {
      const std::string name = entry.first.as<std::string>();
      result.parameters.emplace_back(
          name, ReadExportTensor(entry.second, path + ": " + section_name + ".params." + name));
    }
  } catch (const YAML::Exception& e) {
    SP_CHECK(false, path, ": malformed weights file: ", e.what());
  }
  return result;
}

// ---------------------------------------------------------------- stepping

TransformerBench::TransformerBench(const ModelOptions& options,
                                   TokenBatch batch,
                                   const NamedTensors& initial,
                                   int64_t shards,
                                   RankBench* ranks)
    : model_(std::make_shared<SequenceModel>(options)) {
  batch_.batch_size = batch.shape.dim(0);
  batch_.length = batch.shape.dim(1);
  batch_.tokens = std::move(batch.ids);
  batch_.targets = std::move(batch.targets);
  if (!initial.empty()) model_->LoadParameters(initial);
  optimizer_ = Optimizer::Create(BenchOptimizerOptions(), model_->named_parameters());
  ShardRows(batch_.batch_size, shards, 0);  // a clear error before building replicas
  TrainStepOptions step_options;
  step_options.shards = shards;
  step_options.clip_norm = 0;  // the workloads' step has no clipping (bench/SPEC.md)
  step_ = std::make_unique<TrainStep>(model_, *optimizer_, step_options, [options](int64_t) {
    return std::make_shared<SequenceModel>(options);
  });
  if (ranks != nullptr && ranks->active()) {
    ranks->Attach(*step_, shards, model_->parameters(), batch_.batch_size);
  }
}

double TransformerBench::Step() {
  const StepResult result = step_->Run(batch_);
  SP_CHECK(result.failure.empty(), "bench: step ", optimizer_->step_count() + 1, ": ",
           result.failure);
  return result.loss;
}

// ---------------------------------------------------------------- command

int RunBench(const BenchArgs& args, std::ostream& out, std::ostream& err) {
  ModelKind kind = ModelKind::kImplicit;
  DType dtype = DType::kFloat32;
  int iterations = 0;
  WeightsExport weights;
  if (args.workload == "scale") return RunBenchScale(args, out, err);
  if (args.workload == "allreduce") {
    try {
      SP_CHECK(args.steps >= 1 && args.steps <= kMaxBenchSteps && args.warmup >= 0 &&
                   args.warmup <= kMaxBenchSteps,
               "--steps must be in [1, ", kMaxBenchSteps, "] and --warmup in [0, ",
               kMaxBenchSteps, "]");
    } catch (const std::exception& e) {
      err << "error: " << e.what() << "\n";
      return kBadInput;
    }
    RunReduceBench(args.steps, args.warmup, args.json, out);
    return kOk;
  }
  try {
    const bool transformer =
        args.workload == "w1" || args.workload == "w2" || args.workload == "w4";
    SP_CHECK(transformer || args.workload == "w3", "bench: unknown workload '", args.workload,
             "' (expected w1, w2, w3, w4, allreduce or scale)");
    SP_CHECK(args.bucket_kb >= 1, "--bucket-kb must be >= 1, got ", args.bucket_kb);
    if (!args.attention.empty()) {
      const std::vector<std::string> names = BenchAttentionNames();
      if (std::find(names.begin(), names.end(), args.attention) == names.end()) {
        std::string known;
        for (const std::string& n : names) known += (known.empty() ? "" : ", ") + n;
        const std::string closest = ClosestName(args.attention, names);
        SP_CHECK(false, "--attention: unknown attention '", args.attention, "' (known: ", known,
                 ")", closest.empty() ? "" : "; did you mean '" + closest + "'?");
      }
      SP_CHECK(args.workload == "w1" || args.workload == "w2",
               "--attention applies to w1 and w2 (the DEQ-transformer cell), not ", args.workload);
      SP_CHECK(args.attention == "softmax" || args.weights_path.empty(),
               "--weights holds a softmax-attention model; --attention ", args.attention,
               " does not apply to it");
    }
    SP_CHECK(!args.no_warm_start || (!args.attention.empty() && args.attention != "softmax"),
             "--no-warm-start applies to an energy --attention (its inner solve)");
    if (args.workload == "w4") {
      kind = ModelKind::kEnergy;
      SP_CHECK(args.model.empty() || args.model == "energy",
               "--model: w4 is the energy-attention model (energy), got '", args.model, "'");
    } else if (transformer) {
      const std::string model = args.model.empty() ? "implicit" : args.model;
      SP_CHECK(StringToModelKind(model, &kind) &&
                   (kind == ModelKind::kImplicit || kind == ModelKind::kExplicit),
               "--model: expected implicit or explicit, got '", args.model, "'");
    } else {
      SP_CHECK(args.model.empty(), "--model does not apply to w3 (Hopfield retrieval)");
      SP_CHECK(args.weights_path.empty(), "--weights does not apply to w3");
    }
    SP_CHECK(args.iterations >= 0 && args.iterations <= 100000,
             "--iters must be >= 1 (0: the workload's default), got ", args.iterations);
    iterations = static_cast<int>(args.iterations > 0 ? args.iterations : transformer ? 16 : 32);
    SP_CHECK(args.threads >= 1 && args.threads <= kMaxThreads, "--threads must be in [1, ",
             kMaxThreads, "], got ", args.threads);
    SP_CHECK(args.shards >= 1, "--shards must be >= 1, got ", args.shards);
    SP_CHECK(transformer || args.shards == 1, "--shards does not apply to w3 (Hopfield retrieval)");
    // Bounded so a mistyped count ends: --steps 99999999999 ran for ever
    // with no output.
    SP_CHECK(args.steps >= 1 && args.steps <= kMaxBenchSteps, "--steps must be in [1, ",
             kMaxBenchSteps, "], got ", args.steps);
    SP_CHECK(args.warmup >= 0 && args.warmup <= kMaxBenchSteps, "--warmup must be in [0, ",
             kMaxBenchSteps, "], got ", args.warmup);
    SP_CHECK(!args.scaling || transformer, "--scaling does not apply to w3 (Hopfield retrieval)");
    SP_CHECK(!args.scaling || args.threads >= 2,
             "--scaling compares 1 thread with --threads, which must then be >= 2, got ",
             args.threads);
    SP_CHECK(StringToDType(args.dtype, &dtype), "--dtype: '", args.dtype,
             "' is not float32 or float64");
    if (!args.weights_path.empty()) weights = LoadWeightsExport(args.weights_path, kind);
    if (transformer) {
      const int64_t rows = ShapesOf(args, args.weights_path.empty() ? nullptr : &weights).batch;
      SP_CHECK(args.shards <= rows, "--shards ", args.shards, ": the ", args.workload,
               " batch has only ", rows, " sequences to share out");
    }
  } catch (const std::exception& e) {
    err << "error: " << e.what() << "\n";
    return kBadInput;
  }
  try {
    SetNumThreads(args.threads);
    BenchReport report = args.workload == "w3"
                             ? RunRetrievalBench(args, iterations, dtype)
                             : RunTransformerBench(args, kind, iterations, dtype,
                                                   args.weights_path.empty() ? nullptr : &weights);
    report.workload = args.workload;
    report.model = args.workload == "w3" ? "" : ToString(kind);
    if (args.workload == "w4") {
      report.attention = "probabilistic";  // W4's block
    } else if (args.workload != "w3") {
      report.attention = args.attention.empty() ? "softmax" : args.attention;
    }
    report.iterations = iterations;
    report.threads = args.threads;
    report.shards = args.shards;
    report.steps = args.steps;
    report.warmup = args.warmup;
    report.dtype = ToString(dtype);
    report.peak_bytes = PeakResidentBytes();
    if (args.json) {
      PrintJson(report, out);
    } else {
      PrintText(report, out);
    }
    return kOk;
  } catch (const std::exception& e) {
    err << "error: " << e.what() << "\n";
    return kRuntimeFailure;
  }
}

}  // namespace stillpoint
