// `stillpoint bench scale`: how a W1-shaped training step (bench/SPEC.md)
// grows with the sequence length and with depth, for the implicit and the
// explicit model, with softmax and energy attentions.
//
//   stillpoint bench scale [--lengths 32,64,...,1024] [--depths 2,4,...,24]
//       [--models implicit,explicit] [--attention softmax,probabilistic]
//       [--tokens 1024] [--depth-length 32] [--repeats 5] [--warmup 1]
//       [--threads 2] [--dtype float32] [--seed 0] [--out DIR] [--json]
//       [--peer bench/torch_peer.py] [--python /usr/bin/python3]
//       [--peer-env "NAME=VALUE ..."] [--in-process]
//
// Two sweeps, each over every model and attention:
//   - length: T in --lengths with the batch B = tokens / T, so every step
//     sees the same number of tokens (W1's 1024); W1's depth (explicit: 6
//     cells; implicit: 16 forward and 16 adjoint iterations);
//   - depth: D in --depths at T = --depth-length (B = tokens / T); the
//     explicit model has D cells, the implicit one D forward and D adjoint
//     iterations (its "depth": the cell is evaluated D + 1 times, one of
//     them recorded).
// "none" (or an empty list) skips a sweep. Each point makes --warmup untimed
// and --repeats timed training steps (TrainStep, as `stillpoint bench w1`)
// and reports the median step time, its quartiles, the median CPU time, the
// peak of the tensor pool over the steps (framework/buffer_pool.h: parameters,
// optimizer state and every step's tensors, after the model is built) and the
// peak resident set (VmHWM) together with the resident set just before the
// model was built, so the growth is peak minus base; then the pool peak of one
// forward pass with no tape (inference: every iteration of the solve
// tape-off), beside the training step's.
//
// Isolation: by default every point runs in a child process (this program,
// `bench scale --in-process` restricted to the point), so its VmHWM is its
// own; --in-process runs every point in this process (the pool peak is still
// per point, reset before each; the resident peak is then the process's
// high-water mark so far, so only its first point's is the point's own).
// A point whose child fails (out of memory, a crash) is reported with its
// error and the sweep goes on.
//
// --peer FILE runs bench/torch_peer.py's `scale` mode (the same model in
// PyTorch, softmax attention only: there is no peer of the nested energy
// solves) beside every softmax point, in its own process, with --python and
// the extra environment --peer-env (given to the peer alone, e.g. the tuned
// settings of bench/SPEC.md "Comparing fairly").
//
// Output: a table on stdout (or, with --json, the JSON document instead);
// with --out DIR also DIR/scale.json, DIR/scale.csv, DIR/scale_length.svg
// (step time and peak memory against length) and DIR/scale_depth.svg (peak
// memory against depth).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <limits>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace stillpoint {

struct BenchArgs;

// The options of `bench scale` beyond those it shares with `bench`
// (--attention, read as a comma-separated list; --threads, --warmup,
// --dtype, --seed, --json).
struct BenchScaleArgs {
  std::string lengths = "32,64,128,256,512,1024";
  std::string depths = "2,4,6,8,10,12,14,16,18,20,22,24";
  std::string models = "implicit,explicit";
  int64_t tokens = 1024;       // B * T of every step (W1's 32 x 32)
  int64_t depth_length = 32;   // T of the depth sweep
  int64_t repeats = 5;         // timed steps per point
  std::string out_dir;         // empty: no files
  std::string peer;            // bench/torch_peer.py; empty: no peer
  std::string python = "/usr/bin/python3";
  std::string peer_env;        // "NAME=VALUE ..." for the peer's processes
  bool in_process = false;
};

// Adds the options above to the `bench` command; they land in args.
void AddBenchScaleOptions(CLI::App& bench, BenchScaleArgs& args);

