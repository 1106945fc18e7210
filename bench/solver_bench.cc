// Forward solver effort on the problem zoo (tests/solvers/problems.h): for
// every problem and solver, the map evaluations per sample and the wall time
// needed to bring every sample to a relative residual of 1e-4 and of 1e-6.
//
//   solver_bench [--repeats N] [--threads N]
//
// Prints a Markdown table (bench/RESULTS.md keeps a copy). Evaluations are
// per sample: map rows / B, plus Jacobian-vector product rows / B after a
// "+" where the solver used problem.jvp, plus energy rows / B after an "E"
// for the L-BFGS backend. Time is the median over the repeats of one whole
// batched solve. "-" marks a solver that did not reach the tolerance (its
// termination is shown) or does not apply (L-BFGS needs an energy).
//
// The W1 DEQ cell (bench/SPEC.md) joins this table once layers/ provides it.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "framework/parallel.h"
#include "solvers/fixed_point_solver.h"
#include "tests/solvers/problems.h"
// The zoo's definitions: the tests get them from the stillpoint_solvers_testing
// library, which is only built with the tests, so this program compiles them
// itself (it is a single translation unit).
#include "tests/solvers/problems.cc"  // NOLINT(build/include)

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

Measurement Measure(const zoo::ZooProblem& p,
                    ForwardSolverOptions options,
                    double tolerance,
                    int repeats) {
  Measurement m;
  if (options.type == ForwardSolverType::kCeresLbfgs && !p.problem.energy) return m;
  options.stop_mode = StopMode::kRelative;
  options.relative_tolerance = tolerance;
  std::vector<double> seconds;
  for (int r = 0; r < repeats; ++r) {
    Tensor z = p.InitialPoint();
    const auto start = std::chrono::steady_clock::now();
    m.summary = SolveFixedPoint(options, p.problem, &z);
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

int Run(int repeats) {
  const std::vector<zoo::ZooProblem> problems = zoo::ConvergentZoo();
  const std::vector<SolverConfig> solvers = Solvers();
  std::printf("Forward solvers on the problem zoo, float64, %d thread(s), median of %d.\n",
              NumThreads(), repeats);
  std::printf(
      "Evaluations per sample to reach a relative residual of 1e-4 / 1e-6 "
      "(map rows [+ jvp rows] [E energy rows]).\n\n");
  std::printf("| problem (B x n) | solver | evals 1e-4 | time 1e-4 | evals 1e-6 | time 1e-6 |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (const zoo::ZooProblem& p : problems) {
    char label[96];
    std::snprintf(label, sizeof(label), "%s (%lld x %lld)", p.name.c_str(),
                  static_cast<long long>(p.problem.batch_size),
                  static_cast<long long>(p.problem.state_size));
    for (const SolverConfig& solver : solvers) {
      const Measurement loose = Measure(p, solver.options, 1e-4, repeats);
      const Measurement tight = Measure(p, solver.options, 1e-6, repeats);
      std::printf("| %s | %s | %s | %s | %s | %s |\n", label, solver.name.c_str(),
                  Effort(loose, p.problem.batch_size).c_str(), Time(loose).c_str(),
                  Effort(tight, p.problem.batch_size).c_str(), Time(tight).c_str());
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
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--repeats") == 0 && i + 1 < argc) {
      repeats = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      threads = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--repeats N] [--threads N]\n", argv[0]);
      return 2;
    }
  }
  stillpoint::SetNumThreads(threads);
  return stillpoint::Run(repeats);
}
