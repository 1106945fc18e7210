#include "training/metrics.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "framework/check.h"
#include "tests/scratch_path.h"
#include "training/svg_plot.h"

namespace stillpoint::metrics_test {
namespace {

class MetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // One directory per test: ctest runs test cases in parallel processes.
    dir_ = testing_support::ScratchPathForThisTest("metrics").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(MetricsTest, CsvAndJsonLinesHoldTheSameRows) {
  {
    MetricsWriter writer(dir_, {"step", "loss", "test_accuracy"});
    writer.Write({{"step", 1}, {"loss", 2.5}});
    writer.Write(
        {{"step", 2}, {"loss", std::numeric_limits<double>::quiet_NaN()}, {"test_accuracy", 0.75}});
  }
  auto columns = ReadMetricsCsv(dir_ + "/metrics.csv");
  ASSERT_EQ(columns["step"].size(), 2u);
  EXPECT_EQ(columns["loss"][0], 2.5);
  EXPECT_TRUE(std::isnan(columns["loss"][1]));
  EXPECT_TRUE(std::isnan(columns["test_accuracy"][0]));  // empty cell
  EXPECT_EQ(columns["test_accuracy"][1], 0.75);

  std::ifstream jsonl(dir_ + "/metrics.jsonl");
  std::string line;
  std::vector<YAML::Node> rows;
  while (std::getline(jsonl, line)) rows.push_back(YAML::Load(line));  // JSON is YAML
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0]["loss"].as<double>(), 2.5);
  EXPECT_FALSE(rows[0]["test_accuracy"].IsDefined());
  EXPECT_TRUE(rows[1]["loss"].IsNull());
  EXPECT_EQ(rows[1]["loss_nonfinite"].as<std::string>(), "nan");
}

TEST_F(MetricsTest, UnknownColumnsAreRejectedAndAppendKeepsOldRows) {
  {
    MetricsWriter writer(dir_, {"step", "loss"});
    EXPECT_THROW(writer.Write({{"steps", 1}}), Error);
    writer.Write({{"step", 1}, {"loss", 1.0}});
  }
  {
    MetricsWriter writer(dir_, {"step", "loss"}, /*append=*/true);
    writer.Write({{"step", 2}, {"loss", 0.5}});
  }
  auto columns = ReadMetricsCsv(dir_ + "/metrics.csv");
  EXPECT_EQ(columns["step"], (std::vector<double>{1, 2}));
}

TEST_F(MetricsTest, FormatsChooseTheFilesAndEitherFileReadsBack) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  {
    MetricsWriter writer(dir_, {"step", "loss", "test_accuracy"}, false, {"jsonl"});
    writer.Write({{"step", 1}, {"loss", 2.5}});
    writer.Write({{"step", 2}, {"loss", nan}, {"test_accuracy", 0.75}});
  }
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/metrics.csv"));
  ASSERT_TRUE(std::filesystem::exists(dir_ + "/metrics.jsonl"));
  auto columns = ReadRunMetrics(dir_);
  ASSERT_EQ(columns["step"].size(), 2u);
  EXPECT_EQ(columns["step"][1], 2.0);
  EXPECT_EQ(columns["loss"][0], 2.5);
  EXPECT_TRUE(std::isnan(columns["loss"][1]));  // null, with loss_nonfinite beside it
  EXPECT_EQ(columns.count("loss_nonfinite"), 0u);
  EXPECT_TRUE(std::isnan(columns["test_accuracy"][0]));  // absent from the first row
  EXPECT_EQ(columns["test_accuracy"][1], 0.75);

  std::filesystem::remove_all(dir_);
  { MetricsWriter(dir_, {"step"}, false, {"csv"}).Write({{"step", 4}}); }
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/metrics.csv"));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/metrics.jsonl"));
  EXPECT_EQ(ReadRunMetrics(dir_)["step"], std::vector<double>{4.0});

  EXPECT_THROW(MetricsWriter(dir_, {"step"}, false, {}), Error);
  try {
    MetricsWriter(dir_, {"step"}, false, {"parquet"});
    ADD_FAILURE() << "an unknown format was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("parquet"), std::string::npos) << error.what();
  }
  std::ofstream(dir_ + "/bad.jsonl") << "{\"step\": 1}\n{\"step\": oops\n";
  try {
    ReadMetricsJsonl(dir_ + "/bad.jsonl");
    ADD_FAILURE() << "a malformed line was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("bad.jsonl:2"), std::string::npos) << error.what();
  }
}

TEST(JsonTest, StringsAreEscaped) {
  EXPECT_EQ(JsonString("a\"b\\c\n"), "\"a\\\"b\\\\c\\n\"");
  EXPECT_EQ(JsonNumber(std::numeric_limits<double>::infinity()), "null");
  EXPECT_EQ(JsonNumber(0.1), "0.1");
}

TEST(SvgPlotTest, SeriesLegendAxesAndGapsForNonFiniteValues) {
  PlotSeries a{"implicit <ift>", {0, 1, 2, 3}, {1, 0.5, NAN, 0.1}};
  PlotSeries b{"explicit", {0, 1, 2, 3}, {1, 0.8, 0.6, 0.4}};
  PlotOptions options;
  options.title = "loss";
  options.x_label = "step";
  const std::string svg = LinePlotSvg({a, b}, options);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("implicit &lt;ift&gt;"), std::string::npos);  // escaped legend
  EXPECT_NE(svg.find(">step<"), std::string::npos);
  // Series a splits into two polylines at the NaN; b is one.
  std::size_t count = 0;
  for (std::size_t at = svg.find("<polyline"); at != std::string::npos;
       at = svg.find("<polyline", at + 1)) {
    ++count;
  }
  EXPECT_EQ(count, 3u);
}

TEST(SvgPlotTest, LogScaleSkipsNonPositiveValuesAndEmptyDataSaysSo) {
  PlotOptions options;
  options.log_y = true;
  const std::string svg = LinePlotSvg({{"r", {0, 1, 2}, {1e-2, 0, 1e-6}}}, options);
  EXPECT_NE(svg.find("(log scale)"), std::string::npos);
  const std::string empty = LinePlotSvg({{"r", {0}, {NAN}}}, PlotOptions{});
  EXPECT_NE(empty.find("no finite data"), std::string::npos);
}

}  // namespace
}  // namespace stillpoint::metrics_test
