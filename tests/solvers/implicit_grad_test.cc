// Gradients through SolveImplicit: for every forward solver and every
// backward mode, against central finite differences of the converged solve,
// the closed form, and the explicit unrolled reference; memory independence
// of the forward iterations; graph semantics of the implicit node.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "framework/autograd.h"
#include "framework/buffer_pool.h"
#include "framework/ops.h"
#include "framework/random.h"
#include "solvers/implicit_solve.h"
#include "tests/solvers/implicit_problems.h"

namespace stillpoint::implicit_grad_test {
namespace {

using implicit_test::AffineProblem;
using implicit_test::AffineSolution;
using implicit_test::AnalyticGradients;
using implicit_test::Cosine;
using implicit_test::HopfieldProblem;
using implicit_test::ImplicitProblem;
using implicit_test::NumericGradients;
using implicit_test::ProbeLoss;
using implicit_test::RelativeError;
using implicit_test::ScaledEnergyCell;
using implicit_test::TanhProblem;
using implicit_test::TightForward;

// Exact modes must match finite differences to this relative error.
constexpr double kExactTolerance = 1e-6;

ImplicitProblem MakeProblem(const std::string& name) {
  if (name == "affine") return AffineProblem(2, 4, 3, false, 11);
  if (name == "affine_symmetric") return AffineProblem(2, 4, 3, true, 12);
  if (name == "tanh") return TanhProblem(2, 4, 3, 13);
  return HopfieldProblem(2, 4, 3, 2.0, 14);
}

Tensor Probe(const ImplicitProblem& p, uint64_t seed = 99) {
  Rng rng(seed);
  return RandomNormal(p.z0.shape(), 0.0, 1.0, DType::kFloat64, rng);
}

BackwardOptions Ift(AdjointSolverType solver) {
  BackwardOptions options;
  options.mode = BackwardMode::kIft;
  options.solver = solver;
  options.tolerance = 1e-12;
  options.max_iterations = 200;
  options.neumann_terms = 200;
  return options;
}

// ------------------------------------------- every forward x every backward

class ImplicitGradTest
    : public ::testing::TestWithParam<std::tuple<std::string, ForwardSolverType>> {};

TEST_P(ImplicitGradTest, EveryBackwardModeAgainstFiniteDifferences) {
  const auto [problem_name, forward_type] = GetParam();
  ImplicitProblem p = MakeProblem(problem_name);
  ASSERT_TRUE(forward_type != ForwardSolverType::kCeresLbfgs || p.energy);
  const Tensor probe = Probe(p);
  ForwardSolverOptions forward = TightForward(forward_type);
  ForwardSolverOptions reference = forward;
  if (forward_type == ForwardSolverType::kCeresLbfgs) {
    // Ceres' line search ends between about 1e-10 and 2e-8 (where the
    // energy's rounding error stops it; the floor moves with the build's
    // floating-point contraction), too coarse for differences with step
    // 1e-5: polish its result with Anderson for the reference solve, and
    // differentiate at the plain Ceres solution.
    forward.absolute_tolerance = 5e-8;
    reference.fallback_chain = {ForwardSolverType::kAnderson};
    reference.fallback_residual_threshold = 1e-13;
  }
  const std::vector<Tensor> numeric = NumericGradients(p, p.cell, reference, probe);

  ImplicitOptions options;
  options.forward = forward;
  std::vector<Tensor> ift_gradient;
  for (AdjointSolverType solver : AllAdjointSolverTypes()) {
    const bool needs_symmetry =
        solver == AdjointSolverType::kConjugateGradient || solver == AdjointSolverType::kMinres;
    if (needs_symmetry && !p.symmetric) continue;
    options.backward = Ift(solver);
    ImplicitResult result;
    const std::vector<Tensor> analytic = AnalyticGradients(p, p.cell, options, probe, &result);
    ASSERT_TRUE(result.forward.IsUsable()) << result.forward.FullReport();
    ASSERT_NE(result.backward, nullptr);
    EXPECT_TRUE(result.backward->IsUsable()) << result.backward->FullReport();
    EXPECT_LT(RelativeError(analytic, numeric), kExactTolerance)
        << p.name << " / " << ToString(forward_type) << " / ift " << ToString(solver);
    if (solver == AdjointSolverType::kDense) ift_gradient = analytic;
  }
  ASSERT_FALSE(ift_gradient.empty());

  // unrolled(k) at large k is exact (contraction 0.6: 0.6^80 ~ 1e-18).
  options.backward = BackwardOptions();
  options.backward.mode = BackwardMode::kUnrolled;
  options.backward.unrolled_steps = 80;
  const std::vector<Tensor> unrolled = AnalyticGradients(p, p.cell, options, probe);
  EXPECT_LT(RelativeError(unrolled, numeric), kExactTolerance) << p.name << " unrolled";

  // jfb and phantom are approximations that still point the right way.
  options.backward = BackwardOptions();
  options.backward.mode = BackwardMode::kJfb;
  const std::vector<Tensor> jfb = AnalyticGradients(p, p.cell, options, probe);
  EXPECT_GT(Cosine(jfb, ift_gradient), 0.0) << p.name << " jfb";
  EXPECT_GT(RelativeError(jfb, ift_gradient), 1e-4) << "jfb should not be exact here";

  options.backward.mode = BackwardMode::kPhantom;
  options.backward.phantom_steps = 5;
  options.backward.phantom_tau = 0.5;
  const std::vector<Tensor> phantom = AnalyticGradients(p, p.cell, options, probe);
  EXPECT_GT(Cosine(phantom, ift_gradient), 0.0) << p.name << " phantom";
}

std::string ParamName(
    const ::testing::TestParamInfo<std::tuple<std::string, ForwardSolverType>>& info) {
  return std::get<0>(info.param) + "_" + ToString(std::get<1>(info.param));
}

// Every forward solver on every problem, except ceres_lbfgs on the maps that
// have no energy (it minimises one).
std::vector<std::tuple<std::string, ForwardSolverType>> AllCombinations() {
  std::vector<std::tuple<std::string, ForwardSolverType>> out;
  for (const std::string problem : {"affine", "affine_symmetric", "tanh", "hopfield"}) {
    const bool has_energy = problem == "affine_symmetric" || problem == "hopfield";
    for (ForwardSolverType type : AllForwardSolverTypes()) {
      if (type == ForwardSolverType::kCeresLbfgs && !has_energy) continue;
      out.emplace_back(problem, type);
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(AllForwardSolvers,
                         ImplicitGradTest,
                         ::testing::ValuesIn(AllCombinations()),
                         ParamName);

// ------------------------------------------------------ closed-form checks

TEST(ImplicitGrad, AffineMatchesClosedForm) {
  // z* = (I - W)^{-1} c per row, so dL/dc_b = (I - W)^{-T} p_b and
  // dL/db = sum_b (I - W)^{-T} p_b.
  ImplicitProblem p = AffineProblem(3, 5, 2, false, 21);
  const Tensor probe = Probe(p);
  ImplicitOptions options;
  options.forward = TightForward(ForwardSolverType::kAnderson);
  options.backward = Ift(AdjointSolverType::kGmres);
  ImplicitResult result;
  const std::vector<Tensor> analytic = AnalyticGradients(p, p.cell, options, probe, &result);
  EXPECT_LT(MaxAbsDiff(result.z_star.value(), AffineSolution(p)), 1e-10);

  const Tensor& w = p.params[0].value();
  const int64_t n = 5;
  Eigen::MatrixXd iwt = Eigen::MatrixXd::Identity(n, n);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) iwt(i, j) -= w.at(j * n + i);
  }
  Eigen::VectorXd expected = Eigen::VectorXd::Zero(n);
  for (int64_t b = 0; b < 3; ++b) {
    Eigen::VectorXd pb(n);
    for (int64_t i = 0; i < n; ++i) pb(i) = probe.at(b * n + i);
    expected += iwt.partialPivLu().solve(pb);
  }
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(analytic[2].at(i), expected(i), 1e-9) << i;
}

// On f(z) = W z + c_b (c_b = U x_b + b) every backward mode has a closed
// form for the injection's gradient, with p_b = dL/dz*_b:
//   ift             dL/dc_b = (I - W)^{-T} p_b
//   jfb             dL/dc_b = p_b                      (w = g: J taken as 0)
//   phantom(k, tau) dL/dc_b = tau sum_{j<k} (M^T)^j p_b, M = (1 - tau) I + tau W
//                   (k damped steps z <- (1 - tau) z + tau f(z) from z*)
// and dL/db = sum_b dL/dc_b, dL/dx_b = U^T dL/dc_b. These are the gradients
// the modes are defined to give, checked exactly, not only their direction.
TEST(ImplicitGrad, JfbAndPhantomMatchTheirClosedFormsOnAnAffineMap) {
  const int64_t batch = 3, n = 5, d = 2;
  ImplicitProblem p = AffineProblem(batch, n, d, false, 25);
  const Tensor probe = Probe(p);
  const Tensor& w = p.params[0].value();
  const Tensor& u = p.params[1].value();
  Eigen::MatrixXd wm(n, n), um(n, d);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) wm(i, j) = w.at(i * n + j);
    for (int64_t j = 0; j < d; ++j) um(i, j) = u.at(i * d + j);
  }
  // dL/dc_b for every sample from a per-sample linear map of p_b.
  auto expected = [&](const Eigen::MatrixXd& map, std::vector<double>* db,
                      std::vector<double>* dx) {
    db->assign(n, 0.0);
    dx->assign(batch * d, 0.0);
    for (int64_t b = 0; b < batch; ++b) {
      Eigen::VectorXd pb(n);
      for (int64_t i = 0; i < n; ++i) pb(i) = probe.at(b * n + i);
      const Eigen::VectorXd dc = map * pb;
      const Eigen::VectorXd dxb = um.transpose() * dc;
      for (int64_t i = 0; i < n; ++i) (*db)[i] += dc(i);
      for (int64_t j = 0; j < d; ++j) (*dx)[b * d + j] = dxb(j);
    }
  };
  auto check = [&](const BackwardOptions& backward, const Eigen::MatrixXd& map,
                   const std::string& what) {
    ImplicitOptions options;
    options.forward = TightForward(ForwardSolverType::kAnderson);
    options.backward = backward;
    const std::vector<Tensor> analytic = AnalyticGradients(p, p.cell, options, probe);
    std::vector<double> db, dx;
    expected(map, &db, &dx);
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_NEAR(analytic[2].at(i), db[i], 1e-10 * (1.0 + std::abs(db[i]))) << what << " db " << i;
    }
    for (int64_t i = 0; i < batch * d; ++i) {
      EXPECT_NEAR(analytic[3].at(i), dx[i], 1e-10 * (1.0 + std::abs(dx[i]))) << what << " dx " << i;
    }
  };
  const Eigen::MatrixXd identity = Eigen::MatrixXd::Identity(n, n);
  check(Ift(AdjointSolverType::kDense), (identity - wm).transpose().partialPivLu().inverse(),
        "ift");
  BackwardOptions jfb;
  jfb.mode = BackwardMode::kJfb;
  check(jfb, identity, "jfb");
  for (double tau : {0.5, 1.0}) {
    for (int steps : {1, 3, 7}) {
      BackwardOptions phantom;
      phantom.mode = BackwardMode::kPhantom;
      phantom.phantom_steps = steps;
      phantom.phantom_tau = tau;
      const Eigen::MatrixXd m = (1.0 - tau) * identity + tau * wm;
      Eigen::MatrixXd series = Eigen::MatrixXd::Zero(n, n);
      Eigen::MatrixXd power = identity;
      for (int j = 0; j < steps; ++j) {
        series += power;
        power = power * m.transpose();
      }
      check(phantom, tau * series,
            "phantom k " + std::to_string(steps) + " tau " + std::to_string(tau));
    }
  }
}

