#include "training/retrieve.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>

#include "framework/parallel.h"
#include "framework/random.h"
#include "tests/scratch_path.h"
#include "training/cli/cli_commands.h"

namespace stillpoint::retrieve_test {
namespace {

namespace fs = std::filesystem;

// W3 in miniature: patterns with entries +-1/sqrt(d), queries = patterns with
// a quarter of their entries zeroed.
void MakePatterns(int64_t n, int64_t d, Tensor* patterns, Tensor* queries) {
  Rng rng(4);
  *patterns = Tensor(Shape{n, d}, DType::kFloat64);
  for (int64_t i = 0; i < patterns->numel(); ++i) {
    patterns->set(i, (rng.UniformInt(2) ? 1.0 : -1.0) / std::sqrt(double(d)));
  }
  *queries = patterns->Clone();
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < d / 4; ++c) queries->set(r * d + rng.UniformInt(d), 0.0);
  }
}

TEST(RetrieveTest, LargeBetaRetrievesTheSourcePatternAtAStationaryPoint) {
  Tensor patterns, queries;
  MakePatterns(64, 32, &patterns, &queries);
  const double beta = 32.0;
  RetrievalResult r = RetrieveHopfield(patterns, queries, beta, RetrievalSolverOptions());
  EXPECT_EQ(r.summary.CountSamples(TerminationType::kConverged), 64);
  for (int64_t q = 0; q < 64; ++q) EXPECT_EQ(r.nearest[q], q);
  // A fixed point: xi = X softmax(beta X^T xi), checked directly.
  for (int64_t q = 0; q < 4; ++q) {
    std::vector<double> s(64), xi(32);
    for (int64_t c = 0; c < 32; ++c) xi[c] = r.fixed_points.at(q * 32 + c);
    double top = -1e300;
    for (int64_t j = 0; j < 64; ++j) {
      s[j] = 0;
      for (int64_t c = 0; c < 32; ++c) s[j] += beta * patterns.at(j * 32 + c) * xi[c];
      top = std::max(top, s[j]);
    }
    double z = 0;
    for (double& v : s) z += (v = std::exp(v - top));
    for (int64_t c = 0; c < 32; ++c) {
      double f = 0;
      for (int64_t j = 0; j < 64; ++j) f += s[j] / z * patterns.at(j * 32 + c);
      EXPECT_NEAR(f, xi[c], 1e-5) << "query " << q << " coordinate " << c;
    }
  }
}

TEST(RetrieveTest, EnergyIsLowerAtTheFixedPointThanAtTheQuery) {
  Tensor patterns, queries;
  MakePatterns(16, 16, &patterns, &queries);
  ForwardSolverOptions zero_steps = RetrievalSolverOptions();
  zero_steps.max_iterations = 0;
  RetrievalResult start = RetrieveHopfield(patterns, queries, 4.0, zero_steps);
  RetrievalResult end = RetrieveHopfield(patterns, queries, 4.0, RetrievalSolverOptions());
  for (int64_t q = 0; q < 16; ++q) EXPECT_LE(end.energy[q], start.energy[q] + 1e-12) << q;
}

// The float32 map works by blocks of 24 queries within tasks of 256: with
// 600 queries over 300 patterns (partial blocks and tasks) its fixed points
// match the float64 solve's, and do not depend on the thread count.
TEST(RetrieveTest, Float32SolveMatchesFloat64AndIgnoresThreadCount) {
  Tensor patterns, queries;
  MakePatterns(300, 40, &patterns, &queries);
  Tensor more_queries(Shape{600, 40}, DType::kFloat64);  // each query twice
  for (int64_t i = 0; i < more_queries.numel(); ++i) {
    more_queries.set(i, queries.at(i % queries.numel()));
  }
  const RetrievalResult want =
      RetrieveHopfield(patterns, more_queries, 8.0, RetrievalSolverOptions());
  const Tensor patterns32 = patterns.To(DType::kFloat32);
  const Tensor queries32 = more_queries.To(DType::kFloat32);
  std::vector<double> by_threads[2];
  for (int threads : {1, 2}) {
    ScopedNumThreads scoped(threads);
    const RetrievalResult got =
        RetrieveHopfield(patterns32, queries32, 8.0, RetrievalSolverOptions());
    EXPECT_EQ(got.nearest, want.nearest);
    const std::vector<double> fixed = got.fixed_points.ToVector();
    const std::vector<double> reference = want.fixed_points.ToVector();
    for (std::size_t i = 0; i < fixed.size(); ++i) {
      ASSERT_NEAR(fixed[i], reference[i], 2e-5) << "entry " << i << ", " << threads << " threads";
    }
    by_threads[threads - 1] = fixed;
  }
  EXPECT_EQ(by_threads[0], by_threads[1]);
}

class RetrieveCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // One directory per test: ctest runs test cases in parallel processes.
    dir_ = testing_support::ScratchPathForThisTest("retrieve");
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  fs::path dir_;
};

TEST_F(RetrieveCliTest, WritesFixedPointsAndStats) {
  RetrieveArgs args;
  args.patterns_path = Write("p.csv", "1,0\n0,1\n-1,0\n");
  args.queries_path = Write("q.csv", "0.9,0.1\n0.2,0.7\n");
  args.out_dir = (dir_ / "out").string();
  args.beta = 20;
  std::ostringstream out, err;
  ASSERT_EQ(RunRetrieve(args, out, err), 0) << err.str();
  std::ifstream csv((dir_ / "out" / "fixed_points.csv").string());
  std::string line;
  int rows = 0;
  while (std::getline(csv, line)) ++rows;
  EXPECT_EQ(rows, 2);
  std::ifstream json_file((dir_ / "out" / "stats.json").string());
  const YAML::Node stats = YAML::Load(json_file);
  EXPECT_EQ(stats["queries"].as<int>(), 2);
  EXPECT_EQ(stats["per_query"][0]["nearest"].as<int>(), 0);
  EXPECT_EQ(stats["per_query"][1]["nearest"].as<int>(), 1);
  EXPECT_EQ(stats["per_query"][1]["status"].as<std::string>(), "CONVERGED");
}

