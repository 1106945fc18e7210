// Anderson acceleration: robustness of the small least-squares solve, the
// safeguard, the fixed-budget contract, and an allocation-free inner loop.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <new>
#include <vector>

#include "framework/buffer_pool.h"
#include "framework/parallel.h"
#include "framework/tensor.h"
#include "solvers/fixed_point_solver.h"
#include "tests/solvers/problems.h"

// Counts every global operator new of the process, so a test can prove that
// a stretch of code allocates nothing.
namespace {
std::atomic<int64_t> g_new_calls{0};
}  // namespace

// GCC cannot tell that these replacements pair malloc with free.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t size) {
  g_new_calls.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t size) {
  g_new_calls.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace stillpoint::anderson_test {
namespace {

ForwardSolverOptions AndersonOptions() {
  ForwardSolverOptions o;
  o.type = ForwardSolverType::kAnderson;
  o.stop_mode = StopMode::kAbsolute;
  o.absolute_tolerance = 1e-10;
  o.max_iterations = 100;
  return o;
}

// f(z) = a for every sample: z0 = a is already the fixed point.
FixedPointProblem ConstantMap(int64_t batch, int64_t n, double a) {
  FixedPointProblem p;
  p.batch_size = batch;
  p.state_size = n;
  p.map = [a](const Tensor&, const std::vector<int64_t>&, Tensor* out) {
    out->Fill(a);
    return true;
  };
  return p;
}

TEST(Anderson, RepeatedIteratesDoNotFail) {
  // Every difference in the history is exactly zero: the least-squares
  // matrix is 0. Tolerance 0 keeps Anderson iterating on it.
  ForwardSolverOptions o = AndersonOptions();
  o.absolute_tolerance = 0.0;
  o.max_iterations = 12;
  for (AndersonType type : {AndersonType::kTypeII, AndersonType::kTypeI}) {
    o.anderson_type = type;
    Tensor z = Tensor::Full(Shape{2, 5}, 0.25, DType::kFloat64);
    const SolverSummary s = SolveFixedPoint(o, ConstantMap(2, 5, 0.25), &z);
    EXPECT_EQ(s.termination_type, TerminationType::kMaxIterations) << s.FullReport();
    EXPECT_EQ(s.sample_iterations, (std::vector<int>{12, 12}));
    EXPECT_FALSE(HasNonFinite(z));
    EXPECT_EQ(MaxAbsDiff(z, Tensor::Full(Shape{2, 5}, 0.25, DType::kFloat64)), 0.0);
    EXPECT_EQ(s.restarts, 0) << "a zero history is not a failure";
  }
}

TEST(Anderson, RankDeficientHistoryDoesNotFail) {
  // z = 0.5 u u^T z + b: the iterates live in a 2-dimensional space, so with
  // memory 5 the history columns become linearly dependent (and then tiny)
  // once the solve has converged; it keeps going because tolerance is 0.
  const int64_t n = 50;
  std::vector<double> u(n);
  std::vector<double> b(n);
  for (int64_t i = 0; i < n; ++i) {
    u[i] = std::cos(0.3 * i) / std::sqrt(n / 2.0);
    b[i] = std::sin(0.7 * i);
  }
  FixedPointProblem p;
  p.batch_size = 1;
  p.state_size = n;
  p.map = [u, b, n](const Tensor& z, const std::vector<int64_t>&, Tensor* out) {
    const double* zd = z.data<double>();
    double dot = 0.0;
    for (int64_t i = 0; i < n; ++i) dot += u[i] * zd[i];
    double* o = out->data<double>();
    for (int64_t i = 0; i < n; ++i) o[i] = 0.5 * u[i] * dot + b[i];
    return true;
  };
  ForwardSolverOptions o = AndersonOptions();
  o.absolute_tolerance = 0.0;
  o.max_iterations = 30;
  for (AndersonType type : {AndersonType::kTypeII, AndersonType::kTypeI}) {
    o.anderson_type = type;
    Tensor z = Tensor::Zeros(Shape{1, n}, DType::kFloat64);
    const SolverSummary s = SolveFixedPoint(o, p, &z);
    EXPECT_EQ(s.termination_type, TerminationType::kMaxIterations) << s.FullReport();
    EXPECT_EQ(s.sample_iterations[0], 30);
    EXPECT_FALSE(HasNonFinite(z));
    EXPECT_LT(s.sample_abs_residual[0], 1e-12) << s.FullReport();
  }
}

// A scalar map that makes plain Anderson overshoot: f(z) = z - atan(z) (+ a
// steep wall for z < -2). Far from the fixed point 0, atan is flat, so the
// secant step of Anderson leaps far past 0, into the wall, where the
// residual is a million times larger.
FixedPointProblem OvershootMap() {
  FixedPointProblem p;
  p.batch_size = 1;
  p.state_size = 1;
  p.map = [](const Tensor& z, const std::vector<int64_t>&, Tensor* out) {
    const double x = z.at(0);
    const double wall = x < -2.0 ? 100.0 * (x + 2.0) * (x + 2.0) : 0.0;
    out->set(0, x - std::atan(x) + wall);
    return true;
  };
  return p;
}

TEST(Anderson, SafeguardFiresWhereAndersonOvershoots) {
  ForwardSolverOptions o = AndersonOptions();  // default safeguard factor 10
  Tensor z = Tensor::Full(Shape{1, 1}, 10.0, DType::kFloat64);
  const SolverSummary guarded = SolveFixedPoint(o, OvershootMap(), &z);
  EXPECT_GT(guarded.rejected_steps, 0) << guarded.FullReport();
  EXPECT_EQ(guarded.restarts, guarded.rejected_steps);
  EXPECT_TRUE(guarded.IsUsable()) << guarded.FullReport();
  EXPECT_NEAR(z.at(0), 0.0, 1e-9);
  EXPECT_NE(guarded.message.find("safeguard"), std::string::npos) << guarded.message;
  // Every accepted iterate kept the residual within the factor of the last.
  for (size_t k = 1; k < guarded.abs_residual_trace.size(); ++k) {
    EXPECT_LE(guarded.abs_residual_trace[k], 10.0 * guarded.abs_residual_trace[k - 1]);
  }

  // Without the factor test Anderson takes the leap into the wall.
  o.anderson_safeguard_factor = 0.0;
  Tensor plain_z = Tensor::Full(Shape{1, 1}, 10.0, DType::kFloat64);
  const SolverSummary plain = SolveFixedPoint(o, OvershootMap(), &plain_z);
  EXPECT_EQ(plain.rejected_steps, 0);
  EXPECT_EQ(plain.termination_type, TerminationType::kDiverged) << plain.FullReport();
  EXPECT_GT(plain.abs_residual_trace.back(), 1e3 * plain.abs_residual_trace.front());
  // The state returned is still the best iterate, not the leap.
  EXPECT_LT(plain.sample_abs_residual[0], 2.0);
}

TEST(Anderson, FixedBudgetRunsExactlyThatManyIterations) {
  // The W1 configuration: m = 5, lambda = 1e-4, beta = 1, tolerance 0, 16 iterations.
  ForwardSolverOptions o;
  o.type = ForwardSolverType::kAnderson;
  o.anderson_memory = 5;
  o.anderson_lambda = 1e-4;
  o.anderson_beta = 1.0;
  o.stop_mode = StopMode::kRelative;
  o.relative_tolerance = 0.0;
  o.max_iterations = 16;
  ASSERT_TRUE(o.FixedBudget());
  const zoo::ZooProblem p = zoo::MakeTanhProblem();
  Tensor z = p.InitialPoint().To(DType::kFloat32);
  const SolverSummary s = SolveFixedPoint(o, p.problem, &z);
  EXPECT_EQ(s.termination_type, TerminationType::kMaxIterations);
  EXPECT_EQ(s.iterations, 16);
  for (int it : s.sample_iterations) EXPECT_EQ(it, 16);
  for (TerminationType t : s.sample_termination) EXPECT_EQ(t, TerminationType::kMaxIterations);
  EXPECT_EQ(s.abs_residual_trace.size(), 17u);  // z0 and 16 iterates
  EXPECT_EQ(s.function_evaluations, p.problem.batch_size * 17 + s.rejected_steps);
  EXPECT_NE(s.message.find("fixed budget"), std::string::npos) << s.message;
  EXPECT_FALSE(s.IsUsable());  // honest: nothing was tested against a tolerance
  // ... and yet the budget was well spent.
  EXPECT_LT(s.MaxRelResidual(), 1e-4) << s.FullReport();
}

TEST(Anderson, AcceleratesPicard) {
  const int64_t n = 100;
  const FixedPointProblem p = zoo::MakeSlowTridiagonalMap(n, 2, 0.1);
  ForwardSolverOptions o = AndersonOptions();
  o.absolute_tolerance = 1e-8;
  o.max_iterations = 2000;
  Tensor za = Tensor::Zeros(Shape{2, n}, DType::kFloat64);
  const SolverSummary anderson = SolveFixedPoint(o, p, &za);
  o.type = ForwardSolverType::kPicard;
  Tensor zp = Tensor::Zeros(Shape{2, n}, DType::kFloat64);
  const SolverSummary picard = SolveFixedPoint(o, p, &zp);
  ASSERT_TRUE(anderson.IsUsable()) << anderson.FullReport();
  ASSERT_TRUE(picard.IsUsable()) << picard.BriefReport();
  EXPECT_LT(2 * anderson.function_evaluations, picard.function_evaluations)
      << anderson.BriefReport() << "\n"
      << picard.BriefReport();
  EXPECT_LE(MaxAbsDiff(za, zp), 1e-6);
}

TEST(Anderson, ReportsMemoryGivenAndUsed) {
  // Hopfield retrieval at large beta converges in a few iterations, long
  // before a history of 20 fills.
  const zoo::ZooProblem p = zoo::MakeHopfieldProblem();
  ForwardSolverOptions o = AndersonOptions();
  o.anderson_memory = 20;
  Tensor z = p.InitialPoint();
  const SolverSummary s = SolveFixedPoint(o, p.problem, &z);
  ASSERT_TRUE(s.IsUsable());
  // History: dZ and dG, 20 columns of n = 16 doubles for 4 samples, at least.
  EXPECT_GE(s.history_bytes, 2 * 20 * 4 * 16 * 8);
  bool found = false;
  for (const OptionUsage& usage : s.option_usage) {
    if (usage.name != "anderson_memory") continue;
    found = true;
    EXPECT_EQ(usage.requested, "20");
    EXPECT_LT(std::stoi(usage.used), 20);
    EXPECT_GE(std::stoi(usage.used), 1);
  }
  EXPECT_TRUE(found) << s.FullReport();
}

TEST(Anderson, ResultsDoNotDependOnTheThreadCount) {
  const zoo::ZooProblem p = zoo::MakeTanhProblem();
  const ForwardSolverOptions o = AndersonOptions();
  Tensor one = p.InitialPoint();
  Tensor two = p.InitialPoint();
  SolverSummary s1;
  SolverSummary s2;
  {
    ScopedNumThreads threads(1);
    s1 = SolveFixedPoint(o, p.problem, &one);
  }
  {
    ScopedNumThreads threads(2);
    s2 = SolveFixedPoint(o, p.problem, &two);
  }
  EXPECT_EQ(MaxAbsDiff(one, two), 0.0);
  EXPECT_EQ(s1.sample_iterations, s2.sample_iterations);
  EXPECT_EQ(s1.abs_residual_trace, s2.abs_residual_trace);
}

// f(z) = 0.5 tanh(W z) + c_b, written with plain loops so that the map itself
// allocates nothing. Sample 0 starts at its fixed point, so every step runs
// on a partial batch (the gather path).
struct NoAllocMap {
  int64_t n = 48;
  std::vector<double> w;
  std::vector<double> c;
  bool operator()(const Tensor& z, const std::vector<int64_t>& ids, Tensor* out) const {
    const float* zd = z.data<float>();
    float* o = out->data<float>();
    for (size_t r = 0; r < ids.size(); ++r) {
      for (int64_t i = 0; i < n; ++i) {
        double acc = 0.0;
        for (int64_t j = 0; j < n; ++j) acc += w[i * n + j] * zd[r * n + j];
        o[r * n + i] = static_cast<float>(0.5 * std::tanh(acc) + c[ids[r] * n + i]);
      }
    }
    return true;
  }
};

TEST(Anderson, InnerLoopAllocatesNothingAfterTheFirstIteration) {
  const int64_t batch = 6;
  auto map = std::make_shared<NoAllocMap>();
  const int64_t n = map->n;
  map->w.resize(n * n);
  map->c.resize(batch * n);
  for (int64_t i = 0; i < n * n; ++i) map->w[i] = std::sin(1.3 * i) / std::sqrt(double(n));
  // c = 0 for sample 0 makes z = 0 its exact fixed point.
  for (int64_t i = n; i < batch * n; ++i) map->c[i] = std::cos(0.7 * i);
  FixedPointProblem p;
  p.batch_size = batch;
  p.state_size = n;
  p.map = [map](const Tensor& z, const std::vector<int64_t>& ids, Tensor* out) {
    return (*map)(z, ids, out);
  };
  const Tensor z0 = Tensor::Zeros(Shape{batch, n}, DType::kFloat32);
  for (AndersonType type : {AndersonType::kTypeII, AndersonType::kTypeI}) {
    SCOPED_TRACE(ToString(type));
    ScopedNumThreads threads(1);
    ForwardSolverOptions o = AndersonOptions();
    o.anderson_type = type;
    o.absolute_tolerance = 1e-7;
    o.anderson_safeguard_factor = 1.0001;  // exercise the rejection path too
    o.stagnation_window = 0;
    o.max_iterations = 12;
    auto solver = FixedPointSolver::Create(o);
    solver->Init(p, z0);
    ASSERT_FALSE(solver->sample_active(0));
    ASSERT_TRUE(solver->Step());  // the first iteration may allocate
    ResetBufferPoolStats();
    const int64_t news_before = g_new_calls.load();
    int steps = 0;
    while (steps < 8 && solver->Step()) ++steps;
    const int64_t news = g_new_calls.load() - news_before;
    const BufferPoolStats stats = GetBufferPoolStats();
    EXPECT_GE(steps, 3);
    EXPECT_EQ(news, 0) << "operator new calls in " << steps << " steps";
    EXPECT_EQ(stats.system_allocations, 0);
    EXPECT_EQ(stats.reuses, 0) << "tensors were created in the inner loop";
    Tensor z;
    SolverSummary s;
    solver->Finish(&z, &s);
    EXPECT_FALSE(HasNonFinite(z));
  }
}

}  // namespace
}  // namespace stillpoint::anderson_test
