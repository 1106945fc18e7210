// maze: a random depth-first-search ("backtracker") maze on an n x n cell
// grid, n = task.size, drawn as a (2n+1) x (2n+1) grid of tokens, row-major:
// cells and the walls knocked down between them are open, the rest walls;
// two distinct random cells are the start and the goal. The target marks
// the open positions on the path from start to goal (1) and the other open
// positions (0); walls carry no loss. A DFS maze is a tree, so the path is
// unique, and found by breadth-first search. Bansal et al. (2022) train on
// small mazes and solve larger ones by iterating longer (`--size`).
// With task.min_size the training mazes have random sizes up to task.size,
// each at a random place inside the task.size grid with walls around it: a
// short path teaches a step of the search before long paths need many; the
// held-out mazes always have task.size (or --size) cells per side.
#include <deque>

#include "training/data/sequence_task.h"
#include "training/data/task_list.h"

namespace stillpoint {
namespace {

// The tokens of a maze.
enum MazeToken : int64_t { kWall = 0, kOpen = 1, kStart = 2, kGoal = 3 };

struct MazeOptions {
  int64_t size = 5;  // cells per side
  int64_t min_size = 0;  // smallest training maze; 0: every maze has `size`
  int64_t train_examples = 4096;
  int64_t test_examples = 512;

  static const OptionFields<MazeOptions>& Fields() {
    using O = MazeOptions;
    static const auto* fields = &ExampleCountFields(
        (new OptionFields<O>)
            ->Int("size", &O::size, 2, 31,
                  "Cells per side of the training mazes, drawn as (2 size + 1)^2 tokens "
                  "(`stillpoint eval --size` for the held-out set)")
            .Int("min_size", &O::min_size, 0, 31,
                 "Training mazes get a random size from task.min_size to task.size cells per "
                 "side, each at a random place in the task.size grid, walls around it; the "
                 "held-out mazes keep task.size (0: every training maze has task.size)"));
    return *fields;
  }
};

// Where the maze's cells sit on the token grid: n x n cells whose top-left
// cell is `corner` cells in from the grid's, on a grid `width` tokens wide.
struct CellFrame {
  int64_t n = 0, width = 0, corner_row = 0, corner_col = 0;
  // The token of the cell at (row, col) of the maze, plus a step (dr, dc)
  // of tokens (a step of 1 reaches the wall beside the cell).
  int64_t Token(int64_t row, int64_t col, int64_t dr = 0, int64_t dc = 0) const {
    return (2 * (corner_row + row) + 1 + dr) * width + 2 * (corner_col + col) + 1 + dc;
  }
  int64_t Token(int64_t cell) const { return Token(cell / n, cell % n); }
};

// Carves the maze of frame.n x frame.n cells into `grid` (all walls).
void CarveMaze(Rng& rng, const CellFrame& frame, std::vector<int64_t>& grid) {
  const int64_t n = frame.n;
  std::vector<bool> visited(n * n, false);
  std::vector<int64_t> stack = {rng.UniformInt(n * n)};
  visited[stack.back()] = true;
  grid[frame.Token(stack.back())] = kOpen;
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
    grid[frame.Token(r, c, dr[d], dc[d])] = kOpen;  // the wall between
    grid[frame.Token(nr, nc)] = kOpen;
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
  if (o.min_size > o.size) {
    throw ConfigError("task.min_size " + std::to_string(o.min_size) + " exceeds task.size " +
                      std::to_string(o.size));
  }
  const int64_t width = 2 * o.size + 1;
  DatasetInfo info;
  info.length = width * width;
  info.grid_width = width;
  info.vocab_size = 4;   // MazeToken
  info.num_classes = 2;  // off or on the path
  Rng rng(seed);
  std::vector<Example> data(examples);
  for (Example& example : data) {
    CellFrame frame{.n = o.size, .width = width};
    if (o.min_size > 0) {
      frame.n = o.min_size + rng.UniformInt(o.size - o.min_size + 1);
      frame.corner_row = rng.UniformInt(o.size - frame.n + 1);
      frame.corner_col = rng.UniformInt(o.size - frame.n + 1);
    }
    const int64_t n = frame.n;
    example.tokens.assign(info.length, kWall);
    CarveMaze(rng, frame, example.tokens);
    const int64_t start = rng.UniformInt(n * n);
    int64_t goal = rng.UniformInt(n * n - 1);
    if (goal >= start) ++goal;
    example.targets.assign(info.length, kIgnoreTarget);
    for (int64_t p = 0; p < info.length; ++p) {
      if (example.tokens[p] != kWall) example.targets[p] = 0;
    }
    for (int64_t p : ShortestPath(example.tokens, width, frame.Token(start), frame.Token(goal))) {
      example.targets[p] = 1;
    }
    example.tokens[frame.Token(start)] = kStart;
    example.tokens[frame.Token(goal)] = kGoal;
  }
  return std::make_unique<InMemoryDataset>(info, std::move(data));
}

MazeOptions WithTestSize(MazeOptions o, const DatasetRequest& request) {
  o.min_size = 0;  // every held-out maze has the size asked for
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
