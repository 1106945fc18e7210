// `stillpoint bench`: the reference workloads of bench/SPEC.md, timed.
//
//   stillpoint bench w1|w2|w3|w4|allreduce|scale [--model implicit|explicit] [--iters K]
//                   [--attention NAME] [--no-warm-start]
//                   [--threads N] [--shards S] [--steps 20] [--warmup 3]
//                   [--json] [--weights FILE] [--dtype float32|float64]
//
// W1, W2: DEQ-transformer training steps (forward, loss, zero grad,
//   backward, AdamW) of a SequenceModel built from ModelOptions with cell
//   "deq_transformer", so the product code path is what is measured:
//   - implicit: Anderson (m 5, lambda 1e-4, beta 1, safeguard off) for
//     exactly K iterations (tolerance 0, no early stop; the map is also
//     evaluated at z0, so K + 1 cell evaluations, of which the last, at z*,
//     is recorded: docs/solvers.md), and the IFT backward with the plain
//     fixed-point adjoint iteration w <- g + J^T w for exactly K iterations
//     from w0 = g.
//   - explicit: 6 untied cells, ordinary backprop.
//   --attention NAME (W1, W2): the cell's attention sublayer, softmax (the
//   default: the workload as specified) or a registered energy attention
//   (layers/energy_block_list.h, or a user's) with
//   its block's default options (model.attention = NAME), read at the fixed
//   point of its energy by a nested inner solve: Picard (for probabilistic:
//   EM) for at most 16 iterations to a relative residual of 1e-4, the
//   adjoint by fixed-point iteration for at most 16 iterations to 1e-5. The
//   inner solve is warm-started across the outer solver's tape-off
//   iterations (EnergyAttentionOptions::warm_start) unless --no-warm-start.
//   The report then adds the inner solves per step and their forward
//   iterations (means over the timed steps) and the FLOP count is left out
//   (it depends on the iterations the inner solves take).
//   --shards S (default 1) cuts the batch into S shards of whole sequences
//   that run forward and backward side by side on replicas of the model
//   (training/data_parallel.h): the threads then meet once per step instead
//   of at every op. S changes the step's rounding, not its arithmetic.
// W4: the energy-attention step of bench/SPEC.md: W1's data and shapes, a
//   probabilistic-attention block (ModelKind::kEnergy, constant precisions
//   alpha = 1/sqrt(dh), beta = 1/dh, biased projections) solved by exactly
//   K = 16 plain EM iterations after v0 (Picard, tolerance 0), the IFT
//   backward with exactly K fixed-point adjoint iterations, then the
//   pre-norm feed-forward sublayer and the head.
// scale: a W1-shaped step against sequence length and depth
//   (training/cli/bench_scale.h).
// W3: Hopfield retrieval of 1024 corrupted patterns (forward only, Picard to
//   a relative residual of 1e-6, at most K = 32 iterations, per-query exit).
//
// The run makes `warmup` untimed steps and `steps` timed ones and reports
// the median, min, max and interquartile range of the step time, the median
// process CPU time of a step (all threads; with one thread a load-robust
// companion of the wall time on a shared machine), the peak
// resident memory of the process (VmHWM), the analytic FLOPs of a step and
// the rate they imply; W3 also reports accuracy and iterations. --json
// prints the same as one JSON object on one line.
//
// --weights FILE loads a model description in the layout of
// tests/data/deq_tiny.json (written by bench/torch_peer.py --export): the
// shapes from "config", the batch from "x" and "y", and the parameters from
// "implicit.params" or "explicit.params" (W as [in, out]); the run then also
// reports the loss of the first step and the loss after one optimizer step,
// to compare with another implementation started from the same weights.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "framework/module.h"
#include "framework/tensor.h"
#include "layers/models.h"
#include "training/cli/bench_ranks.h"
#include "training/cli/bench_scale.h"
#include "training/data_parallel.h"
#include "training/optimizer.h"