TEST(ImplicitGrad, IftMatchesUnrolledAsStepsGrow) {
  ImplicitProblem p = TanhProblem(2, 6, 3, 31, 0.9);
  const Tensor probe = Probe(p);
  ImplicitOptions options;
  options.forward = TightForward(ForwardSolverType::kAnderson);
  options.backward = Ift(AdjointSolverType::kGmres);
  const std::vector<Tensor> ift = AnalyticGradients(p, p.cell, options, probe);
  double previous = 1e300;
  for (int steps : {5, 20, 80, 200}) {
    options.backward = BackwardOptions();
    options.backward.mode = BackwardMode::kUnrolled;
    options.backward.unrolled_steps = steps;
    const double error = RelativeError(AnalyticGradients(p, p.cell, options, probe), ift);
    // Decreasing until both reach rounding level.
    EXPECT_TRUE(error < previous || error < 1e-11) << steps << " steps: " << error;
    previous = error;
  }
  EXPECT_LT(previous, 1e-8);
}

// For f_s(z) = z - s grad E(z), I - J = s Hess E: the fixed point and the
// implicit gradient do not depend on s, and CG / MINRES apply.
TEST(ImplicitGrad, EnergyGradientDoesNotDependOnStep) {
  for (const std::string name : {"affine_symmetric", "hopfield"}) {
    ImplicitProblem p = MakeProblem(name);
    const Tensor probe = Probe(p);
    std::vector<Tensor> reference;
    for (AdjointSolverType solver :
         {AdjointSolverType::kConjugateGradient, AdjointSolverType::kMinres}) {
      for (double s : {0.25, 0.5, 1.0}) {
        ImplicitOptions options;
        options.forward = TightForward(ForwardSolverType::kAnderson);
        options.backward = Ift(solver);
        ImplicitResult result;
        const std::vector<Tensor> g =
            AnalyticGradients(p, ScaledEnergyCell(p.cell, s), options, probe, &result);
        ASSERT_TRUE(result.backward->IsUsable()) << result.backward->FullReport();
        if (reference.empty()) {
          reference = g;
          continue;
        }
        EXPECT_LT(RelativeError(g, reference), 1e-9)
            << name << " " << ToString(solver) << " s = " << s;
      }
    }
  }
}

