// `stillpoint bench scale`: the grid, one point's measurement, and the runs
// of the points in child processes (see bench_scale.h).
#include "training/cli/bench_scale.h"

#include <CLI/CLI.hpp>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <sstream>

#include "framework/autograd.h"
#include "framework/buffer_pool.h"
#include "framework/parallel.h"
#include "training/cli/bench_command.h"
#include "training/cli/child_process.h"
#include "training/cli/exit_codes.h"
#include "training/config/config.h"
#include "training/svg_plot.h"

namespace stillpoint {
namespace {

// Bounds that keep a mistyped grid from running for ever.
constexpr int64_t kMaxLength = 1 << 16;
constexpr int64_t kMaxDepth = 1024;
constexpr int64_t kMaxRepeats = 10000;
constexpr double kMiB = 1 << 20;

std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> items;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    items.push_back(item);
  }
  return items;
}

bool IsNone(const std::string& text) { return text.empty() || text == "none"; }

// A comma-separated list of integers in [low, high], in the order given,
// without repeats; "none" or "" is the empty list.
std::vector<int64_t> ParseIntList(const std::string& text, const std::string& flag, int64_t low,
                                  int64_t high) {
  std::vector<int64_t> values;
  if (IsNone(text)) return values;
  for (const std::string& item : SplitList(text)) {
    size_t used = 0;
    int64_t value = 0;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    SP_CHECK(!item.empty() && used == item.size(), flag, ": '", item,
             "' is not an integer (expected a comma-separated list such as 32,64,128, or none)");
    SP_CHECK(value >= low && value <= high, flag, ": ", value, " is out of range [", low, ", ",
             high, "]");
    SP_CHECK(std::find(values.begin(), values.end(), value) == values.end(), flag, ": ", value,
             " is given twice");
    values.push_back(value);
  }
  return values;
}

// A comma-separated list of names, each one of known.
std::vector<std::string> ParseNameList(const std::string& text, const std::string& flag,
                                       const std::vector<std::string>& known) {
  std::vector<std::string> names;
  for (const std::string& item : SplitList(text)) {
    if (std::find(known.begin(), known.end(), item) == known.end()) {
      std::string list;
      for (const std::string& n : known) list += (list.empty() ? "" : ", ") + n;
      const std::string closest = ClosestName(item, known);
      SP_CHECK(false, flag, ": unknown '", item, "' (known: ", list, ")",
               closest.empty() ? "" : "; did you mean '" + closest + "'?");
    }
    SP_CHECK(std::find(names.begin(), names.end(), item) == names.end(), flag, ": '", item,
             "' is given twice");
    names.push_back(item);
  }
  SP_CHECK(!names.empty(), flag, ": the list is empty");
  return names;
}

using Clock = std::chrono::steady_clock;

// The resident set now (VmRSS), in bytes; 0 where it cannot be read.
int64_t ResidentBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return 0;
}

double Quartile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  const double position = q * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(position));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (position - lo) * (values[hi] - values[lo]);
}

