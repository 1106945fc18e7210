// Micro-benchmarks of the framework's kernels (Google Benchmark).
//
//   build/bench/ops_bench --benchmark_counters_tabular=true
//
// GFLOP/s counters count 2*m*n*k per matrix product. Use a Release build
// with STILLPOINT_NATIVE=ON (preset `release`) for figures worth recording.
//
// To compare two builds on a shared machine, whose speed changes within
// seconds, run each with many short repetitions and read the `_min` rows
// (the best repetition), alternating the binaries:
//
//   ops_bench --benchmark_filter=SelfAttention --benchmark_repetitions=40
//             --benchmark_min_time=0.05 --benchmark_report_aggregates_only=true
//
// On the 2-vCPU machine of bench/RESULTS.md three such runs of one binary
// gave one-thread minima within 1% (T = 32) and 3% (T = 256) of each other
// while their medians moved by 15%.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <vector>

#include "framework/autograd.h"
#include "framework/ops.h"
#include "framework/parallel.h"
#include "framework/random.h"
#include "framework/kernels/vector_math.h"

namespace stillpoint {
namespace {

Var RandomVar(const Shape& shape, uint64_t seed, bool requires_grad = false) {
  Rng rng(seed);
  return Var(RandomNormal(shape, 0, 1, DType::kFloat32, rng), requires_grad);
}

// The best repetition (reported as the `_min` aggregate).
double Min(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

// The batch of the attention workload with sequence length t: W1 (T = 32,
// batch 32) or W2 (T = 256, batch 8) of bench/SPEC.md.
int64_t WorkloadBatch(int64_t t) { return t == 32 ? 32 : 8; }

void SetThreads(const benchmark::State& state, int arg_index) {
  SetNumThreads(static_cast<int>(state.range(arg_index)));
}

// The core's float32 multiply-add ceiling, the yardstick for the GEMM
// figures below: twelve independent accumulators (as many as the packed
// kernel's tiles hold: 6 rows x 2 packets or 12 rows x 1) updated with
// packet multiply-adds, nothing loaded or stored, so only the multiply-add
// units limit it. One thread. (Zen 4 with AVX-512: 116 GFLOP/s, against
// 110-115 for the packed kernel's W1 projections with hot caches.)
void BM_MultiplyAddPeak(benchmark::State& state) {
  using internal::FloatPacket;
  using internal::PacketSet;
  constexpr int kAccumulators = 12;
  constexpr int64_t kSteps = 1 << 16;
  FloatPacket acc[kAccumulators];
  for (int i = 0; i < kAccumulators; ++i) acc[i] = PacketSet(0.001f * i);
  // |factor| < 1 keeps the accumulators bounded over any number of steps.
  const FloatPacket factor = PacketSet(0.9999f);
  const FloatPacket term = PacketSet(1e-5f);
  for (auto _ : state) {
    for (int64_t step = 0; step < kSteps; ++step) {
#pragma GCC unroll 12
      for (int i = 0; i < kAccumulators; ++i) {
        acc[i] = Eigen::internal::pmadd(acc[i], factor, term);
      }
    }
    for (int i = 0; i < kAccumulators; ++i) benchmark::DoNotOptimize(acc[i]);
  }
  state.counters["GFLOP/s"] = benchmark::Counter(static_cast<double>(state.iterations()) * kSteps *
                                                     kAccumulators * internal::kVecBlock * 2 / 1e9,
                                                 benchmark::Counter::kIsRate);
}
BENCHMARK(BM_MultiplyAddPeak)->ComputeStatistics("min", Min)->UseRealTime();

// Square float32 matmul n x n x n. Args: n, threads.
void BM_Matmul(benchmark::State& state) {
  const int64_t n = state.range(0);
  SetThreads(state, 1);
  NoGrad no_grad;
  Var a = RandomVar(Shape{n, n}, 1), b = RandomVar(Shape{n, n}, 2);
  for (auto _ : state) benchmark::DoNotOptimize(matmul(a, b).value().data<float>());
  state.counters["GFLOP/s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * 2.0 * n * n * n / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Matmul)
    ->ComputeStatistics("min", Min)
    ->ArgsProduct({{64, 128, 256, 512, 1024}, {1, 2}})
    ->ArgNames({"n", "threads"})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// The W1 projection shape: [B*T, d] x [d, d_out]. Args: d_out, threads.
void BM_MatmulW1Projection(benchmark::State& state) {
  const int64_t rows = 32 * 32, d = 64, out = state.range(0);
  SetThreads(state, 1);
  NoGrad no_grad;
  Var a = RandomVar(Shape{rows, d}, 1), w = RandomVar(Shape{d, out}, 2);
  for (auto _ : state) benchmark::DoNotOptimize(matmul(a, w).value().data<float>());
  state.counters["GFLOP/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * 2.0 * rows * d * out / 1e9,
                         benchmark::Counter::kIsRate);
}
BENCHMARK(BM_MatmulW1Projection)
    ->ComputeStatistics("min", Min)
    ->ArgsProduct({{64, 128}, {1, 2}})
    ->ArgNames({"out", "threads"})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// A weight gradient x^T g of a W2 layer: x [B*T, in], g [B*T, out], depth
// B*T = 2048. Args: in, out, threads.
void BM_WeightGradientW2(benchmark::State& state) {
  const int64_t rows = 8 * 256, in = state.range(0), out = state.range(1);
  SetThreads(state, 2);
  NoGrad no_grad;
  Var x = RandomVar(Shape{rows, in}, 1), g = RandomVar(Shape{rows, out}, 2);
  for (auto _ : state) benchmark::DoNotOptimize(matmul(x, g, true, false).value().data<float>());
  state.counters["GFLOP/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * 2.0 * rows * in * out / 1e9,
                         benchmark::Counter::kIsRate);
}
BENCHMARK(BM_WeightGradientW2)
    ->ComputeStatistics("min", Min)
    ->ArgsProduct({{64}, {64, 128, 192}, {1, 2}})
    ->Args({128, 64, 1})
    ->Args({128, 64, 2})
    ->ArgNames({"in", "out", "threads"})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// Attention-shaped batched products: scores Q K^T then P V for [B*H, T, 16].
// Args: T, threads.
void BM_BatchedAttentionMatmuls(benchmark::State& state) {
  const int64_t t = state.range(0), bh = WorkloadBatch(t) * 4, dh = 16;
  SetThreads(state, 1);
  NoGrad no_grad;
  Var q = RandomVar(Shape{bh, t, dh}, 1), k = RandomVar(Shape{bh, t, dh}, 2),
      v = RandomVar(Shape{bh, t, dh}, 3);
  for (auto _ : state) {
    Var scores = matmul(q, k, false, true);
    benchmark::DoNotOptimize(matmul(scores, v).value().data<float>());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * 2.0 * 2.0 * bh * t * t * dh / 1e9,
      benchmark::Counter::kIsRate);
}
BENCHMARK(BM_BatchedAttentionMatmuls)
    ->ComputeStatistics("min", Min)
    ->ArgsProduct({{32, 256}, {1, 2}})
    ->ArgNames({"T", "threads"})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// The self-attention of W1 (batch 32, T = 32) or W2 (batch 8, T = 256):
// multi_head_self_attention on a packed [batch, T, 192] q|k|v (4 heads of
// 16), forward then the gradient of the packed input, as in one explicit
// training step (the backward recomputes the probabilities). Args: T,
// threads.
void BM_SelfAttentionForwardBackward(benchmark::State& state) {
  const int64_t t = state.range(0), batch = WorkloadBatch(t), heads = 4, dh = 16, d = heads * dh;
  SetThreads(state, 1);
  Var qkv = RandomVar(Shape{batch, t, 3 * d}, 1, true);
  Var g = RandomVar(Shape{batch, t, d}, 2);
  for (auto _ : state) {
    Var out = multi_head_self_attention(qkv, heads, 0.25, false);
    VarList dqkv = grad({out}, {qkv}, {g});
    benchmark::DoNotOptimize(dqkv[0].value().data<float>());
  }
  // Q K^T and P V forward; Q K^T again, dO V^T, dS K, dS^T Q and P^T dO backward.
  state.counters["GFLOP/s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * 7.0 * 2.0 * batch * heads * t * t * dh / 1e9,
      benchmark::Counter::kIsRate);
}
BENCHMARK(BM_SelfAttentionForwardBackward)
    ->ComputeStatistics("min", Min)
    ->ArgsProduct({{32, 256}, {1, 2}})
    ->ArgNames({"T", "threads"})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// softmax forward + backward over [rows, 32]. Args: threads.
void BM_SoftmaxForwardBackward(benchmark::State& state) {
  SetThreads(state, 0);
  Var x = RandomVar(Shape{32 * 4 * 32, 32}, 1, true);
  Var g = RandomVar(Shape{32 * 4 * 32, 32}, 2);
  for (auto _ : state) {
    Var y = softmax(x);
    VarList dx = grad({y}, {x}, {g});
    benchmark::DoNotOptimize(dx[0].value().data<float>());
  }
  state.SetItemsProcessed(state.iterations() * x.numel());
}
BENCHMARK(BM_SoftmaxForwardBackward)
    ->ComputeStatistics("min", Min)
    ->Arg(1)
    ->Arg(2)
    ->ArgName("threads")
    ->UseRealTime();

// The shifted exponentials of softmax rows (one thread, no graph): 96 rows
// of 256 scores, a W2 attention backward block, through VecExpShifted (base
// e, kernel 0) or VecExp2Shifted (base 2, kernel 1, what the fused attention
// and Hopfield retrieval use). items_per_second counts exponentials.
void BM_RowExponentials(benchmark::State& state) {
  const bool base2 = state.range(0) == 1;
  constexpr int64_t kRows = 96, kCols = 256;
  const Var scores = RandomVar(Shape{kRows, kCols}, 1);
  const float* x = scores.value().data<float>();
  std::vector<float> out(kRows * kCols);
  for (auto _ : state) {
    float total = 0.0f;
    for (int64_t r = 0; r < kRows; ++r) {
      const float* row = x + r * kCols;
      total += base2 ? internal::VecExp2Shifted(row, 3.0f, out.data() + r * kCols, kCols)
                     : internal::VecExpShifted(row, 3.0f, out.data() + r * kCols, kCols);
    }
    benchmark::DoNotOptimize(total);
  }
  state.SetItemsProcessed(state.iterations() * kRows * kCols);
}
BENCHMARK(BM_RowExponentials)->ComputeStatistics("min", Min)->Arg(0)->Arg(1)->ArgName("kernel");

// layer_norm forward + backward over [1024, 64] with gain and bias. Args: threads.
void BM_LayerNormForwardBackward(benchmark::State& state) {
  SetThreads(state, 0);
  Var x = RandomVar(Shape{1024, 64}, 1, true);
  Var gain = RandomVar(Shape{64}, 2, true), bias = RandomVar(Shape{64}, 3, true);
  Var g = RandomVar(Shape{1024, 64}, 4);
  for (auto _ : state) {
    Var y = layer_norm(x, gain, bias, 1e-5);
    VarList d = grad({y}, {x, gain, bias}, {g});
    benchmark::DoNotOptimize(d[0].value().data<float>());
  }
  state.SetItemsProcessed(state.iterations() * x.numel());
}
BENCHMARK(BM_LayerNormForwardBackward)
    ->ComputeStatistics("min", Min)
    ->Arg(1)
    ->Arg(2)
    ->ArgName("threads")
    ->UseRealTime();

// The feed-forward sublayer of one W1 data-parallel shard, forward +
// backward to every input: x [16*32, 64], hidden 128, one thread. Args:
// fused (1: feed_forward, whose backward multiplies by gelu' in the
// product's tiles; 0: linear_gelu then linear).
void BM_FeedForwardW1Shard(benchmark::State& state) {
  SetNumThreads(1);
  const bool fused = state.range(0) == 1;
  Var x = RandomVar(Shape{512, 64}, 1, true);
  Var w1 = RandomVar(Shape{64, 128}, 2, true), b1 = RandomVar(Shape{128}, 3, true);
  Var w2 = RandomVar(Shape{128, 64}, 4, true), b2 = RandomVar(Shape{64}, 5, true);
  Var g = RandomVar(Shape{512, 64}, 6);
  for (auto _ : state) {
    Var y = fused ? feed_forward(x, w1, b1, w2, b2) : linear(linear_gelu(x, w1, b1), w2, b2);
    VarList d = grad({y}, {x, w1, b1, w2, b2}, {g});
    benchmark::DoNotOptimize(d[0].value().data<float>());
  }
}
BENCHMARK(BM_FeedForwardW1Shard)
    ->ComputeStatistics("min", Min)
    ->Arg(0)
    ->Arg(1)
    ->ArgName("fused")
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// Graph overhead: a chain of `length` tiny ops recorded and differentiated;
// reports the cost per op (forward record + backward).
void BM_GraphOverheadChain(benchmark::State& state) {
  const int64_t length = state.range(0);
  SetNumThreads(1);
  Var x = RandomVar(Shape{4}, 1, true);
  for (auto _ : state) {
    Var y = x;
    for (int64_t i = 0; i < length; ++i) y = mul_scalar(add_scalar(y, 0.5), 0.5);
    backward(sum(y));
    x.zero_grad();
  }
  // Seconds per recorded op (forward record + its share of backward).
  state.counters["sec_per_op"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * 2.0 * length,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_GraphOverheadChain)
    ->ComputeStatistics("min", Min)
    ->Arg(1000)
    ->ArgName("length")
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace stillpoint

BENCHMARK_MAIN();