TEST(ImplicitGrad, Float32GradientMatchesFloat64) {
  ImplicitProblem p = TanhProblem(3, 8, 4, 35, 0.8);
  const Tensor probe = Probe(p);
  ImplicitOptions options;
  options.backward.solver = AdjointSolverType::kGmres;
  options.backward.tolerance = 1e-5;
  options.forward.relative_tolerance = 1e-6;
  const std::vector<Tensor> reference = AnalyticGradients(p, p.cell, options, probe);

  // The same cell in float32.
  VarList params32;
  for (const Var& param : p.params)
    params32.push_back(Var(param.value().To(DType::kFloat32), true));
  const Var w = params32[0], u = params32[1], b = params32[2], x = params32[3];
  CellFn cell32 = [w, u, b, x](const Var& z, const std::vector<int64_t>& ids) {
    return tanh(add(add(matmul(z, w, false, true), matmul(gather(x, 0, ids), u, false, true)), b));
  };
  ImplicitResult result = SolveImplicit(cell32, p.z0.To(DType::kFloat32), options);
  ASSERT_EQ(result.z_star.dtype(), DType::kFloat32);
  VarList grads = grad({ProbeLoss(result.z_star, probe.To(DType::kFloat32))}, params32);
  EXPECT_TRUE(result.backward->IsUsable()) << result.backward->FullReport();
  std::vector<Tensor> converted;
  for (const Var& g : grads) converted.push_back(g.value().To(DType::kFloat64));
  EXPECT_LT(RelativeError(converted, reference), 1e-4);
}

