// The extrapolation tasks and the test-time budget (issue 46):
//   - prefix_sum: digits below task.modulus, targets the running sums; with
//     modulus 2 it is prefix_parity draw for draw;
//   - maze: every maze is a tree over its cells (n^2 - 1 passages, every cell
//     reached), drawn on a (2n+1)^2 grid with walls at the border and the
//     corners; one start and one goal; the target marks exactly the
//     breadth-first shortest path between them, walls carry no target;
//     `--size` redraws the held-out mazes, `--length` and sizes beyond
//     task.size's range are refused naming the key;
//   - solved_fraction counts the examples right at every target;
//   - the budget rule: the trained depth at the training length, more for
//     longer inputs (per token), eval.max_iterations (`--iters`) above all.
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <fstream>
#include <iterator>
#include <sstream>
#include <set>
#include <string>
#include <vector>

#include "tests/error_text.h"
#include "tests/scratch_path.h"
#include "training/cli/cli_commands.h"
#include "training/config_schema.h"
#include "training/data/dataset_registry.h"
#include "training/experiment.h"
#include "training/svg_plot.h"

namespace stillpoint::extrapolation_test {
namespace {

Config Load(const std::vector<std::string>& overrides) {
  return Config::FromYaml(StillpointSchema(), "", "t.yaml", overrides);
}

using testing_support::ErrorOf;

TEST(PrefixSumTest, TargetsAreTheRunningSumsModuloTheModulus) {
  const Config config = Load({"task.kind=prefix_sum", "task.modulus=3", "task.length=20"});
  const auto data = GenerateTaskExamples(config, 40, 7);
  EXPECT_EQ(data->info().vocab_size, 4);  // the digits and the start symbol 3
  EXPECT_EQ(data->info().num_classes, 3);
  std::set<int64_t> seen;
  for (int64_t i = 0; i < data->size(); ++i) {
    const Example& e = data->Get(i);
    ASSERT_EQ(e.tokens.size(), 21u);
    EXPECT_EQ(e.tokens[0], 3);
    EXPECT_EQ(e.targets[0], kIgnoreTarget);
    int64_t sum = 0;
    for (std::size_t t = 1; t < e.tokens.size(); ++t) {
      ASSERT_GE(e.tokens[t], 0);
      ASSERT_LT(e.tokens[t], 3);
      seen.insert(e.tokens[t]);
      sum += e.tokens[t];
      EXPECT_EQ(e.targets[t], sum % 3);
    }
  }
  EXPECT_EQ(seen.size(), 3u);
}

TEST(PrefixSumTest, PrefixParityOpensWithTheStartSymbolThenTheRunningXor) {
  const auto data =
      GenerateTaskExamples(Load({"task.kind=prefix_parity", "task.length=12"}), 50, 3);
  EXPECT_EQ(data->info().vocab_size, 3);  // the bits and the start symbol
  EXPECT_EQ(data->info().num_classes, 2);
  EXPECT_EQ(data->info().length, 13);
  for (int64_t i = 0; i < data->size(); ++i) {
    const Example& ex = data->Get(i);
    ASSERT_EQ(ex.tokens.size(), 13u);
    EXPECT_EQ(ex.tokens[0], 2);
    EXPECT_EQ(ex.targets[0], kIgnoreTarget);
    int64_t parity = 0;
    for (int t = 1; t < 13; ++t) {
      ASSERT_LT(ex.tokens[t], 2);
      parity ^= ex.tokens[t];
      ASSERT_EQ(ex.targets[t], parity);
    }
  }
}

TEST(PrefixSumTest, WithoutTheStartTokenTheSequenceIsItsDigits) {
  const auto data = GenerateTaskExamples(
      Load({"task.kind=prefix_sum", "task.modulus=5", "task.length=9", "task.start_token=false"}),
      20, 3);
  EXPECT_EQ(data->info().vocab_size, 5);
  EXPECT_EQ(data->info().length, 9);
  for (int64_t i = 0; i < data->size(); ++i) {
    const Example& ex = data->Get(i);
    int64_t sum = 0;
    for (int t = 0; t < 9; ++t) {
      sum = (sum + ex.tokens[t]) % 5;
      ASSERT_EQ(ex.targets[t], sum);
    }
  }
}

// The reason for the start symbol (prefix_sum.h): without it, an input
// that opens with equal digits gives its first tokens equal keys and values
// under relative positions, so no model of that kind can tell them apart;
// their running sums differ.
TEST(PrefixSumTest, TheStartSymbolIsPartOfTheFootprintAndTheHeldOutLength) {
  const Config config = Load({"task.kind=prefix_sum", "task.modulus=3", "task.length=10"});
  EXPECT_EQ(TaskFootprintOf(config).length, 11);
  EXPECT_EQ(TaskFootprintOf(config).vocab_size, 4);
  DatasetRequest request{&config, "", 0, 0};
  request.length_override = 40;
  const DatasetSplit split = MakeTaskSplit(request);
  EXPECT_EQ(split.test->info().length, 41);  // --length counts digits
  EXPECT_EQ(split.train->info().length, 11);
}

TEST(PrefixSumTest, ModulusTwoIsPrefixParity) {
  const auto sums = GenerateTaskExamples(Load({"task.kind=prefix_sum", "task.modulus=2"}), 30, 5);
  const auto parity = GenerateTaskExamples(Load({"task.kind=prefix_parity"}), 30, 5);
  for (int64_t i = 0; i < 30; ++i) {
    EXPECT_EQ(sums->Get(i).tokens, parity->Get(i).tokens);
    EXPECT_EQ(sums->Get(i).targets, parity->Get(i).targets);
  }
}

TEST(PrefixSumTest, TheModulusKeyIsRefusedForAnotherTask) {
  const Config config = Load({"task.kind=reverse", "task.modulus=3"});
  DatasetRequest request{&config, "", 0, 0};
  const std::string error = ErrorOf([&] { MakeTaskSplit(request); });
  EXPECT_NE(error.find("task.modulus is not read by task.kind reverse"), std::string::npos)
      << error;
}

// ---- mazes

// The open neighbours of grid position p.
std::vector<int64_t> OpenNeighbours(const std::vector<int64_t>& tokens, int64_t width, int64_t p) {
  std::vector<int64_t> out;
  for (int64_t q : {p - width, p + width, p - 1, p + 1}) {
    if (q >= 0 && q < static_cast<int64_t>(tokens.size()) && tokens[q] != 0) out.push_back(q);
  }
  return out;
}

// Breadth-first distances from p over open positions (-1: not reached).
std::vector<int64_t> Distances(const std::vector<int64_t>& tokens, int64_t width, int64_t from) {
  std::vector<int64_t> distance(tokens.size(), -1);
  std::deque<int64_t> queue = {from};
  distance[from] = 0;
  while (!queue.empty()) {
    const int64_t p = queue.front();
    queue.pop_front();
    for (int64_t q : OpenNeighbours(tokens, width, p)) {
      if (distance[q] < 0) {
        distance[q] = distance[p] + 1;
        queue.push_back(q);
      }
    }
  }
  return distance;
}

// The marked positions are exactly a shortest path from start to goal: as
// many as its length + 1, each one step nearer the goal than the one before.
void CheckShortestPathIsMarked(const Example& e, int64_t width, int64_t start, int64_t goal) {
  const std::vector<int64_t> from_start = Distances(e.tokens, width, start);
  const std::vector<int64_t> from_goal = Distances(e.tokens, width, goal);
  const int64_t length = from_start[goal];
  ASSERT_GT(length, 0);
  int64_t marked = 0;
  for (int64_t p = 0; p < width * width; ++p) {
    if (e.targets[p] != 1) continue;
    ++marked;
    EXPECT_EQ(from_start[p] + from_goal[p], length) << "a marked position off the shortest path";
  }
  EXPECT_EQ(marked, length + 1);
  EXPECT_EQ(e.targets[start], 1);
  EXPECT_EQ(e.targets[goal], 1);
}

void CheckMaze(const Example& e, int64_t n) {
  const int64_t width = 2 * n + 1;
  ASSERT_EQ(static_cast<int64_t>(e.tokens.size()), width * width);
  int64_t starts = 0, goals = 0, passages = 0, start = -1, goal = -1;
  for (int64_t r = 0; r < width; ++r) {
    for (int64_t c = 0; c < width; ++c) {
      const int64_t p = r * width + c, token = e.tokens[p];
      ASSERT_GE(token, 0);
      ASSERT_LE(token, 3);
      const bool cell = r % 2 == 1 && c % 2 == 1;
      if (r == 0 || c == 0 || r == width - 1 || c == width - 1 || (r % 2 == 0 && c % 2 == 0)) {
        EXPECT_EQ(token, 0) << "a border or corner position is open at " << r << "," << c;
      }
      if (cell) {
        EXPECT_NE(token, 0) << "a cell is a wall at " << r << "," << c;
      }
      if (token != 0 && !cell) ++passages;
      if (token == 2) ++starts, start = p;
      if (token == 3) ++goals, goal = p;
      if (token == 2 || token == 3) {
        EXPECT_TRUE(cell);
      }
      // Walls carry no target; open positions 0 or 1.
      if (token == 0) {
        EXPECT_EQ(e.targets[p], kIgnoreTarget);
      } else {
        EXPECT_TRUE(e.targets[p] == 0 || e.targets[p] == 1);
      }
    }
  }
  ASSERT_EQ(starts, 1);
  ASSERT_EQ(goals, 1);
  // A tree over the n^2 cells: n^2 - 1 passages (edges), every cell reached.
  EXPECT_EQ(passages, n * n - 1);
  const std::vector<int64_t> from_start = Distances(e.tokens, width, start);
  for (int64_t r = 1; r < width; r += 2) {
    for (int64_t c = 1; c < width; c += 2) EXPECT_GE(from_start[r * width + c], 0);
  }
  CheckShortestPathIsMarked(e, width, start, goal);
}

TEST(MazeTest, EveryMazeIsATreeAndItsTargetIsTheShortestPath) {
  for (int64_t n : {2, 3, 5, 9}) {
    const Config config = Load({"task.kind=maze", "task.size=" + std::to_string(n)});
    const auto data = GenerateTaskExamples(config, 40, static_cast<uint64_t>(n));
    EXPECT_EQ(data->info().grid_width, 2 * n + 1);
    EXPECT_EQ(data->info().length, (2 * n + 1) * (2 * n + 1));
    EXPECT_EQ(data->info().num_classes, 2);
    std::set<std::vector<int64_t>> distinct;
    for (int64_t i = 0; i < data->size(); ++i) {
      CheckMaze(data->Get(i), n);
      distinct.insert(data->Get(i).tokens);
    }
    // 2 x 2 cells have 4 spanning trees and 12 (start, goal) pairs only.
    if (n >= 3) {
      EXPECT_GT(distinct.size(), 35u) << "the mazes of one seed repeat";
    }
  }
}

TEST(MazeTest, MinSizeDrawsSmallerTrainingMazesInsideTheGridAndKeepsTheHeldOutSize) {
  const Config config = Load({"task.kind=maze", "task.size=5", "task.min_size=2",
                              "task.train_examples=200", "task.test_examples=20"});
  const DatasetSplit split = MakeTaskSplit(DatasetRequest{&config, "", 0, 0});
  const int64_t width = 11;
  ASSERT_EQ(split.train->info().length, width * width);
  std::set<int64_t> sizes;
  std::set<std::pair<int64_t, int64_t>> corners;
  for (int64_t i = 0; i < split.train->size(); ++i) {
    const Example& e = split.train->Get(i);
    // The open cells form a k x k block of cells: a tree over them
    // (k^2 - 1 passages), every other position a wall.
    int64_t top = width, left = width, bottom = -1, right = -1, cells = 0, passages = 0;
    int64_t start = -1, goal = -1;
    for (int64_t p = 0; p < width * width; ++p) {
      if (e.tokens[p] == 0) {
        EXPECT_EQ(e.targets[p], kIgnoreTarget);
        continue;
      }
      const int64_t r = p / width, c = p % width;
      top = std::min(top, r), left = std::min(left, c);
      bottom = std::max(bottom, r), right = std::max(right, c);
      (r % 2 == 1 && c % 2 == 1 ? cells : passages) += 1;
      if (e.tokens[p] == 2) start = p;
      if (e.tokens[p] == 3) goal = p;
    }
    const int64_t k = (bottom - top) / 2 + 1;
    ASSERT_EQ(right - left, bottom - top) << "example " << i << " is not square";
    EXPECT_EQ(cells, k * k) << "example " << i;
    EXPECT_EQ(passages, k * k - 1) << "example " << i;
    EXPECT_GE(k, 2);
    EXPECT_LE(k, 5);
    EXPECT_EQ(top % 2, 1);
    EXPECT_EQ(left % 2, 1);
    sizes.insert(k);
    corners.insert({top, left});
    ASSERT_GE(start, 0);
    ASSERT_GE(goal, 0);
    CheckShortestPathIsMarked(e, width, start, goal);
  }
  EXPECT_EQ(sizes, (std::set<int64_t>{2, 3, 4, 5}));
  EXPECT_GT(corners.size(), 4u) << "the smaller mazes always sit in the same places";
  for (int64_t i = 0; i < split.test->size(); ++i) CheckMaze(split.test->Get(i), 5);

  const Config inverted = Load({"task.kind=maze", "task.size=3", "task.min_size=4"});
  const std::string error =
      ErrorOf([&] { MakeTaskSplit(DatasetRequest{&inverted, "", 0, 0}); });
  EXPECT_NE(error.find("task.min_size 4 exceeds task.size 3"), std::string::npos) << error;
}

TEST(MazeTest, SizeRedrawsTheHeldOutMazesAndLengthIsRefused) {
  const Config config =
      Load({"task.kind=maze", "task.size=3", "task.train_examples=8", "task.test_examples=5"});
  DatasetRequest request{&config, "", 0, 0, 6};
  const DatasetSplit split = MakeTaskSplit(request);
  EXPECT_EQ(split.train->info().length, 49);
  EXPECT_EQ(split.test->info().length, 169);
  EXPECT_EQ(split.grid_width, 13);
  EXPECT_EQ(split.longest, 169);
  for (int64_t i = 0; i < split.test->size(); ++i) CheckMaze(split.test->Get(i), 6);

  DatasetRequest longer{&config, "", 60, 0};
  std::string error = ErrorOf([&] { MakeTaskSplit(longer); });
  EXPECT_NE(error.find("t.yaml: task.kind maze: has a size, not a length: use --size"),
            std::string::npos)
      << error;
  DatasetRequest huge{&config, "", 0, 0, 40};
  error = ErrorOf([&] { MakeTaskSplit(huge); });
  EXPECT_NE(error.find("--size 40 is outside task.size's range [2, 31]"), std::string::npos)
      << error;
}

// ---- solved examples

TEST(SolvedFractionTest, AnExampleIsSolvedWhenEveryTargetIsRight) {
  // Three examples of two positions, two classes; the logits pick class 1
  // where the value is positive.
  Batch batch;
  batch.batch_size = 3;
  batch.length = 2;
  batch.targets = {1, 0, /**/ 1, 1, /**/ kIgnoreTarget, kIgnoreTarget};
  Tensor logits(Shape{6, 2}, DType::kFloat64);
  const double picks[6] = {1, 0, 1, 0, 1, 1};  // example 1's second position is wrong
  for (int64_t r = 0; r < 6; ++r) {
    logits.set(r * 2 + 0, picks[r] > 0 ? 0.0 : 1.0);
    logits.set(r * 2 + 1, picks[r] > 0 ? 1.0 : 0.0);
  }
  const auto [solved, counted] = CountSolved(logits, batch);
  EXPECT_EQ(solved, 1);   // the first
  EXPECT_EQ(counted, 2);  // the third has no target
  const auto [correct, targets] = CountCorrect(logits, batch);
  EXPECT_EQ(correct, 3);
  EXPECT_EQ(targets, 4);
}

// ---- the budget rule

TEST(EvalBudgetTest, LongerInputsGetMoreIterationsAndItersOverrides) {
  // Without the start symbol a training input is its 16 digits.
  const std::vector<std::string> base = {"task.kind=prefix_parity", "task.length=16",
                                         "task.start_token=false", "model.kind=implicit"};
  const Config config = Load(base);
  // The training inputs: the trained budget.
  EXPECT_EQ(EvalDepth(config, 30, 0), 30);
  EXPECT_EQ(EvalDepth(config, 30, 16), 30);
  // The trained iterations per token (30 / 16) by default.
  EXPECT_EQ(EvalDepth(config, 30, 64), 120);
  EXPECT_EQ(EvalDepth(config, 30, 20), 38);  // ceil(37.5)
  // Never below the trained budget.
  EXPECT_EQ(EvalDepth(config, 30, 8), 30);
  std::vector<std::string> per_token = base;
  per_token.push_back("eval.iterations_per_token=4");
  EXPECT_EQ(EvalDepth(Load(per_token), 30, 64), 256);
  EXPECT_EQ(EvalDepth(Load(per_token), 30, 4), 30);
  std::vector<std::string> fixed = per_token;
  fixed.push_back("eval.max_iterations=7");
  EXPECT_EQ(EvalDepth(Load(fixed), 30, 64), 7);
  // A maze's tokens are its grid's: 9 x 9 cells (361 tokens) against 5 x 5 (121).
  const Config maze = Load({"task.kind=maze", "task.size=5"});
  EXPECT_EQ(EvalDepth(maze, 20, 19 * 19), 60);  // ceil(20 * 361 / 121 = 59.67)
}

// ---- eval's budget flags

class EvalFlagsTest : public testing_support::ScratchDirTest {
 protected:
  EvalFlagsTest() : ScratchDirTest("eval_flags") {}