// One point, measured in this process.
ScaleRow MeasurePoint(const ScalePoint& point, const BenchArgs& args, DType dtype) {
  ScaleRow row;
  row.point = point;
  TransformerShapes shapes = W1Shapes();
  shapes.length = point.length;
  shapes.batch = point.batch;
  ModelKind kind = ModelKind::kImplicit;
  StringToModelKind(point.model, &kind);
  if (kind == ModelKind::kExplicit) shapes.num_layers = point.depth;
  const int iterations =
      static_cast<int>(kind == ModelKind::kImplicit ? point.depth : kScaleImplicitDepth);
  ModelOptions options = BenchModelOptions(shapes, kind, iterations, dtype, args.seed);
  SetBenchAttention(&options, point.attention, /*warm_start=*/true);
  // The previous point's cached buffers go back to the system, so this
  // point's pool and resident figures start from what it holds itself.
  ReleaseCachedBuffers();
  row.rss_base_mb = static_cast<double>(ResidentBytes()) / kMiB;
  const TokenBatch batch = ReversalBatch(shapes, args.seed);
  TransformerBench bench(options, batch);
  ResetBufferPoolStats();
  std::vector<double> wall, cpu;
  for (int64_t step = 0; step < args.warmup + args.scale.repeats; ++step) {
    const double cpu_start = ProcessCpuSeconds();
    const Clock::time_point start = Clock::now();
    const double loss = bench.Step();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (step == 0) row.loss_first = loss;
    row.loss_last = loss;
    if (step >= args.warmup) {
      wall.push_back(seconds * 1e3);
      cpu.push_back((ProcessCpuSeconds() - cpu_start) * 1e3);
    }
  }
  row.median_ms = Quartile(wall, 0.5);
  row.p25_ms = Quartile(wall, 0.25);
  row.p75_ms = Quartile(wall, 0.75);
  row.cpu_median_ms = Quartile(cpu, 0.5);
  row.pool_peak_mb = static_cast<double>(GetBufferPoolStats().peak_bytes_in_use) / kMiB;
  row.rss_peak_mb = static_cast<double>(PeakResidentBytes()) / kMiB;
  {
    // The forward pass alone with no tape (every solver iteration then
    // records nothing: inference), after the steps, so the resident peak
    // above is the step's.
    NoGrad no_tape;
    ReleaseCachedBuffers();
    ResetBufferPoolStats();
    bench.model().Forward(batch.ids, batch.shape);
    row.forward_pool_peak_mb = static_cast<double>(GetBufferPoolStats().peak_bytes_in_use) / kMiB;
  }
  return row;
}

// The arguments of a child `bench scale --in-process` that measures point
// alone, with the parent's settings.
std::vector<std::string> ChildArguments(const ScalePoint& point, const BenchArgs& args) {
  const bool length_axis = point.axis == "length";
  return {"/proc/self/exe", "bench", "scale", "--in-process", "--json",
          "--models", point.model, "--attention", point.attention,
          "--lengths", length_axis ? std::to_string(point.length) : "none",
          "--depths", length_axis ? "none" : std::to_string(point.depth),
          "--depth-length", std::to_string(point.length),
          "--tokens", std::to_string(args.scale.tokens),
          "--repeats", std::to_string(args.scale.repeats),
          "--warmup", std::to_string(args.warmup),
          "--threads", std::to_string(args.threads),
          "--dtype", args.dtype, "--seed", std::to_string(args.seed)};
}

// The PyTorch peer of a softmax point (bench/torch_peer.py scale).
void RunPeer(const BenchArgs& args, ScaleRow* row) {
  const ScalePoint& p = row->point;
  std::vector<std::string> env;
  std::istringstream entries(args.scale.peer_env);
  for (std::string entry; entries >> entry;) env.push_back(entry);
  const ChildResult child = RunChild(
      {args.scale.python, args.scale.peer, "scale", "--json", "--model", p.model,
       "--length", std::to_string(p.length), "--batch", std::to_string(p.batch),
       "--depth", std::to_string(p.depth), "--steps", std::to_string(args.scale.repeats),
       "--warmup", std::to_string(args.warmup), "--threads", std::to_string(args.threads),
       "--dtype", args.dtype, "--seed", std::to_string(args.seed)},
      env);
  if (child.exit_code != 0) {
    row->peer_error = child.Failure();
    return;
  }
  try {
    const YAML::Node result = YAML::Load(child.out.substr(child.out.find('{')));
    row->peer_median_ms = result["median_ms"].as<double>();
    row->peer_rss_peak_mb = result["peak_rss_mb"].as<double>();
    row->peer_rss_base_mb = result["base_rss_mb"].as<double>();
  } catch (const std::exception& e) {
    row->peer_error = std::string("unreadable peer output: ") + e.what();
  }
}

ScaleRow RunPointInChild(const ScalePoint& point, const BenchArgs& args) {
  ScaleRow row;
  row.point = point;
  const ChildResult child = RunChild(ChildArguments(point, args));
  if (child.exit_code != 0) {
    row.error = child.Failure();
    return row;
  }
  try {
    const std::vector<ScaleRow> rows = ParseScaleJson(child.out, "the point's child process");
    SP_CHECK(rows.size() == 1, "the point's child process reported ", rows.size(),
             " rows, expected 1");
    row = rows.front();
    row.point.axis = point.axis;
  } catch (const std::exception& e) {
    row.error = e.what();
  }
  return row;
}