// ------------------------------------------------------ memory and graph

int64_t PeakBytesOfSolveAndBackward(BackwardMode mode, int iterations) {
  ImplicitProblem p = TanhProblem(4, 64, 8, 41, 0.9);
  const Tensor probe = Probe(p);
  ImplicitOptions options;
  options.forward.type = ForwardSolverType::kPicard;
  options.forward.picard_damping = 0.05;  // far from converged after 100 steps
  options.forward.max_iterations = iterations;
  options.forward.stop_mode = StopMode::kAbsolute;
  options.forward.absolute_tolerance = 0.0;  // a fixed budget
  options.backward.mode = mode;
  options.backward.unrolled_steps = iterations;
  ReleaseCachedBuffers();
  ResetBufferPoolStats();
  const int64_t base = GetBufferPoolStats().bytes_in_use;
  {
    ImplicitResult result = SolveImplicit(p.cell, p.z0, options);
    if (mode != BackwardMode::kUnrolled) {
      EXPECT_EQ(result.forward.iterations, iterations);
    }
    VarList grads = grad({ProbeLoss(result.z_star, probe)}, p.params);
    EXPECT_TRUE(grads[0].defined());
  }
  return GetBufferPoolStats().peak_bytes_in_use - base;
}

TEST(ImplicitGrad, MemoryDoesNotGrowWithForwardIterations) {
  const int64_t peak_10 = PeakBytesOfSolveAndBackward(BackwardMode::kIft, 10);
  const int64_t peak_100 = PeakBytesOfSolveAndBackward(BackwardMode::kIft, 100);
  EXPECT_GT(peak_10, 0);
  EXPECT_LE(std::abs(static_cast<double>(peak_100 - peak_10)), 0.03 * peak_10)
      << "peak bytes: 10 iterations " << peak_10 << ", 100 iterations " << peak_100;
  // The test can fail: recording the iterations (unrolled) grows memory.
  const int64_t unrolled_10 = PeakBytesOfSolveAndBackward(BackwardMode::kUnrolled, 10);
  const int64_t unrolled_100 = PeakBytesOfSolveAndBackward(BackwardMode::kUnrolled, 100);
  EXPECT_GT(unrolled_100, 4 * unrolled_10);
}

