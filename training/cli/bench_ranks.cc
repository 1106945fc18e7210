#include "training/cli/bench_ranks.h"

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <ostream>

#include "framework/check.h"
#include "training/distributed.h"
#include "training/distributed_training.h"
#include "training/metrics.h"
#include "training/statistics.h"

namespace stillpoint {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

RankBench::RankBench(const GradientReducerOptions& options) : options_(options) {}
RankBench::~RankBench() = default;

bool RankBench::active() const { return WorldSize() > 1; }

void RankBench::Attach(TrainStep& step, int64_t shards, const VarList& parameters,
                       int64_t rows) {
  if (!active()) return;
  const int64_t total = shards * WorldSize();
  SP_CHECK(total <= rows, "bench: ", WorldSize(), " ranks x --shards ", shards, " = ", total,
           " shards, but the batch has only ", rows, " rows to share out");
  reducer_ = std::make_unique<GradientReducer>(parameters, shards, options_);
  step.EnableRanks(static_cast<int64_t>(WorldRank()) * shards, total, reducer_.get(),
                   [this](const std::string& failure, const std::vector<double>& shard_losses,
                          std::pair<int64_t, int64_t> correct_counted, const SolverStats& forward,
                          const SolverStats& backward) {
                     return ExchangeStepTotals(++steps_, failure, shard_losses, correct_counted,
                                               forward, backward);
                   });
}

void RankBench::Record() {
  if (!reducer_) return;
  const GradientReductionTimes& t = reducer_->last_times();
  communication_.push_back(t.communication_seconds);
  exposed_.push_back(t.exposed_seconds);
  overlap_.push_back(t.communication_seconds > 0
                         ? 1.0 - std::min(1.0, t.exposed_seconds / t.communication_seconds)
                         : 0.0);
}

void RankBench::PrintText(std::ostream& out) const {
  if (!reducer_) return;
  const GradientReductionTimes& t = reducer_->last_times();
  out << std::fixed << std::setprecision(3) << "  ranks " << WorldSize() << " (overlap "
      << (options_.overlap ? "on" : "off") << ", " << t.buckets << " buckets, "
      << static_cast<double>(t.bytes) / (1 << 20) << " MiB of gradients): allreduce median "
      << Median(communication_) * 1e3 << " ms per step, exposed after the backward pass "
      << Median(exposed_) * 1e3 << " ms, overlap " << std::setprecision(2)
      << 100.0 * Median(overlap_) << "%\n";
  out.unsetf(std::ios_base::floatfield);
}

void RankBench::PrintJsonFields(std::ostream& out) const {
  if (!reducer_) return;
  const GradientReductionTimes& t = reducer_->last_times();
  out << ", \"ranks\": " << WorldSize()
      << ", \"overlap\": " << (options_.overlap ? "true" : "false")
      << ", \"buckets\": " << t.buckets << ", \"gradient_bytes\": " << t.bytes
      << ", \"allreduce_median_ms\": " << JsonNumber(Median(communication_) * 1e3)
      << ", \"allreduce_exposed_median_ms\": " << JsonNumber(Median(exposed_) * 1e3)
      << ", \"overlap_fraction_median\": " << JsonNumber(Median(overlap_));
}

void RunReduceBench(int64_t steps, int64_t warmup, bool json, std::ostream& out) {
  const int ranks = WorldSize();
  const int rank = WorldRank();
  if (!json) {
    out << "stillpoint allreduce: " << ranks << " ranks; fixed-order sum of one float32 "
        << "gradient per rank (chain + broadcast, training/gradient_reducer.h) and a "
        << "ping-pong between ranks 0 and 1; medians over " << steps << " repetitions\n"
        << "| bytes | allreduce us | allreduce GB/s | one-way us | one-way GB/s |\n"
        << "|---|---|---|---|---|\n";
  }
  for (int64_t bytes = 8; bytes <= (int64_t{64} << 20); bytes *= 8) {
    const int64_t numel = std::max<int64_t>(2, bytes / 4);
    Var parameter(Tensor::Zeros(Shape{numel}, DType::kFloat32), true);
    const Tensor gradient = Tensor::Full(Shape{numel}, 1.0 + rank, DType::kFloat32);
    GradientReducerOptions options;
    options.bucket_bytes = int64_t{1} << 40;  // one bucket
    options.overlap = false;
    GradientReducer reducer({parameter}, 1, options);
    std::vector<double> reduce_seconds, one_way_seconds;
    std::vector<char> buffer(static_cast<std::size_t>(numel * 4));
    for (int64_t rep = 0; rep < warmup + steps; ++rep) {
      Barrier();
      const auto start = Clock::now();
      reducer.Begin();
      reducer.Ready(0, 0, gradient);
      reducer.Finish({parameter}, false);
      const double reduce = SecondsSince(start);
      double one_way = 0;
      if (ranks > 1) {
        Barrier();
        const auto ping = Clock::now();
        if (rank == 0) {
          SendBytes(buffer.data(), buffer.size(), 1, 7);
          ReceiveBytes(buffer.data(), buffer.size(), 1, 7);
        } else if (rank == 1) {
          ReceiveBytes(buffer.data(), buffer.size(), 0, 7);
          SendBytes(buffer.data(), buffer.size(), 0, 7);
        }
        one_way = SecondsSince(ping) / 2;
      }
      if (rep >= warmup) {
        reduce_seconds.push_back(reduce);
        one_way_seconds.push_back(one_way);
      }
    }
    // The sum every rank must hold: 1 + 2 + ... + ranks.
    const double expected = 0.5 * ranks * (ranks + 1);
    SP_CHECK(parameter.grad().value().ToVector().front() == expected,
             "allreduce bench: the sum is ", parameter.grad().value().ToVector().front(),
             ", expected ", expected);
    const double reduce = Median(reduce_seconds);
    const double one_way = Median(one_way_seconds);
    const double real_bytes = static_cast<double>(numel * 4);
    if (json) {
      out << "{\"ranks\": " << ranks << ", \"bytes\": " << numel * 4
          << ", \"allreduce_us\": " << JsonNumber(reduce * 1e6)
          << ", \"allreduce_gb_per_s\": " << JsonNumber(real_bytes / reduce / 1e9)
          << ", \"one_way_us\": " << JsonNumber(ranks > 1 ? one_way * 1e6 : 0.0)
          << ", \"one_way_gb_per_s\": "
          << (ranks > 1 ? JsonNumber(real_bytes / one_way / 1e9) : "null") << "}\n";
    } else {
      out << std::fixed << std::setprecision(1) << "| " << numel * 4 << " | " << reduce * 1e6
          << " | " << std::setprecision(3) << real_bytes / reduce / 1e9 << " | "
          << std::setprecision(1) << one_way * 1e6 << " | " << std::setprecision(3)
          << (ranks > 1 ? real_bytes / one_way / 1e9 : 0.0) << " |\n";
      out.unsetf(std::ios_base::floatfield);
    }
  }
}

}  // namespace stillpoint