// Pattern and query files may open with a header row of column names.
TEST_F(RetrieveCliTest, CsvHeaderRowsAreSkipped) {
  RetrieveArgs args;
  args.patterns_path = Write("ph.csv", "x,y\n1,0\n0,1\n-1,0\n");
  args.queries_path = Write("qh.csv", "x,y\n0.2,0.7\n");
  args.out_dir = (dir_ / "out_header").string();
  args.beta = 20;
  std::ostringstream out, err;
  ASSERT_EQ(RunRetrieve(args, out, err), 0) << err.str();
  EXPECT_NE(out.str().find("1 queries against 3 patterns"), std::string::npos) << out.str();
  args.queries_path = Write("qh3.csv", "x,y,z\n0.2,0.7\n");
  args.out_dir = (dir_ / "out_header3").string();
  EXPECT_EQ(RunRetrieve(args, out, err), 2);
  EXPECT_NE(err.str().find("qh3.csv:2: 2 columns"), std::string::npos) << err.str();
}

TEST_F(RetrieveCliTest, BadCsvIsAnInputErrorNamingFileAndLine) {
  RetrieveArgs args;
  args.patterns_path = Write("ragged.csv", "1,0\n0,1,2\n");
  args.queries_path = Write("q.csv", "1,0\n");
  args.out_dir = (dir_ / "out").string();
  std::ostringstream out, err;
  EXPECT_EQ(RunRetrieve(args, out, err), 2);
  EXPECT_NE(err.str().find("ragged.csv:2"), std::string::npos) << err.str();

  args.patterns_path = Write("text.csv", "1,0\n0,abc\n");
  err.str("");
  EXPECT_EQ(RunRetrieve(args, out, err), 2);
  EXPECT_NE(err.str().find("text.csv:2: column 2"), std::string::npos) << err.str();

  args.patterns_path = Write("p3.csv", "1,0,0\n");
  err.str("");
  EXPECT_EQ(RunRetrieve(args, out, err), 2);
  EXPECT_NE(err.str().find("q.csv"), std::string::npos) << err.str();
  EXPECT_FALSE(fs::exists(dir_ / "out" / "stats.json"));
}

TEST_F(RetrieveCliTest, TrailingEmptyCellAndFloat32OverflowAreInputErrors) {
  RetrieveArgs args;
  args.patterns_path = Write("trailing.csv", "1,0\n0,1,\n");
  args.queries_path = Write("q.csv", "1,0\n");
  args.out_dir = (dir_ / "out").string();
  std::ostringstream out, err;
  EXPECT_EQ(RunRetrieve(args, out, err), 2);
  EXPECT_NE(err.str().find("trailing.csv:2: column 3"), std::string::npos) << err.str();

  args.patterns_path = Write("big.csv", "1,0\n0,1e39\n");
  err.str("");
  EXPECT_EQ(RunRetrieve(args, out, err), 2);
  EXPECT_NE(err.str().find("big.csv:2: column 2 ('1e39') does not fit in float32"),
            std::string::npos)
      << err.str();
  args.dtype = "float64";
  err.str("");
  EXPECT_EQ(RunRetrieve(args, out, err), 0) << err.str();
}

// Each used to pass the checks: inf as beta, an empty --out (both exit 1
// later), a budget that wrapped to 2 in an int, and any thread count.
TEST_F(RetrieveCliTest, OutOfRangeOptionsAreInputErrors) {
  RetrieveArgs base;
  base.patterns_path = Write("p.csv", "1,0\n0,1\n");
  base.queries_path = Write("q.csv", "1,0\n");
  base.out_dir = (dir_ / "out").string();
  struct Case {
    std::function<void(RetrieveArgs*)> change;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](RetrieveArgs* a) { a->beta = std::numeric_limits<double>::infinity(); },
       "--beta must be a positive finite number"},
      {[](RetrieveArgs* a) { a->beta = 1e39; }, "--beta 1e+39 does not fit in float32"},
      {[](RetrieveArgs* a) { a->out_dir = ""; }, "--out must name a directory"},
      {[](RetrieveArgs* a) { a->max_iterations = 4294967298; },
       "--max-iter must be in [1, 1048576], got 4294967298"},
      // The solvers' true bound (it used to say [1, 2147483647] and then
      // fail naming ForwardSolverOptions).
      {[](RetrieveArgs* a) { a->max_iterations = 2000000; }, "--max-iter must be in [1, 1048576]"},
      {[](RetrieveArgs* a) { a->tolerance = -1; }, "--tol must be a finite number >= 0"},
      {[](RetrieveArgs* a) { a->threads = 100000; }, "--threads must be in [1, 256]"},
      {[](RetrieveArgs* a) { a->threads = 0; }, "--threads must be in [1, 256]"},
  };
  for (const Case& c : cases) {
    RetrieveArgs args = base;
    c.change(&args);
    std::ostringstream out, err;
    EXPECT_EQ(RunRetrieve(args, out, err), 2) << c.message;
    EXPECT_NE(err.str().find(c.message), std::string::npos) << err.str();
  }
  EXPECT_FALSE(fs::exists(dir_ / "out"));
}

}  // namespace
}  // namespace stillpoint::retrieve_test