TEST(ImplicitGrad, RecordsOneCellEvaluation) {
  ImplicitProblem p = TanhProblem(2, 4, 3, 51);
  ImplicitOptions options;
  ImplicitResult result = SolveImplicit(p.cell, p.z0, options);
  // One evaluation of the cell, whatever the number of forward iterations.
  Var f_once = p.cell(Var(p.z0, true), {0, 1});
  EXPECT_EQ(CountGraphNodes({result.z_star}), CountGraphNodes({f_once}) + 1);
  EXPECT_STREQ(result.z_star.op_name(), "implicit");
}

// `cell`, counting its evaluations in *calls.
CellFn CountingCell(const CellFn& cell, int* calls) {
  return [cell, calls](const Var& z, const std::vector<int64_t>& ids) {
    ++*calls;
    return cell(z, ids);
  };
}

// Exactly `iterations` steps of `type`: tolerance 0 is a fixed budget; a
// tolerance no sample meets runs the same steps without being one.
ForwardSolverOptions Steps(ForwardSolverType type,
                           StopMode mode,
                           int iterations,
                           double tolerance) {
  ForwardSolverOptions options;
  options.type = type;
  options.max_iterations = iterations;
  options.stop_mode = mode;
  options.absolute_tolerance = tolerance;
  options.relative_tolerance = tolerance;
  options.stagnation_window = 0;
  options.divergence_factor = 0;
  return options;
}

TEST(ImplicitGrad, FixedBudgetRecordsTheSolversLastEvaluation) {
  // The same 8 Anderson steps with a fixed budget (the last evaluation is
  // recorded and is the one at z*) and without (f is evaluated at z* once
  // more): one evaluation fewer, the same value and gradients bitwise.
  ImplicitProblem p = TanhProblem(3, 4, 3, 71);
  const Tensor probe = Probe(p);
  int calls[2] = {0, 0};
  std::vector<ImplicitResult> results;
  std::vector<VarList> grads;
  for (int run = 0; run < 2; ++run) {
    ImplicitOptions options;
    options.forward =
        Steps(ForwardSolverType::kAnderson, StopMode::kRelative, 8, run == 0 ? 0.0 : 1e-300);
    ASSERT_EQ(options.forward.FixedBudget(), run == 0);
    results.push_back(SolveImplicit(CountingCell(p.cell, &calls[run]), p.z0, options));
    grads.push_back(grad({ProbeLoss(results[run].z_star, probe)}, p.params));
    EXPECT_EQ(results[run].forward.iterations, 8);
  }
  EXPECT_EQ(results[0].forward.map_calls, results[1].forward.map_calls);
  EXPECT_EQ(calls[0], results[0].forward.map_calls);
  EXPECT_EQ(calls[1], results[1].forward.map_calls + 1);
  EXPECT_TRUE(BitwiseEqual(results[0].z_star.value(), results[1].z_star.value()));
  for (size_t i = 0; i < p.params.size(); ++i) {
    EXPECT_TRUE(BitwiseEqual(grads[0][i].value(), grads[1][i].value())) << p.param_names[i];
  }
  EXPECT_EQ(CountGraphNodes({results[0].z_star}), CountGraphNodes({results[1].z_star}));
}

TEST(ImplicitGrad, FixedBudgetEvaluatesAgainWhenTheSolutionIsAnEarlierIterate) {
  // Picard on f(z) = 2 z + b moves away from the fixed point -b: the
  // residual |z + b| grows, so the solver returns z0 = 0, not its last
  // iterate, and the recorded last evaluation must not stand for f(z*).
  Var b(Tensor::FromVector(Shape{1, 2}, {0.5, -0.25}, DType::kFloat64), true);
  const CellFn away = [b](const Var& z, const std::vector<int64_t>&) {
    return add(mul_scalar(z, 2.0), b);
  };
  int calls = 0;
  ImplicitOptions options;
  options.forward = Steps(ForwardSolverType::kPicard, StopMode::kAbsolute, 5, 0.0);
  options.backward.mode = BackwardMode::kJfb;
  const ImplicitResult result = SolveImplicit(CountingCell(away, &calls),
                                              Tensor::Zeros(Shape{1, 2}, DType::kFloat64), options);
  EXPECT_EQ(calls, result.forward.map_calls + 1);
  EXPECT_TRUE(BitwiseEqual(result.z_star.value(), b.value()));  // f(0) = b
  // Jacobian-free: dL/db = dL/dz* for L = <z*, probe>.
  const Tensor probe = Tensor::FromVector(Shape{1, 2}, {0.3, 0.7}, DType::kFloat64);
  const VarList db = grad({ProbeLoss(result.z_star, probe)}, {b});
  EXPECT_TRUE(BitwiseEqual(db[0].value(), probe));
}

