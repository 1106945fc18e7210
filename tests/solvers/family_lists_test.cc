// The three solver families are each one list (solvers/forward_solver_list.h,
// solvers/adjoint/method_list.h, solvers/implicit_solve/mode_list.h) from which
// the enum, the names and the dispatch are made. Every line of a list must
// give an enumerator in the list's order, a distinct name that parses back
// to it, and a dispatch that runs that member (not another one and not the
// "unknown" path).
#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <cctype>
#include <cstddef>
#include <memory>
#include <set>
#include <string>
#include <typeindex>
#include <vector>

#include "framework/autograd.h"
#include "framework/check.h"
#include "framework/random.h"
#include "solvers/adjoint.h"
#include "solvers/fixed_point_solver.h"
#include "solvers/forward_solver_list.h"
#include "solvers/implicit_solve.h"
#include "tests/solvers/implicit_problems.h"

namespace stillpoint::family_lists_test {
namespace {

// Lines in each list, counted from the lists themselves.
#define SP_COUNT_LINE(...) +1
constexpr std::size_t kForwardSolverLines = 0 SP_FORWARD_SOLVERS(SP_COUNT_LINE);
constexpr std::size_t kAdjointSolverLines = 0 SP_ADJOINT_SOLVERS(SP_COUNT_LINE, SP_COUNT_LINE);
constexpr std::size_t kBackwardModeLines = 0 SP_BACKWARD_MODES(SP_COUNT_LINE);
#undef SP_COUNT_LINE

// The adjoint problem's sizes.
constexpr int64_t kBatch = 2;
constexpr int64_t kN = 4;

// `all` holds one value per list line, in the list's order (the enum's
// values 0, 1, ...), each with its own name that parses back to it in any
// letter case.
template <typename Enum>
void ExpectNamedInListOrder(const std::vector<Enum>& all,
                            std::size_t lines,
                            bool (*parse)(const std::string&, Enum*)) {
  ASSERT_EQ(all.size(), lines);
  ASSERT_GE(all.size(), 2u);  // parsing starts from another value
  std::set<std::string> names;
  for (std::size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(static_cast<std::size_t>(all[i]), i);
    const std::string name = ToString(all[i]);
    EXPECT_NE(name, "unknown") << i;
    EXPECT_TRUE(names.insert(name).second) << "duplicate name " << name;
    std::string upper = name;
    for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    for (const std::string& text : {name, upper}) {
      Enum parsed = all[(i + 1) % all.size()];
      EXPECT_TRUE(parse(text, &parsed)) << text;
      EXPECT_EQ(parsed, all[i]) << text;
    }
  }
}

TEST(FamilyLists, ForwardSolversAreNamedAndEachCreatesItsOwnSolver) {
  const std::vector<ForwardSolverType> all = AllForwardSolverTypes();
  ExpectNamedInListOrder(all, kForwardSolverLines, &StringToForwardSolverType);
  std::set<std::type_index> classes;
  for (ForwardSolverType type : all) {
    ForwardSolverOptions options;
    options.type = type;
    const std::unique_ptr<FixedPointSolver> solver = FixedPointSolver::Create(options);
    ASSERT_NE(solver, nullptr) << ToString(type);
    EXPECT_EQ(solver->type(), type);
    const FixedPointSolver& created = *solver;
    classes.insert(std::type_index(typeid(created)));
  }
  // A line whose factory were another line's would build that line's class.
  EXPECT_EQ(classes.size(), all.size());
}

// w = g + J^T w on two samples of size 4, J symmetric with norm 0.5 (so
// I - J is symmetric positive definite and every method applies), solved by
// every adjoint solver: each reports itself, describes a method of its own
// (the first clause of each method's message, "restarted GMRES(20)", "MINRES
// (assumes I - J symmetric)", "the anderson forward solver on the adjoint
// equation", differs from every other's) and reaches the exact solution.
TEST(FamilyLists, AdjointSolversAreNamedAndEachSolves) {
  const std::vector<AdjointSolverType> all = AllAdjointSolverTypes();
  ExpectNamedInListOrder(all, kAdjointSolverLines, &StringToAdjointSolverType);

  Rng rng(7);
  const Tensor j = implicit_test::RandomMatrix(kN, kN, 0.5, /*symmetric=*/true, rng);
  const Tensor g = RandomNormal(Shape{kBatch, kN}, 0.0, 1.0, DType::kFloat64, rng);
  Eigen::MatrixXd jm(kN, kN);
  for (int64_t r = 0; r < kN; ++r) {
    for (int64_t c = 0; c < kN; ++c) jm(r, c) = j.at(r * kN + c);
  }
  // Rows: (J^T v_b)^T = v_b^T J.
  const BatchedVjp vjp = [&jm](const Tensor& v, Tensor* out) {
    for (int64_t b = 0; b < kBatch; ++b) {
      Eigen::RowVectorXd vb(kN);
      for (int64_t i = 0; i < kN; ++i) vb(i) = v.at(b * kN + i);
      const Eigen::RowVectorXd r = vb * jm;
      for (int64_t i = 0; i < kN; ++i) out->set(b * kN + i, r(i));
    }
  };
  const Eigen::PartialPivLU<Eigen::MatrixXd> lu(Eigen::MatrixXd::Identity(kN, kN) - jm.transpose());
  std::set<std::string> methods;
  for (AdjointSolverType type : all) {
    SCOPED_TRACE(ToString(type));
    BackwardOptions options;
    options.solver = type;
    options.tolerance = 1e-11;
    options.max_iterations = 400;
    options.neumann_terms = 400;
    Tensor w;
    const AdjointSummary summary = SolveAdjoint(options, vjp, g, &w);
    EXPECT_EQ(summary.solver, type);
    const std::string method = summary.message.substr(0, summary.message.find_first_of(".:"));
    EXPECT_TRUE(methods.insert(method).second) << "a second line runs " << method;
    EXPECT_EQ(summary.termination_type, TerminationType::kConverged);
    ASSERT_TRUE(w.defined());
    for (int64_t b = 0; b < kBatch; ++b) {
      Eigen::VectorXd gb(kN);
      for (int64_t i = 0; i < kN; ++i) gb(i) = g.at(b * kN + i);
      const Eigen::VectorXd exact = lu.solve(gb);
      for (int64_t i = 0; i < kN; ++i) EXPECT_NEAR(w.at(b * kN + i), exact(i), 1e-9);
    }
  }
  EXPECT_EQ(methods.size(), all.size());
}

// Every backward mode, through SolveImplicit and a backward pass: the
// backward summary names the mode that ran.
TEST(FamilyLists, BackwardModesAreNamedAndEachRunsItsOwnBackward) {
  const std::vector<BackwardMode> all = AllBackwardModes();
  ExpectNamedInListOrder(all, kBackwardModeLines, &StringToBackwardMode);
  for (BackwardMode mode : all) {
    SCOPED_TRACE(ToString(mode));
    const implicit_test::ImplicitProblem p = implicit_test::AffineProblem(2, 4, 3, false, 21);
    ImplicitOptions options;
    options.forward = implicit_test::TightForward(ForwardSolverType::kAnderson);
    options.backward.mode = mode;
    const ImplicitResult result = SolveImplicit(p.cell, p.z0, options);
    const VarList grads = grad({sum(result.z_star)}, p.params);
    ASSERT_NE(result.backward, nullptr);
    EXPECT_EQ(result.backward->mode, mode);
    EXPECT_TRUE(grads[0].defined());
  }
}

}  // namespace
}  // namespace stillpoint::family_lists_test