  // A tiny trained run of `kind` on the reverse task.
  std::string Train(const std::string& kind) {
    const std::string config = (dir_ / (kind + ".yaml")).string();
    std::ofstream(config) << "task: {kind: reverse, length: 4, vocab_size: 4, train_examples: 8, "
                             "test_examples: 4}\nmodel: {kind: "
                          << kind
                          << ", dim: 8, heads: 2, hidden: 8, max_length: 8, unroll_steps: 2}\n"
                             "train: {steps: 1, batch_size: 4}\nlog: {dir: "
                          << (dir_ / kind).string() << ", progress: none, plots: false}\n";
    TrainArgs args;
    args.config_path = config;
    std::ostringstream out, err;
    EXPECT_EQ(RunTrain(args, out, err), 0) << err.str();
    return (dir_ / kind).string();
  }

  int Eval(EvalArgs args, std::string* error) {
    std::ostringstream out, err;
    const int code = RunEval(args, out, err);
    *error = err.str();
    return code;
  }
};

TEST_F(EvalFlagsTest, UntilConvergedNeedsACapAndAToleranceAndSizeNeedsASize) {
  const std::string implicit = Train("implicit");
  std::string error;
  EvalArgs args;
  args.run = implicit;
  args.until_converged = true;
  EXPECT_EQ(Eval(args, &error), 2);
  EXPECT_NE(error.find("--until-converged needs --cap N"), std::string::npos) << error;
  args.cap = 40;
  args.json = true;
  EXPECT_EQ(Eval(args, &error), 0) << error;
  args.iterations = 5;
  EXPECT_EQ(Eval(args, &error), 2);
  EXPECT_NE(error.find("--iters and --until-converged both set the budget"), std::string::npos)
      << error;
  EvalArgs tied;
  tied.run = Train("tied");
  tied.until_converged = true;
  tied.cap = 40;
  EXPECT_EQ(Eval(tied, &error), 2);
  EXPECT_NE(error.find("needs a model with a tolerance"), std::string::npos) << error;
  EvalArgs sized;
  sized.run = implicit;
  sized.size = 5;
  EXPECT_EQ(Eval(sized, &error), 2);
  EXPECT_NE(error.find("task.kind reverse: has a length, not a size: use --length"),
            std::string::npos)
      << error;
}

// A tied model has no forward solve: eval --json and summary.json write its
// solver figures as null, never as a measured 0; an implicit model's are
// numbers.
TEST_F(EvalFlagsTest, SolverFiguresOfAModelWithoutASolveAreNull) {
  const auto json_of = [](const std::string& run) {
    EvalArgs args;
    args.run = run;
    args.json = true;
    std::ostringstream out, err;
    EXPECT_EQ(RunEval(args, out, err), 0) << err.str();
    return out.str();
  };
  const std::string tied_run = Train("tied");
  const std::string tied = json_of(tied_run);
  for (const char* field : {"forward_iterations_mean", "forward_iterations_max",
                            "forward_residual_max", "unconverged_samples"}) {
    EXPECT_NE(tied.find(std::string("\"") + field + "\": null"), std::string::npos)
        << field << " in " << tied;
  }
  const std::string implicit = json_of(Train("implicit"));
  EXPECT_EQ(implicit.find("\"forward_iterations_mean\": null"), std::string::npos) << implicit;
  EXPECT_NE(implicit.find("\"unconverged_samples\": 0"), std::string::npos) << implicit;
  std::ifstream summary(tied_run + "/summary.json");
  const std::string text((std::istreambuf_iterator<char>(summary)), {});
  for (const char* field : {"test_forward_iterations_mean", "\"forward_iterations_mean",
                            "backward_residual_max", "attention_iterations_mean"}) {
    EXPECT_NE(text.find(std::string(field) + "\": null"), std::string::npos) << field;
  }
}

// ---- the heat map

TEST(HeatMapSvgTest, CellsCarryTheirPercentAndMissingCellsAreEmpty) {
  HeatMapPanel implicit{"implicit", {16, 64}, {8, 32}, {0.5, 1.0, 0.25, std::nan("")}};
  HeatMapPanel explicit_model{"explicit", {16, 64}, {6}, {0.9, 0.5}};
  const std::string svg =
      HeatMapSvg({implicit, explicit_model}, {"acc", "length (tokens)", "iterations"});
  for (const char* text : {">50.0<", ">100.0<", ">25.0<", ">90.0<", ">implicit<", ">explicit<",
                           ">length (tokens)<", ">64<", ">32<"}) {
    EXPECT_NE(svg.find(text), std::string::npos) << text;
  }
  // Four measured cells of five, one drawn empty; 0 and 1 at the map's ends.
  EXPECT_NE(svg.find("fill=\"none\" stroke=\"#ccc\""), std::string::npos);
  EXPECT_NE(svg.find("#fde725"), std::string::npos);  // 100%
}

}  // namespace
}  // namespace stillpoint::extrapolation_test