TEST(ImplicitGrad, TheUnusedRecordingIsReleasedBeforeEvaluatingAgain) {
  // As above, the solver returns z0 and f is evaluated at it once more, on
  // the tape. The recorded last evaluation, which stands for nothing now,
  // holds a large saved tensor (tanh's output): it is let go first, so the
  // two recordings are never held at once (a nested solve's recorded
  // evaluation is many of these).
  constexpr int64_t kWide = 50000;
  Var b(Tensor::FromVector(Shape{1, 2}, {0.5, -0.25}, DType::kFloat64), true);
  std::vector<int64_t> in_use_at_recording;
  const CellFn away = [&](const Var& z, const std::vector<int64_t>&) {
    if (GradModeEnabled()) in_use_at_recording.push_back(GetBufferPoolStats().bytes_in_use);
    const Var wide = tanh(broadcast_to(reshape(z, Shape{1, 2, 1}), Shape{1, 2, kWide}));
    return add(add(mul_scalar(z, 2.0), b), mul_scalar(sum(wide, -1), 0.0));
  };
  ImplicitOptions options;
  options.forward = Steps(ForwardSolverType::kPicard, StopMode::kAbsolute, 5, 0.0);
  const ImplicitResult result =
      SolveImplicit(away, Tensor::Zeros(Shape{1, 2}, DType::kFloat64), options);
  ASSERT_EQ(in_use_at_recording.size(), 2u);  // the solver's last step, then at z*
  const int64_t wide_bytes = 2 * kWide * static_cast<int64_t>(sizeof(double));
  EXPECT_LT(in_use_at_recording[1] - in_use_at_recording[0], wide_bytes / 2)
      << "bytes in use at the first recording " << in_use_at_recording[0] << ", at the second "
      << in_use_at_recording[1];
  EXPECT_TRUE(BitwiseEqual(result.z_star.value(), b.value()));
}

TEST(ImplicitGrad, SecondBackwardWithoutRetainGraphThrows) {
  ImplicitProblem p = TanhProblem(2, 4, 3, 61);
  const Tensor probe = Probe(p);
  ImplicitResult result = SolveImplicit(p.cell, p.z0, ImplicitOptions());
  Var loss = ProbeLoss(result.z_star, probe);
  backward(loss);
  try {
    backward(loss);
    FAIL() << "a second backward through a freed implicit node must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("retain_graph"), std::string::npos) << e.what();
  }
}

TEST(ImplicitGrad, RetainGraphAllowsTwoBackwards) {
  ImplicitProblem p = TanhProblem(2, 4, 3, 62);
  const Tensor probe = Probe(p);
  ImplicitOptions options;
  options.backward = Ift(AdjointSolverType::kGmres);
  ImplicitResult result = SolveImplicit(p.cell, p.z0, options);
  Var loss = ProbeLoss(result.z_star, probe);
  VarList first = grad({loss}, p.params, {}, {.retain_graph = true});
  VarList second = grad({loss}, p.params);
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_LT(MaxAbsDiff(first[i].value(), second[i].value()), 1e-12) << i;
  }
}

// ------------------------------------------------------ reporting, options

TEST(ImplicitGrad, BackwardSummaryIsFilledWhenBackwardRuns) {
  ImplicitProblem p = TanhProblem(3, 4, 3, 71);
  ImplicitOptions options;
  options.backward.solver = AdjointSolverType::kGmres;
  ImplicitResult result = SolveImplicit(p.cell, p.z0, options);
  ASSERT_NE(result.backward, nullptr);
  EXPECT_TRUE(result.backward->sample_termination.empty());  // not run yet
  backward(ProbeLoss(result.z_star, Probe(p)));
  EXPECT_EQ(result.backward->batch_size, 3);
  EXPECT_EQ(result.backward->CountSamples(TerminationType::kConverged), 3);
  EXPECT_GT(result.backward->vjp_evaluations, 0);
  EXPECT_LE(result.backward->MaxRelResidual(), options.backward.tolerance);
  EXPECT_NE(result.backward->BriefReport().find("ift/gmres"), std::string::npos)
      << result.backward->BriefReport();
}

TEST(ImplicitGrad, DefaultBackwardIsIft) {
  ImplicitOptions options;
  EXPECT_EQ(options.backward.mode, BackwardMode::kIft);
  EXPECT_EQ(options.backward.solver, AdjointSolverType::kFixedPoint);
}

