// `stillpoint bench scale` (training/cli/bench_scale.h):
//   - the grid options are parsed, and bad ones refused with exit 2 and an
//     error naming the flag, before any work;
//   - every point keeps the tokens per step fixed (B T = --tokens);
//   - a tiny run's JSON has one row per point, in the grid's order, and its
//     memory has the structure the command exists to show: the explicit
//     model's tensor-pool peak grows with depth, the implicit model's (depth:
//     its iteration count) stays within 10%;
//   - the CSV and the plots hold every row and series.
#include "training/cli/bench_scale.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "framework/check.h"
#include "training/cli/bench_command.h"

namespace stillpoint::bench_scale_test {
namespace {

BenchArgs ScaleArgs() {
  BenchArgs args;
  args.workload = "scale";
  args.scale.in_process = true;
  args.json = true;
  args.threads = 1;
  args.warmup = 0;
  args.scale.repeats = 1;
  return args;
}

// Runs the command; returns its exit code, stdout in *out and stderr in *err.
int RunScale(const BenchArgs& args, std::string* out, std::string* err) {
  std::ostringstream o, e;
  const int code = RunBench(args, o, e);
  *out = o.str();
  *err = e.str();
  return code;
}

TEST(BenchScaleTest, ParsesTheGridOptions) {
  BenchArgs args = ScaleArgs();
  args.scale.lengths = "16, 32,64";
  args.scale.depths = "none";
  args.scale.models = "explicit";
  args.attention = "probabilistic,softmax";
  args.scale.tokens = 128;
  const ScaleGrid grid = ParseScaleGrid(args);
  EXPECT_EQ(grid.lengths, (std::vector<int64_t>{16, 32, 64}));
  EXPECT_TRUE(grid.depths.empty());
  EXPECT_EQ(grid.models, (std::vector<std::string>{"explicit"}));
  EXPECT_EQ(grid.attentions, (std::vector<std::string>{"probabilistic", "softmax"}));
  EXPECT_EQ(grid.tokens, 128);

  // The defaults: W1's tokens, lengths 32 to 1024, depths 2 to 24 by 2,
  // both models, softmax and probabilistic attention.
  const ScaleGrid defaults = ParseScaleGrid(ScaleArgs());
  EXPECT_EQ(defaults.lengths, (std::vector<int64_t>{32, 64, 128, 256, 512, 1024}));
  ASSERT_EQ(defaults.depths.size(), 12u);
  for (size_t i = 0; i < defaults.depths.size(); ++i) {
    EXPECT_EQ(defaults.depths[i], 2 * static_cast<int64_t>(i + 1));
  }
  EXPECT_EQ(defaults.models, (std::vector<std::string>{"implicit", "explicit"}));
  EXPECT_EQ(defaults.attentions, (std::vector<std::string>{"softmax", "probabilistic"}));
  EXPECT_EQ(defaults.tokens, 1024);
}

TEST(BenchScaleTest, BadGridArgumentsExitWithTwoNamingTheFlag) {
  struct Case {
    void (*set)(BenchArgs*);
    const char* flag;
  };
  const std::vector<Case> cases = {
      {[](BenchArgs* a) { a->scale.lengths = "32,abc"; }, "--lengths"},
      {[](BenchArgs* a) { a->scale.lengths = "32,0"; }, "--lengths"},
      {[](BenchArgs* a) { a->scale.lengths = "32,32"; }, "--lengths"},
      {[](BenchArgs* a) { a->scale.lengths = "48"; }, "--lengths"},  // does not divide 1024
      {[](BenchArgs* a) { a->scale.lengths = "32.5"; }, "--lengths"},
      {[](BenchArgs* a) { a->scale.depths = "2,-4"; }, "--depths"},
      {[](BenchArgs* a) { a->scale.depths = "2,,4"; }, "--depths"},
      {[](BenchArgs* a) { a->scale.models = "implicit,deep"; }, "--models"},
      {[](BenchArgs* a) { a->attention = "softmax,sofmax"; }, "--attention"},
      {[](BenchArgs* a) { a->scale.tokens = 0; }, "--tokens"},
      {[](BenchArgs* a) { a->scale.depth_length = 3; }, "--depth-length"},  // 1024 % 3 != 0
      {[](BenchArgs* a) { a->scale.repeats = 0; }, "--repeats"},
      {[](BenchArgs* a) { a->steps = 7; }, "--steps"},
      {[](BenchArgs* a) { a->model = "implicit"; }, "--model"},
      {[](BenchArgs* a) { a->scale.peer = "/no/such/torch_peer.py"; }, "--peer"},
      {[](BenchArgs* a) { a->scale.peer_env = "OMP_WAIT_POLICY"; }, "--peer-env"},
      {[](BenchArgs* a) {
         a->scale.lengths = "none";
         a->scale.depths = "none";
       },
       "--lengths and --depths"},
  };
  for (const Case& c : cases) {
    BenchArgs args = ScaleArgs();
    c.set(&args);
    std::string out, err;
    EXPECT_EQ(RunScale(args, &out, &err), 2) << c.flag;
    EXPECT_NE(err.find(c.flag), std::string::npos) << "error does not name " << c.flag << ": "
                                                   << err;
    EXPECT_TRUE(out.empty()) << c.flag << ": output before the check: " << out;
  }
}

TEST(BenchScaleTest, EveryPointKeepsTheTokensPerStepFixed) {
  for (const int64_t tokens : {1024, 4096}) {
    BenchArgs args = ScaleArgs();
    args.scale.tokens = tokens;
    const std::vector<ScalePoint> points = ScalePoints(ParseScaleGrid(args));
    // 6 lengths + 12 depths, for 2 models and 2 attentions.
    ASSERT_EQ(points.size(), (6u + 12u) * 2u * 2u);
    for (const ScalePoint& p : points) {
      EXPECT_EQ(p.batch * p.length, tokens) << p.axis << " " << p.length;
      if (p.axis == "length") {
        EXPECT_EQ(p.depth, p.model == "explicit" ? kScaleExplicitDepth : kScaleImplicitDepth);
      } else {
        EXPECT_EQ(p.length, 32);
      }
    }
  }
  EXPECT_EQ(ScaleBatch(1024, 1024, "--lengths"), 1);
  EXPECT_EQ(ScaleBatch(1024, 32, "--lengths"), 32);
  EXPECT_THROW(ScaleBatch(1024, 96, "--lengths"), Error);
}

TEST(BenchScaleTest, TinyRunHasOneRowPerPointAndMemoryFlatInImplicitDepth) {
  BenchArgs args = ScaleArgs();
  args.scale.tokens = 64;
  args.scale.lengths = "16,32";
  args.scale.depths = "2,4,8,16";
  args.scale.depth_length = 16;
  args.attention = "softmax";
  std::string out, err;
  ASSERT_EQ(RunScale(args, &out, &err), 0) << err;
  const std::vector<ScaleRow> rows = ParseScaleJson(out, "bench scale --json");
  const std::vector<ScalePoint> points = ScalePoints(ParseScaleGrid(args));
  ASSERT_EQ(rows.size(), points.size());
  ASSERT_EQ(rows.size(), (2u + 4u) * 2u);
  std::map<std::string, std::vector<double>> pool_by_depth;  // model -> pool peak per depth
  for (size_t i = 0; i < rows.size(); ++i) {
    const ScaleRow& r = rows[i];
    EXPECT_TRUE(r.error.empty()) << r.error;
    EXPECT_EQ(r.point.axis, points[i].axis);
    EXPECT_EQ(r.point.model, points[i].model);
    EXPECT_EQ(r.point.attention, "softmax");
    EXPECT_EQ(r.point.length, points[i].length);
    EXPECT_EQ(r.point.depth, points[i].depth);
    EXPECT_EQ(r.point.batch * r.point.length, 64);
    EXPECT_GT(r.median_ms, 0.0);
    EXPECT_LE(r.p25_ms, r.median_ms);
    EXPECT_GE(r.p75_ms, r.median_ms);
    EXPECT_GT(r.pool_peak_mb, 0.0);
    // The base is the current resident set (statm), the peak the kernel's
    // high-water mark (getrusage), which folds the threads' cached RSS counts
    // in lazily: it read 0.19 MiB below the base once under load.
    EXPECT_GE(r.rss_peak_mb, r.rss_base_mb - 1.0);
    EXPECT_EQ(r.rss_isolated, i == 0);  // in one process only the first peak is its own
    if (r.point.axis == "depth") pool_by_depth[r.point.model].push_back(r.pool_peak_mb);
  }
  const std::vector<double>& explicit_pool = pool_by_depth["explicit"];
  const std::vector<double>& implicit_pool = pool_by_depth["implicit"];
  ASSERT_EQ(explicit_pool.size(), 4u);
  ASSERT_EQ(implicit_pool.size(), 4u);
  for (size_t i = 1; i < explicit_pool.size(); ++i) {
    EXPECT_GT(explicit_pool[i], explicit_pool[i - 1]) << "explicit depth index " << i;
  }
  // Eight times the depth: the explicit model holds at least three times
  // the memory, the implicit one (iterations) the same to within 10%.
  EXPECT_GT(explicit_pool.back(), 3.0 * explicit_pool.front());
  for (const double pool : implicit_pool) {
    EXPECT_LE(pool, 1.1 * implicit_pool.front());
    EXPECT_GE(pool, implicit_pool.front() / 1.1);
  }

  // The CSV: a header and one line per row; the plots: every series.
  const std::string csv = ScaleCsv(rows);
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), static_cast<long>(rows.size() + 1));
  EXPECT_EQ(csv.rfind("axis,model,attention,length,batch,depth,median_ms", 0), 0u);
  for (const std::string& svg : {ScaleLengthSvg(rows), ScaleDepthSvg(rows)}) {
    EXPECT_NE(svg.find("implicit softmax"), std::string::npos);
    EXPECT_NE(svg.find("explicit softmax"), std::string::npos);
    EXPECT_EQ(svg.find("PyTorch"), std::string::npos);  // no peer ran
  }
}

TEST(BenchScaleTest, TextTableHasOneLinePerPoint) {
  BenchArgs args = ScaleArgs();
  args.json = false;
  args.scale.tokens = 32;
  args.scale.lengths = "8,16,32";
  args.scale.depths = "none";
  args.scale.models = "implicit";
  args.attention = "softmax";
  std::string out, err;
  ASSERT_EQ(RunScale(args, &out, &err), 0) << err;
  std::istringstream lines(out);
  std::vector<std::string> body;
  for (std::string line; std::getline(lines, line);) body.push_back(line);
  ASSERT_EQ(body.size(), 4u) << out;  // the header and three points
  for (size_t i = 1; i < body.size(); ++i) {
    EXPECT_EQ(body[i].rfind("length  implicit softmax", 0), 0u) << body[i];
  }
  EXPECT_NE(body[3].find(" 32     1     16"), std::string::npos) << body[3];
}

}  // namespace
}  // namespace stillpoint::bench_scale_test