namespace stillpoint {

struct BenchArgs {
  std::string workload;   // "w1", "w2", "w3", "w4", "allreduce" or "scale"
  std::string model;      // "implicit" or "explicit" (W1, W2); empty: implicit
  // W1, W2: the cell's attention (see the top); empty: softmax.
  std::string attention;
  // With an energy attention: no warm start of its inner solve.
  bool no_warm_start = false;
  int64_t iterations = 0;  // 0: the workload's (16 for W1/W2, 32 for W3)
  int threads = 2;
  int64_t shards = 1;  // W1, W2: data-parallel shards of the batch
  int64_t steps = 20;
  int64_t warmup = 3;
  // W1, W2: every step (warm-up included) becomes a round of two steps, one
  // on 1 thread and one on `threads`, the order alternating by round; also
  // reports the 1-thread steps and the per-round ratios 1-thread time /
  // `threads` time. Both steps of a round run on the machine in the same
  // state, which adjacent processes do not on a shared machine.
  bool scaling = false;
  bool json = false;
  std::string weights_path;  // empty: SPEC shapes with a seeded initialisation
  std::string dtype = "float32";
  uint64_t seed = 0;
  // Under mpirun (W1, W2; training/cli/bench_ranks.h): reduce the gradients
  // after the whole backward pass instead of bucket by bucket during it, and
  // the bucket size.
  bool no_overlap = false;
  int64_t bucket_kb = 1024;
  // `bench scale` (bench_scale.h).
  BenchScaleArgs scale;
};
// Returns 0 on success, 1 on a runtime failure, 2 on bad arguments (reported
// before any work starts).
int RunBench(const BenchArgs& args, std::ostream& out, std::ostream& err);

// ---- the pieces RunBench is made of (also used by tests) ----

// Shapes of a DEQ-transformer workload.
struct TransformerShapes {
  int64_t vocab_size = 16;  // V
  int64_t batch = 32;       // B
  int64_t length = 32;      // T
  int64_t dim = 64;         // d
  int64_t heads = 4;
  int64_t hidden = 128;  // feed-forward width
  int64_t num_layers = 6;  // explicit model
};
// bench/SPEC.md W1 (B 32, T 32; also W4's) and W2 (B 8, T 256).
TransformerShapes W1Shapes();
TransformerShapes W2Shapes();

// A fixed batch of token ids [B, T] and one target per token.
struct TokenBatch {
  std::vector<int64_t> ids;      // B * T, row-major
  std::vector<int64_t> targets;  // B * T
  Shape shape;                   // [B, T]
};
// Ids uniform in [0, V); the target of position t is the id at T - 1 - t.
TokenBatch ReversalBatch(const TransformerShapes& shapes, uint64_t seed);

// The model of the workload: cell "deq_transformer"; for kImplicit the
// solver settings described at the top with `iterations` forward and adjoint
// iterations; kEnergy is W4 (its block and plain EM, the same adjoint).
ModelOptions BenchModelOptions(const TransformerShapes& shapes, ModelKind kind, int iterations,
                               DType dtype, uint64_t seed);
// With --attention NAME (see the top): the cell's attention NAME and its
// inner solve (warm-started when warm_start). "softmax" leaves options as
// they are.
void SetBenchAttention(ModelOptions* options, const std::string& attention, bool warm_start);
// The names --attention accepts: softmax and the registered energy blocks.
std::vector<std::string> BenchAttentionNames();
// AdamW, lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.01.
OptimizerOptions BenchOptimizerOptions();

// A model description loaded by --weights (see the top).
struct WeightsExport {
  TransformerShapes shapes;
  TokenBatch batch;
  NamedTensors parameters;  // float64
};
// Throws stillpoint::Error naming the file and the missing or malformed entry.
WeightsExport LoadWeightsExport(const std::string& path, ModelKind kind);

// A model, its optimizer and a fixed batch: Step() is one timed unit.
class TransformerBench {
 public:
  // Builds the model from options and, when initial is non-empty, loads
  // those parameters (strict: every name must match). Each step runs the
  // batch as `shards` data-parallel shards (DataParallel; one shard is a
  // plain step on the model).
  TransformerBench(const ModelOptions& options,
                   TokenBatch batch,
                   const NamedTensors& initial = {},
                   int64_t shards = 1,
                   RankBench* ranks = nullptr);

  // One training step as `stillpoint train` runs it (TrainStep: forward,
  // mean cross-entropy, zero grad, backward, gradient norm, AdamW step; no
  // clipping). Returns the loss computed before the update, the batch's
  // under mpirun.
  double Step();

  SequenceModel& model() { return *model_; }
  const SequenceModel& model() const { return *model_; }

 private:
  std::shared_ptr<SequenceModel> model_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<TrainStep> step_;
  Batch batch_;
};

// Analytic FLOPs of one training step (multiply-adds count 2; only the
// products are counted: projections, attention products, head), with
// L  = 2 B T (4 d^2 + 2 d hidden)  (the six projections of one cell),
// A  = 4 B T^2 d                   (scores and weighted sums, all heads),
// F  = L + A                       (one cell evaluation),
// Vz = L + 2 A                     (VJP w.r.t. the state only),
// Vp = 2 L + 2 A                   (VJP w.r.t. state, injection and weights),
// H  = 6 B T d V                   (head forward and backward),
// M  = 4 B T d hidden              (the feed-forward part of L):
//   implicit, K iterations: K F + M + K Vz + Vp + H
//   explicit, L cells:      (num_layers - 1) (F + Vp) + 3 M + H
// At z = 0 a cell's attention is one row (MultiHeadAttention::ForwardAtZero),
// so only the feed-forward products are counted for the explicit model's
// first cell (forward, and input and weight gradients) and for the implicit
// solver's first evaluation, from z0 = 0. The implicit model's recorded
// evaluation at z* is the solver's last (docs/solvers.md), so K + 1
// evaluations in all. (That holds when z* is the last iterate: every W2
// step checked; W1, in float32, evaluates at z* once more in some steps,
// which the count leaves out.)
double TransformerStepFlops(const TransformerShapes& shapes, ModelKind kind, int iterations);

// CPU time of the whole process (all threads), in seconds. With one thread
// it is a load-robust companion of the wall time on a shared machine.
double ProcessCpuSeconds();

// The peak resident set size of this process (VmHWM of /proc/self/status),
// in bytes; 0 where it cannot be read.
int64_t PeakResidentBytes();

}  // namespace stillpoint