TEST(ImplicitGrad, WarmStartReusesThePreviousAdjoint) {
  ImplicitProblem p = TanhProblem(2, 6, 3, 81, 0.9);
  const Tensor probe = Probe(p);
  ImplicitOptions options;
  options.forward = TightForward(ForwardSolverType::kAnderson);
  options.backward = Ift(AdjointSolverType::kFixedPoint);
  options.backward.tolerance = 1e-10;
  options.backward.warm_start = true;
  // The previous solution is the call site's runtime state, not an option:
  // without one the solve refuses to start.
  try {
    SolveImplicit(p.cell, p.z0, options, p.energy);
    ADD_FAILURE() << "warm_start without an AdjointWarmStart was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("AdjointWarmStart"), std::string::npos) << e.what();
  }
  const auto warm = std::make_shared<AdjointWarmStart>();

  ImplicitResult first;
  const std::vector<Tensor> g1 = AnalyticGradients(p, p.cell, options, probe, &first, warm);
  EXPECT_FALSE(first.backward->warm_started);
  ASSERT_TRUE(warm->solution.defined());
  ImplicitResult second;
  const std::vector<Tensor> g2 = AnalyticGradients(p, p.cell, options, probe, &second, warm);
  EXPECT_TRUE(second.backward->warm_started);
  EXPECT_LT(second.backward->iterations, first.backward->iterations / 2)
      << first.backward->BriefReport() << "\n"
      << second.backward->BriefReport();
  EXPECT_LT(RelativeError(g2, g1), 1e-8);
}

TEST(ImplicitGrad, TapeOffReturnsTheSolutionWithoutGraph) {
  ImplicitProblem p = AffineProblem(2, 4, 3, false, 91);
  ImplicitOptions options;
  options.forward = TightForward(ForwardSolverType::kAnderson);
  NoGrad no_grad;
  ImplicitResult result = SolveImplicit(p.cell, p.z0, options);
  EXPECT_FALSE(result.z_star.requires_grad());
  EXPECT_EQ(result.backward, nullptr);
  EXPECT_LT(MaxAbsDiff(result.z_star.value(), AffineSolution(p)), 1e-10);
}

TEST(ImplicitGrad, UnrolledReportsItsSteps) {
  ImplicitProblem p = TanhProblem(2, 4, 3, 92);
  ImplicitOptions options;
  options.backward.mode = BackwardMode::kUnrolled;
  options.backward.unrolled_steps = 3;
  ImplicitResult result = SolveImplicit(p.cell, p.z0, options);
  EXPECT_EQ(result.forward.iterations, 3);
  EXPECT_EQ(result.forward.termination_type, TerminationType::kMaxIterations)
      << result.forward.FullReport();  // 3 steps do not reach 1e-4
  backward(ProbeLoss(result.z_star, Probe(p)));
  EXPECT_EQ(result.backward->mode, BackwardMode::kUnrolled);
  EXPECT_EQ(result.backward->iterations, 3);
}

// jfb, phantom and unrolled solve no adjoint equation: they end INEXACT,
// never CONVERGED, and the residual they never measured prints as n/a, not 0.
TEST(ImplicitGrad, InexactModesReportInexactAndNoResidual) {
  ImplicitProblem p = TanhProblem(2, 4, 3, 93);
  for (BackwardMode mode : {BackwardMode::kJfb, BackwardMode::kPhantom, BackwardMode::kUnrolled}) {
    ImplicitOptions options;
    options.forward = TightForward(ForwardSolverType::kAnderson);
    options.backward.mode = mode;
    ImplicitResult result = SolveImplicit(p.cell, p.z0, options);
    backward(ProbeLoss(result.z_star, Probe(p)));
    ASSERT_NE(result.backward, nullptr) << ToString(mode);
    const AdjointSummary& s = *result.backward;
    EXPECT_EQ(s.termination_type, TerminationType::kInexact) << s.FullReport();
    EXPECT_EQ(s.CountSamples(TerminationType::kInexact), 2) << s.FullReport();
    EXPECT_EQ(s.CountSamples(TerminationType::kConverged), 0) << s.FullReport();
    EXPECT_FALSE(s.IsUsable());
    EXPECT_FALSE(s.HasResiduals());
    const std::string brief = s.BriefReport();
    EXPECT_NE(brief.find(std::string(ToString(mode)) + ": INEXACT, 0/2 converged"),
              std::string::npos)
        << brief;
    EXPECT_NE(brief.find("max rel residual n/a"), std::string::npos) << brief;
    const std::string full = s.FullReport();
    EXPECT_NE(full.find("sample 1: INEXACT"), std::string::npos) << full;
    EXPECT_NE(full.find("abs n/a, rel n/a"), std::string::npos) << full;
    EXPECT_EQ(full.find("e+00"), std::string::npos) << full;  // no residual printed as 0
    EXPECT_NE(full.find("samples by termination: INEXACT 2"), std::string::npos) << full;
  }
}

