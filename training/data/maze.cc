// maze: a random depth-first-search ("backtracker") maze on an n x n cell
// grid, n = task.size, drawn as a (2n+1) x (2n+1) grid of tokens, row-major:
// cells and the walls knocked down between them are open, the rest walls;
// two distinct random cells are the start and the goal. The target marks
// the open positions on the path from start to goal (1) and the other open
// positions (0); walls carry no loss. A DFS maze is a tree, so the path is
// unique, and found by breadth-first search. Bansal et al. (2022) train on
// small mazes and solve larger ones by iterating longer (`--size`).
#include <deque>

#include "training/data/sequence_task.h"
#include "training/data/task_list.h"

namespace stillpoint {
namespace {

// The tokens of a maze.
enum MazeToken : int64_t { kWall = 0, kOpen = 1, kStart = 2, kGoal = 3 };

struct MazeOptions {
  int64_t size = 5;  // cells per side
  int64_t train_examples = 4096;
  int64_t test_examples = 512;

  static const OptionFields<MazeOptions>& Fields() {
    using O = MazeOptions;
    static const auto* fields =
        &(new OptionFields<O>)
             ->Int("size", &O::size, 2, 31,
                   "Cells per side of the training mazes, drawn as (2 size + 1)^2 tokens "
                   "(`stillpoint eval --size` for the held-out set)")
             .Int("train_examples", &O::train_examples, 1, 1 << 24, "Training sequences generated")
             .Int("test_examples", &O::test_examples, 1, 1 << 24,
                  "Held-out sequences generated with another seed");
    return *fields;
  }
};

// Carves the maze of n x n cells into `grid` (width 2n + 1, all walls).
void CarveMaze(Rng& rng, int64_t n, std::vector<int64_t>& grid) {
  const int64_t width = 2 * n + 1;
  std::vector<bool> visited(n * n, false);
  std::vector<int64_t> stack = {rng.UniformInt(n * n)};
  visited[stack.back()] = true;
  grid[(2 * (stack.back() / n) + 1) * width + 2 * (stack.back() % n) + 1] = kOpen;
  const int64_t dr[] = {-1, 1, 0, 0}, dc[] = {0, 0, -1, 1};
  while (!stack.empty()) {
    const int64_t cell = stack.back(), r = cell / n, c = cell % n;
    int64_t next[4], count = 0;
    for (int d = 0; d < 4; ++d) {
      const int64_t nr = r + dr[d], nc = c + dc[d];
      if (nr >= 0 && nr < n && nc >= 0 && nc < n && !visited[nr * n + nc]) next[count++] = d;
    }
    if (count == 0) {
      stack.pop_back();
      continue;
    }
    const int64_t d = next[rng.UniformInt(count)];
    const int64_t nr = r + dr[d], nc = c + dc[d];
    visited[nr * n + nc] = true;
    grid[(2 * r + 1 + dr[d]) * width + 2 * c + 1 + dc[d]] = kOpen;  // the wall between
    grid[(2 * nr + 1) * width + 2 * nc + 1] = kOpen;
    stack.push_back(nr * n + nc);
  }
}

// The positions of the shortest path from `from` to `to` over open
// positions (breadth-first search), both ends included.
std::vector<int64_t> ShortestPath(const std::vector<int64_t>& grid, int64_t width, int64_t from,
                                  int64_t to) {
  std::vector<int64_t> parent(grid.size(), -1);
  std::deque<int64_t> queue = {from};
  parent[from] = from;
  while (!queue.empty() && parent[to] < 0) {
    const int64_t p = queue.front();
    queue.pop_front();
    for (int64_t q : {p - width, p + width, p - 1, p + 1}) {
      // The border is all walls, so a step from an open position stays inside.
      if (grid[q] != kWall && parent[q] < 0) {
        parent[q] = p;
        queue.push_back(q);
      }
    }
  }
  std::vector<int64_t> path;
  for (int64_t p = to; p != from; p = parent[p]) path.push_back(p);
  path.push_back(from);
  return path;
}

std::unique_ptr<InMemoryDataset> DrawMazes(const MazeOptions& o, int64_t examples,
                                           uint64_t seed) {
  const int64_t n = o.size, width = 2 * n + 1;
  DatasetInfo info;
  info.length = width * width;
  info.grid_width = width;
  info.vocab_size = 4;   // MazeToken
  info.num_classes = 2;  // off or on the path
  Rng rng(seed);
  std::vector<Example> data(examples);
  auto position = [&](int64_t cell) { return (2 * (cell / n) + 1) * width + 2 * (cell % n) + 1; };
  for (Example& example : data) {
    example.tokens.assign(info.length, kWall);
    CarveMaze(rng, n, example.tokens);
    const int64_t start = rng.UniformInt(n * n);
    int64_t goal = rng.UniformInt(n * n - 1);
    if (goal >= start) ++goal;
    example.targets.assign(info.length, kIgnoreTarget);
    for (int64_t p = 0; p < info.length; ++p) {
      if (example.tokens[p] != kWall) example.targets[p] = 0;
    }
    for (int64_t p : ShortestPath(example.tokens, width, position(start), position(goal))) {
      example.targets[p] = 1;
    }
    example.tokens[position(start)] = kStart;
    example.tokens[position(goal)] = kGoal;
  }
  return std::make_unique<InMemoryDataset>(info, std::move(data));
}

MazeOptions WithTestSize(MazeOptions o, const DatasetRequest& request) {
  if (request.length_override > 0) {
    throw ConfigError("has a size, not a length: use --size (cells per side)");
  }
  if (request.size_override > 0) {
    const auto& field = MazeOptions::Fields().fields().front();
    if (!field.bounds.Contains(static_cast<double>(request.size_override))) {
      throw ConfigError("--size " + std::to_string(request.size_override) +
                        " is outside task.size's range " + field.bounds.Text());
    }
    o.size = request.size_override;
  }
  return o;
}

}  // namespace

TaskDefinition MazeTask() {
  using O = MazeOptions;
  return DefineSyntheticTask<O>(
      "a depth-first-search maze of task.size^2 cells as a (2 task.size + 1)^2 grid of wall, "
      "open, start and goal tokens; the target marks the shortest path on the open positions",
      DrawMazes, WithTestSize, [](const O& o) {
        return TaskFootprint{.length = (2 * o.size + 1) * (2 * o.size + 1), .vocab_size = 4, .keys = {"task.size"}};
      });
}

}  // namespace stillpoint