std::string PointLabel(const ScalePoint& p) {
  std::ostringstream label;
  label << p.axis << " sweep: " << p.model << " " << p.attention << " T=" << p.length
        << " B=" << p.batch << " depth " << p.depth;
  return label.str();
}

}  // namespace

void AddBenchScaleOptions(CLI::App& bench, BenchScaleArgs& args) {
  bench.add_option("--lengths", args.lengths,
                   "scale: sequence lengths of the length sweep (comma-separated; none: skip)")
      ->capture_default_str();
  bench.add_option("--depths", args.depths,
                   "scale: depths of the depth sweep (explicit cells, implicit iterations; "
                   "none: skip)")
      ->capture_default_str();
  bench.add_option("--models", args.models, "scale: implicit, explicit or both")
      ->capture_default_str();
  bench.add_option("--tokens", args.tokens, "scale: tokens per step (batch = tokens / length)")
      ->capture_default_str();
  bench.add_option("--depth-length", args.depth_length, "scale: sequence length of the depth sweep")
      ->capture_default_str();
  bench.add_option("--repeats", args.repeats, "scale: timed steps per point")
      ->capture_default_str();
  bench.add_option("--out", args.out_dir,
                   "scale: also write scale.json, scale.csv and the plots scale_length.svg, "
                   "scale_depth.svg into this directory");
  bench.add_option("--peer", args.peer,
                   "scale: bench/torch_peer.py, run beside every softmax point");
  bench.add_option("--python", args.python, "scale: the Python of the peer")
      ->capture_default_str();
  bench.add_option("--peer-env", args.peer_env,
                   "scale: NAME=VALUE entries (space-separated) for the peer's processes only");
  bench.add_flag("--in-process", args.in_process,
                 "scale: measure every point in this process (default: a child process each)");
}

int64_t ScaleBatch(int64_t tokens, int64_t length, const std::string& flag) {
  SP_CHECK(length >= 1 && tokens % length == 0, flag, ": length ", length,
           " does not divide the tokens per step (--tokens ", tokens,
           "), so the batch cannot keep them fixed");
  return tokens / length;
}

ScaleGrid ParseScaleGrid(const BenchArgs& args) {
  const BenchScaleArgs& s = args.scale;
  ScaleGrid grid;
  SP_CHECK(s.tokens >= 1 && s.tokens <= (int64_t{1} << 24), "--tokens must be in [1, ",
           int64_t{1} << 24, "], got ", s.tokens);
  grid.tokens = s.tokens;
  grid.lengths = ParseIntList(s.lengths, "--lengths", 1, kMaxLength);
  for (const int64_t length : grid.lengths) ScaleBatch(s.tokens, length, "--lengths");
  grid.depths = ParseIntList(s.depths, "--depths", 1, kMaxDepth);
  SP_CHECK(!grid.lengths.empty() || !grid.depths.empty(),
           "--lengths and --depths are both none: nothing to measure");
  SP_CHECK(s.depth_length >= 1 && s.depth_length <= kMaxLength, "--depth-length must be in [1, ",
           kMaxLength, "], got ", s.depth_length);
  grid.depth_length = s.depth_length;
  if (!grid.depths.empty()) ScaleBatch(s.tokens, s.depth_length, "--depth-length");
  grid.models = ParseNameList(s.models, "--models", {"implicit", "explicit"});
  grid.attentions = ParseNameList(args.attention.empty() ? kScaleDefaultAttentions : args.attention,
                                  "--attention", BenchAttentionNames());
  return grid;
}

std::vector<ScalePoint> ScalePoints(const ScaleGrid& grid) {
  std::vector<ScalePoint> points;
  for (const std::string& attention : grid.attentions) {
    for (const std::string& model : grid.models) {
      for (const int64_t length : grid.lengths) {
        const int64_t depth = model == "explicit" ? kScaleExplicitDepth : kScaleImplicitDepth;
        points.push_back({"length", model, attention, length, grid.tokens / length, depth});
      }
    }
  }
  for (const std::string& attention : grid.attentions) {
    for (const std::string& model : grid.models) {
      for (const int64_t depth : grid.depths) {
        points.push_back({"depth", model, attention, grid.depth_length,
                          grid.tokens / grid.depth_length, depth});
      }
    }
  }
  return points;
}