// An ift backward that misses its tolerance says so in its brief report; one
// that meets it shows the tolerance beside the residual.
TEST(ImplicitGrad, BriefReportShowsTheToleranceAndWhetherItWasMet) {
  ImplicitProblem p = TanhProblem(2, 6, 3, 94, 0.9);
  ImplicitOptions options;
  options.forward = TightForward(ForwardSolverType::kAnderson);
  options.backward = Ift(AdjointSolverType::kFixedPoint);
  options.backward.tolerance = 1e-8;
  options.backward.max_iterations = 2;
  ImplicitResult starved = SolveImplicit(p.cell, p.z0, options);
  backward(ProbeLoss(starved.z_star, Probe(p)));
  EXPECT_EQ(starved.backward->tolerance, 1e-8);
  EXPECT_EQ(starved.backward->termination_type, TerminationType::kMaxIterations);
  EXPECT_NE(starved.backward->BriefReport().find("(tolerance 1e-08 NOT MET)"), std::string::npos)
      << starved.backward->BriefReport();
  options.backward.max_iterations = 400;
  ImplicitResult solved = SolveImplicit(p.cell, p.z0, options);
  backward(ProbeLoss(solved.z_star, Probe(p)));
  EXPECT_EQ(solved.backward->termination_type, TerminationType::kConverged)
      << solved.backward->FullReport();
  EXPECT_NE(solved.backward->BriefReport().find("(tolerance 1e-08),"), std::string::npos)
      << solved.backward->BriefReport();
}

TEST(ImplicitGrad, SampledIteratesAreKept) {
  ImplicitProblem p = TanhProblem(2, 4, 3, 93, 0.9);
  ImplicitOptions options;
  options.forward.type = ForwardSolverType::kPicard;
  options.forward.max_iterations = 20;
  options.forward.absolute_tolerance = 0.0;
  options.forward.stop_mode = StopMode::kAbsolute;
  options.sampled_iterates = 4;
  ImplicitResult result = SolveImplicit(p.cell, p.z0, options);
  ASSERT_EQ(result.sampled_iterates.size(), 4u);
  EXPECT_EQ(result.sampled_iterates[0].shape(), p.z0.shape());
  // Later iterates are closer to the fixed point.
  const double first = MaxAbsDiff(result.sampled_iterates.front(), result.z_star.value());
  const double last = MaxAbsDiff(result.sampled_iterates.back(), result.z_star.value());
  EXPECT_LT(last, first);
}

TEST(ImplicitGrad, SampledIteratesFollowAToleranceStoppedSolve) {
  // The solve stops on its tolerance long before max_iterations; the kept
  // iterates still spread over the iterations it ran, ending with its last.
  ImplicitProblem p = TanhProblem(2, 4, 3, 95, 0.5);
  ImplicitOptions options;
  options.forward.type = ForwardSolverType::kPicard;
  options.forward.max_iterations = 400;
  options.forward.absolute_tolerance = 1e-9;
  options.forward.stop_mode = StopMode::kAbsolute;
  options.sampled_iterates = 5;
  ImplicitResult result = SolveImplicit(p.cell, p.z0, options);
  const int ran = result.forward.iterations;
  ASSERT_GT(ran, 10);
  ASSERT_LT(ran, 100);
  ASSERT_EQ(result.sampled_iterates.size(), 5u);
  // Distances to z* shrink along the kept iterates, and the first one is
  // far from z* while the last is the solve's final state.
  std::vector<double> distance;
  for (const Tensor& z : result.sampled_iterates) {
    distance.push_back(MaxAbsDiff(z, result.z_star.value()));
  }
  for (size_t i = 1; i < distance.size(); ++i) EXPECT_LT(distance[i], distance[i - 1]) << i;
  EXPECT_GT(distance.front(), 1e3 * distance.back());
  EXPECT_LT(distance.back(), 1e-7);
}

TEST(ImplicitGrad, CellThatChangesShapeIsMisuse) {
  ImplicitProblem p = TanhProblem(2, 4, 3, 94);
  CellFn bad = [](const Var& z, const std::vector<int64_t>&) { return sum(z, 1, true); };
  EXPECT_THROW(SolveImplicit(bad, p.z0, ImplicitOptions()), Error);
  ImplicitOptions dense;
  dense.backward.solver = AdjointSolverType::kDense;
  dense.backward.dense_max_state_size = 3;  // n = 4
  EXPECT_THROW(SolveImplicit(p.cell, p.z0, dense), Error);
}

}  // namespace
}  // namespace stillpoint::implicit_grad_test