// The attentions of `bench scale` when --attention is not given.
inline constexpr const char* kScaleDefaultAttentions = "softmax,probabilistic";
// W1's depths, the length sweep's: explicit cells and implicit iterations.
inline constexpr int64_t kScaleExplicitDepth = 6;
inline constexpr int64_t kScaleImplicitDepth = 16;

// One measured configuration.
struct ScalePoint {
  std::string axis;       // "length" or "depth"
  std::string model;      // "implicit" or "explicit"
  std::string attention;  // "softmax" or an energy attention
  int64_t length = 0;     // T
  int64_t batch = 0;      // B = tokens / T
  int64_t depth = 0;      // explicit: cells; implicit: forward (and adjoint) iterations
};

// The grid of a `bench scale` invocation, checked.
struct ScaleGrid {
  std::vector<int64_t> lengths;  // empty: no length sweep
  std::vector<int64_t> depths;   // empty: no depth sweep
  std::vector<std::string> models;
  std::vector<std::string> attentions;
  int64_t tokens = 1024;
  int64_t depth_length = 32;
};
// Parses and checks the grid options; throws stillpoint::Error naming the
// flag (--lengths, --depths, --models, --attention, --tokens,
// --depth-length) and the bad entry.
ScaleGrid ParseScaleGrid(const BenchArgs& args);
// The batch that keeps tokens per step fixed at length; throws naming
// `flag` unless length >= 1 divides tokens.
int64_t ScaleBatch(int64_t tokens, int64_t length, const std::string& flag);
// Every point of the grid: the length sweep (attention, model, length) then
// the depth sweep (attention, model, depth).
std::vector<ScalePoint> ScalePoints(const ScaleGrid& grid);

// What one point measured (times in ms, memory in MiB); NaN where not
// measured.
struct ScaleRow {
  static constexpr double kNone = std::numeric_limits<double>::quiet_NaN();
  ScalePoint point;
  std::string error;  // non-empty: the point failed; its figures are NaN
  double median_ms = kNone, p25_ms = kNone, p75_ms = kNone, cpu_median_ms = kNone;
  double pool_peak_mb = kNone, rss_peak_mb = kNone, rss_base_mb = kNone;
  // The pool's peak over one forward pass with no tape (every solver
  // iteration tape-off), parameters and optimizer state included.
  double forward_pool_peak_mb = kNone;
  bool rss_isolated = true;  // the resident peak is this point's own
  double loss_first = kNone, loss_last = kNone;
  // The PyTorch peer (softmax points with --peer); NaN when not run.
  std::string peer_error;
  double peer_median_ms = kNone, peer_rss_peak_mb = kNone, peer_rss_base_mb = kNone;
};

// Runs `bench scale` (args.workload == "scale"). Returns 0 on success (also
// when some points failed: they are reported), 2 on bad arguments (before
// any work), 1 when nothing could be measured or a file cannot be written.
int RunBenchScale(const BenchArgs& args, std::ostream& out, std::ostream& err);

// The report of the rows: the table, the JSON document, the CSV and the two
// plots (bench_scale_report.cc).
struct ScaleReportHeader {
  int64_t tokens = 0;
  int64_t repeats = 0;
  int64_t warmup = 0;
  int threads = 0;
  std::string dtype;
  bool isolated = true;  // a child process per point
};
void PrintScaleTable(const std::vector<ScaleRow>& rows, std::ostream& out);
std::string ScaleJson(const ScaleReportHeader& header, const std::vector<ScaleRow>& rows);
std::string ScaleCsv(const std::vector<ScaleRow>& rows);
// Step time (log-log) and peak memory against length, side by side.
std::string ScaleLengthSvg(const std::vector<ScaleRow>& rows);
// Peak memory against depth.
std::string ScaleDepthSvg(const std::vector<ScaleRow>& rows);
// Reads the rows of a ScaleJson document (a child's output); throws
// stillpoint::Error naming `where` on malformed text.
std::vector<ScaleRow> ParseScaleJson(const std::string& text, const std::string& where);

}  // namespace stillpoint