int RunBenchScale(const BenchArgs& args, std::ostream& out, std::ostream& err) {
  const BenchScaleArgs& s = args.scale;
  ScaleGrid grid;
  DType dtype = DType::kFloat32;
  try {
    grid = ParseScaleGrid(args);
    SP_CHECK(s.repeats >= 1 && s.repeats <= kMaxRepeats, "--repeats must be in [1, ", kMaxRepeats,
             "], got ", s.repeats);
    SP_CHECK(args.warmup >= 0 && args.warmup <= kMaxRepeats, "--warmup must be in [0, ",
             kMaxRepeats, "], got ", args.warmup);
    SP_CHECK(args.threads >= 1 && args.threads <= kMaxThreads, "--threads must be in [1, ",
             kMaxThreads, "], got ", args.threads);
    SP_CHECK(StringToDType(args.dtype, &dtype), "--dtype: '", args.dtype,
             "' is not float32 or float64");
    // The options of the single workloads have no meaning here.
    const BenchArgs defaults;
    SP_CHECK(args.steps == defaults.steps, "--steps does not apply to bench scale (its timed "
             "steps per point are --repeats)");
    SP_CHECK(args.model.empty(), "--model does not apply to bench scale (use --models)");
    SP_CHECK(args.iterations == 0, "--iters does not apply to bench scale (the implicit model's "
             "iterations are its depth: --depths)");
    SP_CHECK(args.shards == 1 && !args.scaling && args.weights_path.empty() &&
                 !args.no_warm_start,
             "--shards, --scaling, --weights and --no-warm-start do not apply to bench scale");
    SP_CHECK(s.peer.empty() || std::filesystem::is_regular_file(s.peer), "--peer: no file '",
             s.peer, "'");
    SP_CHECK(s.peer.empty() || std::filesystem::is_regular_file(s.python), "--python: no file '",
             s.python, "'");
    std::istringstream entries(s.peer_env);
    for (std::string entry; entries >> entry;) {
      SP_CHECK(entry.find('=') != std::string::npos && entry.front() != '=', "--peer-env: '",
               entry, "' is not NAME=VALUE");
    }
  } catch (const std::exception& e) {
    err << "error: " << e.what() << "\n";
    return kBadInput;
  }
  SetNumThreads(args.threads);
  std::vector<ScaleRow> rows;
  for (const ScalePoint& point : ScalePoints(grid)) {
    if (!s.in_process) err << "bench scale: " << PointLabel(point) << "\n";
    ScaleRow row;
    try {
      if (s.in_process) {
        row = MeasurePoint(point, args, dtype);
        row.rss_isolated = rows.empty();
      } else {
        row = RunPointInChild(point, args);
      }
      if (!s.peer.empty() && point.attention == "softmax") RunPeer(args, &row);
    } catch (const std::exception& e) {
      row.point = point;
      row.error = e.what();
    }
    rows.push_back(row);
  }
  ScaleReportHeader header;
  header.tokens = grid.tokens;
  header.repeats = s.repeats;
  header.warmup = args.warmup;
  header.threads = args.threads;
  header.dtype = args.dtype;
  header.isolated = !s.in_process;
  const std::string json = ScaleJson(header, rows);
  if (args.json) {
    out << json;
  } else {
    PrintScaleTable(rows, out);
  }
  try {
    if (!s.out_dir.empty()) {
      std::filesystem::create_directories(s.out_dir);
      WriteTextFile(s.out_dir + "/scale.json", json);
      WriteTextFile(s.out_dir + "/scale.csv", ScaleCsv(rows));
      WriteTextFile(s.out_dir + "/scale_length.svg", ScaleLengthSvg(rows));
      WriteTextFile(s.out_dir + "/scale_depth.svg", ScaleDepthSvg(rows));
    }
  } catch (const std::exception& e) {
    err << "error: " << e.what() << "\n";
    return kRuntimeFailure;
  }
  const bool any = std::any_of(rows.begin(), rows.end(),
                               [](const ScaleRow& r) { return r.error.empty(); });
  for (const ScaleRow& r : rows) {
    if (!r.error.empty()) err << "bench scale: " << PointLabel(r.point) << " failed: " << r.error << "\n";
  }
  return any ? kOk : kRuntimeFailure;
}

}  // namespace stillpoint
