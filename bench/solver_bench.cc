// Forward solver effort on the problem zoo (tests/solvers/problems.h) and on
// a randomly initialised W1 DEQ cell (bench/SPEC.md): for every problem and
// solver, the map evaluations per sample and the wall time needed to bring
// every sample to a relative residual of 1e-4 and of 1e-6.
//
//   solver_bench [--repeats N] [--threads N] [--skip-zoo] [--skip-w1]
//
// Prints a Markdown table (bench/RESULTS.md keeps a copy). Evaluations are
// per sample: map rows / B, plus Jacobian-vector product rows / B after a
// "+" where the solver used problem.jvp, plus energy rows / B after an "E"
// for the L-BFGS backend. Time is the median over the repeats of one whole
// batched solve. "-" marks a solver that did not reach the tolerance (its
// termination is shown) or does not apply (L-BFGS needs an energy).
//
// The W1 rows solve f(z; u) of one DEQCell (d 64, 4 heads, hidden 128) on
// B = 32 sequences of T = 32 tokens, z0 = 0, u ~ N(0, 1) as the embedding
// tables are initialised; n = T d = 2048 per sample. They run in float32 (as
// the cell is trained) and in float64. The Ceres trust-region backends
// assemble a dense n x n Jacobian per sample and are left out there, as is
// L-BFGS (the cell has no energy).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "framework/autograd.h"
#include "framework/ops.h"
#include "framework/parallel.h"
#include "framework/random.h"
#include "layers/deq_cell.h"
#include "solvers/fixed_point_solver.h"
#include "solvers/implicit_solve.h"
#include "tests/solvers/problems.h"

namespace stillpoint {
namespace {

struct SolverConfig {
  std::string name;
  ForwardSolverOptions options;
};

std::vector<SolverConfig> Solvers() {
  std::vector<SolverConfig> solvers;
  auto add = [&](const std::string& name, ForwardSolverType type) -> ForwardSolverOptions& {
    ForwardSolverOptions o;
    o.type = type;
    o.max_iterations = 2000;
    o.stagnation_window = 50;
    solvers.push_back({name, o});
    return solvers.back().options;
  };
  add("picard", ForwardSolverType::kPicard);
  add("anderson m5", ForwardSolverType::kAnderson);
  add("anderson m5 type I", ForwardSolverType::kAnderson).anderson_type = AndersonType::kTypeI;
  add("broyden good", ForwardSolverType::kBroyden);
  add("broyden bad", ForwardSolverType::kBroyden).broyden_variant = BroydenVariant::kBad;
  add("broyden + line search", ForwardSolverType::kBroyden).broyden_line_search = true;
  add("newton-krylov", ForwardSolverType::kNewtonKrylov);
  add("ceres lbfgs", ForwardSolverType::kCeresLbfgs);
  add("ceres levenberg-marquardt", ForwardSolverType::kCeresTrustRegion);
  add("ceres dogleg", ForwardSolverType::kCeresTrustRegion).ceres_trust_region_strategy =
      CeresTrustRegionStrategy::kDogleg;
  return solvers;
}

struct Measurement {
  bool ran = false;
  SolverSummary summary;
  double median_seconds = 0.0;
};

// One row group of the table: a problem and how a solve of it is run.
struct BenchProblem {
  std::string label;  // "name (B x n)"
  int64_t batch_size = 0;
  bool has_energy = false;
  // Whether the dense-Jacobian Ceres trust-region backends are run.
  bool dense_jacobian_ok = true;
  // One whole batched solve from the problem's starting point.
  std::function<SolverSummary(const ForwardSolverOptions&)> solve;
};

std::string Label(const std::string& name, const FixedPointProblem& problem) {
  char label[96];
  std::snprintf(label, sizeof(label), "%s (%lld x %lld)", name.c_str(),
                static_cast<long long>(problem.batch_size),
                static_cast<long long>(problem.state_size));
  return label;
}

BenchProblem FromZoo(const zoo::ZooProblem& z) {
  BenchProblem p;
  p.label = Label(z.name, z.problem);
  p.batch_size = z.problem.batch_size;
  p.has_energy = static_cast<bool>(z.problem.energy);
  p.solve = [z](const ForwardSolverOptions& options) {
    Tensor state = z.InitialPoint();
    return SolveFixedPoint(options, z.problem, &state);
  };
  return p;
}

// bench/SPEC.md W1 shapes.
constexpr int64_t kBatch = 32, kLength = 32, kDim = 64;

// f(z; u) of a freshly initialised W1 cell on [B, T * d] rows.
BenchProblem MakeW1CellProblem(DType dtype) {
  CellOptions options;
  options.dim = kDim;
  options.heads = 4;
  options.hidden = 128;
  options.dtype = dtype;
  Rng rng(2024);
  auto cell = std::make_shared<DEQCell>(options, rng);
  const Tensor injection = RandomNormal(Shape{kBatch, kLength, kDim}, 0.0, 1.0, dtype, rng);

  // Solved as the Implicit layer solves it (SolveImplicit with the tape off):
  // the same map, and Jacobian-vector products by the double-VJP trick.
  const CellFn f = [cell, injection](const Var& z, const std::vector<int64_t>& ids) {
    return cell->Forward(z, gather(Var(injection), 0, ids), ids);
  };
  BenchProblem p;
  FixedPointProblem shape;  // for the label only
  shape.batch_size = kBatch;
  shape.state_size = kLength * kDim;
  p.label = Label(dtype == DType::kFloat32 ? "w1_cell float32" : "w1_cell float64", shape);
  p.batch_size = kBatch;
  p.dense_jacobian_ok = false;
  p.solve = [f, dtype](const ForwardSolverOptions& forward) {
    NoGrad tape_off;
    ImplicitOptions options;
    options.forward = forward;
    const Tensor z0 = Tensor::Zeros(Shape{kBatch, kLength, kDim}, dtype);
    return SolveImplicit(f, z0, options).forward;
  };
  return p;
}

Measurement Measure(const BenchProblem& p,
                    ForwardSolverOptions options,
                    double tolerance,
                    int repeats) {
  Measurement m;
  if (options.type == ForwardSolverType::kCeresLbfgs && !p.has_energy) return m;
  if (options.type == ForwardSolverType::kCeresTrustRegion && !p.dense_jacobian_ok) return m;
  options.stop_mode = StopMode::kRelative;
  options.relative_tolerance = tolerance;
  std::vector<double> seconds;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    m.summary = p.solve(options);
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  m.median_seconds = seconds[seconds.size() / 2];
  m.ran = true;
  return m;
}

std::string Effort(const Measurement& m, int64_t batch) {
  if (!m.ran) return "n/a";
  char buffer[128];
  if (!m.summary.IsUsable()) {
    std::snprintf(buffer, sizeof(buffer), "- (%s)", ToString(m.summary.termination_type));
    return buffer;
  }
  std::string text;
  std::snprintf(buffer, sizeof(buffer), "%.1f",
                static_cast<double>(m.summary.function_evaluations) / batch);
  text = buffer;
  if (m.summary.jvp_evaluations > 0) {
    std::snprintf(buffer, sizeof(buffer), " + %.1f",
                  static_cast<double>(m.summary.jvp_evaluations) / batch);
    text += buffer;
  }
  if (m.summary.energy_evaluations > 0) {
    std::snprintf(buffer, sizeof(buffer), " E%.1f",
                  static_cast<double>(m.summary.energy_evaluations) / batch);
    text += buffer;
  }
  return text;
}

std::string Time(const Measurement& m) {
  if (!m.ran || !m.summary.IsUsable()) return "";
  char buffer[64];
  const double s = m.median_seconds;
  if (s < 1e-3) {
    std::snprintf(buffer, sizeof(buffer), "%.1f us", s * 1e6);
  } else {
    std::snprintf(buffer, sizeof(buffer), "%.2f ms", s * 1e3);
  }
  return buffer;
}

int Run(int repeats, bool zoo_rows, bool w1_rows) {
  std::vector<BenchProblem> problems;
  if (zoo_rows) {
    for (const zoo::ZooProblem& z : zoo::ConvergentZoo()) {
      problems.push_back(FromZoo(z));
    }
  }
  if (w1_rows) {
    problems.push_back(MakeW1CellProblem(DType::kFloat32));
    problems.push_back(MakeW1CellProblem(DType::kFloat64));
  }
  const std::vector<SolverConfig> solvers = Solvers();
  std::printf("Forward solvers, %d thread(s), median of %d; zoo problems in float64.\n",
              NumThreads(), repeats);
  std::printf(
      "Evaluations per sample to reach a relative residual of 1e-4 / 1e-6 "
      "(map rows [+ jvp rows] [E energy rows]).\n\n");
  std::printf("| problem (B x n) | solver | evals 1e-4 | time 1e-4 | evals 1e-6 | time 1e-6 |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (const BenchProblem& p : problems) {
    for (const SolverConfig& solver : solvers) {
      const Measurement loose = Measure(p, solver.options, 1e-4, repeats);
      const Measurement tight = Measure(p, solver.options, 1e-6, repeats);
      std::printf("| %s | %s | %s | %s | %s | %s |\n", p.label.c_str(), solver.name.c_str(),
                  Effort(loose, p.batch_size).c_str(), Time(loose).c_str(),
                  Effort(tight, p.batch_size).c_str(), Time(tight).c_str());
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace stillpoint

int main(int argc, char** argv) {
  int repeats = 5;
  int threads = 1;
  bool zoo_rows = true, w1_rows = true;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--repeats") == 0 && i + 1 < argc) {
      repeats = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      threads = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--skip-zoo") == 0) {
      zoo_rows = false;
    } else if (std::strcmp(argv[i], "--skip-w1") == 0) {
      w1_rows = false;
    } else {
      std::fprintf(stderr, "usage: %s [--repeats N] [--threads N] [--skip-zoo] [--skip-w1]\n",
                   argv[0]);
      return 2;
    }
  }
  stillpoint::SetNumThreads(threads);
  return stillpoint::Run(repeats, zoo_rows, w1_rows);
}
