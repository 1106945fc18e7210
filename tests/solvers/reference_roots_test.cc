// Every forward solver against reference roots on four problems outside the
// zoo of problems.h, each chosen for a way solvers fail:
//
//   expansive    f(z) = A z + c, A symmetric with spectral radius 1.1: the
//                fixed point exists but repels plain iteration
//   stiff_euler  one implicit-Euler step z = y0 + h g(z) of the stiff system
//                g(z) = -K z - z^3 (K's eigenvalues 1..1000, h = 0.1): J_f
//                has eigenvalues down to about -100
//   double_well  f = z - s grad E, E with two minima (two stable fixed points)
//                and a saddle between them (a third, unstable one)
//   non_normal   f(z) = A z + c with A non-normal (spectral radius 0.7,
//                ||A|| above 1): the residual of plain iteration grows for a
//                few steps before it falls
//
// The references are computed here in float64: closed forms for the linear
// maps and the double well, a dense Newton solve for the stiff step. Every
// solve must be truthful: a sample reported CONVERGED is at its reference
// root. The solvers that are expected to solve a problem must converge on
// it; Picard must report DIVERGED on the maps it cannot solve.
#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <cmath>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "framework/random.h"
#include "solvers/fixed_point_solver.h"

namespace stillpoint::reference_roots_test {
namespace {

using Matrix = Eigen::MatrixXd;
using Vector = Eigen::VectorXd;

// A map that is the same for every sample (samples differ in their start).
struct ReferenceProblem {
  std::string name;
  int64_t n = 0;
  std::function<Vector(const Vector& z)> map;
  std::function<Matrix(const Vector& z)> jacobian;  // J_f
  // E with grad E = z - f(z), when f is a gradient step of an energy.
  std::function<double(const Vector& z, Vector* gradient)> energy;
  Matrix starts;              // [B, n]
  std::vector<Vector> roots;  // the fixed points a converged sample may be at
  // Solvers that must converge from every start.
  std::set<ForwardSolverType> must_converge;
  // Solvers that must report DIVERGED on every sample.
  std::set<ForwardSolverType> must_diverge;
};

Matrix RandomOrthogonal(int64_t n, uint64_t seed) {
  Rng rng(seed);
  Matrix m(n, n);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) m(i, j) = rng.Normal();
  }
  const Eigen::HouseholderQR<Matrix> qr(m);
  return qr.householderQ();
}

Vector RandomVector(int64_t n, uint64_t seed) {
  Rng rng(seed);
  Vector v(n);
  for (int64_t i = 0; i < n; ++i) v(i) = rng.Normal();
  return v;
}

// Newton on F(z) = f(z) - z in float64 with backtracking on ||F||, to
// ||F|| <= 1e-14 (1 + ||z||).
Vector DenseNewtonRoot(const ReferenceProblem& p, Vector z) {
  for (int iteration = 0; iteration < 100; ++iteration) {
    const Vector residual = p.map(z) - z;
    if (residual.norm() <= 1e-14 * (1.0 + z.norm())) return z;
    const Matrix jacobian = p.jacobian(z) - Matrix::Identity(p.n, p.n);
    const Vector step = jacobian.partialPivLu().solve(-residual);
    double t = 1.0;
    while (t > 1e-6 && (p.map(z + t * step) - (z + t * step)).norm() >= residual.norm()) t *= 0.5;
    z += t * step;
  }
  ADD_FAILURE() << p.name << ": the reference Newton solve did not converge";
  return z;
}

ReferenceProblem Expansive() {
  ReferenceProblem p;
  p.name = "expansive";
  p.n = 6;
  const Matrix q = RandomOrthogonal(p.n, 301);
  Vector eigenvalues(p.n);
  eigenvalues << 1.1, 0.9, 0.5, 0.2, -0.3, -0.6;
  const Matrix a = q * eigenvalues.asDiagonal() * q.transpose();
  const Vector c = RandomVector(p.n, 302);
  p.map = [a, c](const Vector& z) { return Vector(a * z + c); };
  p.jacobian = [a](const Vector&) { return a; };
  p.starts = Matrix::Zero(2, p.n);
  p.starts.row(1) = RandomVector(p.n, 303).transpose();
  p.roots = {(Matrix::Identity(p.n, p.n) - a).partialPivLu().solve(c)};
  p.must_converge = {ForwardSolverType::kAnderson, ForwardSolverType::kBroyden,
                     ForwardSolverType::kNewtonKrylov, ForwardSolverType::kCeresTrustRegion};
  p.must_diverge = {ForwardSolverType::kPicard};
  return p;
}

// h = 0.1 puts the eigenvalues of J_f between -0.1 and -100, h = 1 between
// -1 and -1000.
ReferenceProblem StiffEuler(double h = 0.1) {
  ReferenceProblem p;
  p.name = "stiff_euler";
  p.n = 8;
  const Matrix q = RandomOrthogonal(p.n, 311);
  Vector eigenvalues(p.n);
  for (int64_t i = 0; i < p.n; ++i) eigenvalues(i) = std::pow(1000.0, i / (p.n - 1.0));
  const Matrix k = q * eigenvalues.asDiagonal() * q.transpose();
  Vector y0(p.n);
  for (int64_t i = 0; i < p.n; ++i) y0(i) = 1.5 * std::sin(1.0 + 0.7 * i);
  p.map = [k, y0, h](const Vector& z) {
    return Vector(y0 - h * (k * z + Vector(z.array().cube())));
  };
  p.jacobian = [k, h](const Vector& z) {
    return Matrix(-h * (k + Matrix(Vector(3.0 * z.array().square()).asDiagonal())));
  };
  p.energy = [k, y0, h](const Vector& z, Vector* gradient) {
    *gradient = z - y0 + h * (k * z + Vector(z.array().cube()));
    return 0.5 * (z - y0).squaredNorm() + h * (0.5 * z.dot(k * z) + 0.25 * z.array().pow(4).sum());
  };
  // The predictor y0 (the previous state) and a perturbed start.
  p.starts = Matrix(2, p.n);
  p.starts.row(0) = y0.transpose();
  p.starts.row(1) = (y0 + 0.5 * RandomVector(p.n, 312)).transpose();
  p.roots = {DenseNewtonRoot(p, y0)};
  p.must_converge = {ForwardSolverType::kBroyden, ForwardSolverType::kNewtonKrylov,
                     ForwardSolverType::kCeresTrustRegion, ForwardSolverType::kCeresLbfgs};
  p.must_diverge = {ForwardSolverType::kPicard};
  return p;
}

ReferenceProblem DoubleWell() {
  // E(z) = (z_0^2 - 1)^2 / 4 + sum_{i>0} (z_i - z_0 / 2)^2 / 2: minima at
  // z = +-(1, 1/2, ..., 1/2), a saddle at 0. f = z - s grad E, s = 0.5.
  ReferenceProblem p;
  p.name = "double_well";
  p.n = 4;
  const double s = 0.5;
  const int64_t n = p.n;
  auto gradient_of = [n](const Vector& z) {
    Vector g(n);
    double coupling = 0.0;
    for (int64_t i = 1; i < n; ++i) {
      g(i) = z(i) - 0.5 * z(0);
      coupling += g(i);
    }
    g(0) = z(0) * z(0) * z(0) - z(0) - 0.5 * coupling;
    return g;
  };
  p.map = [gradient_of, s](const Vector& z) { return Vector(z - s * gradient_of(z)); };
  p.jacobian = [n, s](const Vector& z) {
    Matrix hessian = Matrix::Identity(n, n);
    hessian(0, 0) = 3.0 * z(0) * z(0) - 1.0 + 0.25 * static_cast<double>(n - 1);
    for (int64_t i = 1; i < n; ++i) hessian(0, i) = hessian(i, 0) = -0.5;
    return Matrix(Matrix::Identity(n, n) - s * hessian);
  };
  p.energy = [gradient_of, s, n](const Vector& z, Vector* gradient) {
    // f = z - s grad E: the solvers' energy is s E, whose gradient is z - f.
    *gradient = s * gradient_of(z);
    double e = 0.25 * (z(0) * z(0) - 1.0) * (z(0) * z(0) - 1.0);
    for (int64_t i = 1; i < n; ++i) e += 0.5 * (z(i) - 0.5 * z(0)) * (z(i) - 0.5 * z(0));
    return s * e;
  };
  p.starts = Matrix(2, p.n);
  p.starts.row(0) << 0.8, 0.1, -0.2, 0.3;
  p.starts.row(1) << -1.5, 0.2, 0.0, -0.4;
  Vector plus(p.n);
  plus << 1.0, 0.5, 0.5, 0.5;
  p.roots = {DenseNewtonRoot(p, plus), DenseNewtonRoot(p, Vector(-plus))};
  p.must_converge = {ForwardSolverType::kPicard,     ForwardSolverType::kAnderson,
                     ForwardSolverType::kBroyden,    ForwardSolverType::kNewtonKrylov,
                     ForwardSolverType::kCeresLbfgs, ForwardSolverType::kCeresTrustRegion};
  return p;
}

ReferenceProblem NonNormal() {
  ReferenceProblem p;
  p.name = "non_normal";
  p.n = 6;
  Matrix block = Matrix::Zero(p.n, p.n);
  for (int64_t i = 0; i < p.n; i += 2) {
    block(i, i) = block(i + 1, i + 1) = 0.7;
    block(i, i + 1) = 1.0;
  }
  const Matrix q = RandomOrthogonal(p.n, 321);
  const Matrix a = q * block * q.transpose();
  const Vector c = RandomVector(p.n, 322);
  p.map = [a, c](const Vector& z) { return Vector(a * z + c); };
  p.jacobian = [a](const Vector&) { return a; };
  p.starts = Matrix::Zero(2, p.n);
  p.starts.row(1) = 3.0 * RandomVector(p.n, 323).transpose();
  p.roots = {(Matrix::Identity(p.n, p.n) - a).partialPivLu().solve(c)};
  p.must_converge = {ForwardSolverType::kPicard, ForwardSolverType::kAnderson,
                     ForwardSolverType::kBroyden, ForwardSolverType::kNewtonKrylov,
                     ForwardSolverType::kCeresTrustRegion};
  return p;
}

FixedPointProblem ToSolverProblem(const ReferenceProblem& p) {
  FixedPointProblem problem;
  problem.batch_size = p.starts.rows();
  problem.state_size = p.n;
  const int64_t n = p.n;
  auto row = [n](const Tensor& t, size_t r) {
    Vector v(n);
    for (int64_t i = 0; i < n; ++i) v(i) = t.at(static_cast<int64_t>(r) * n + i);
    return v;
  };
  auto write = [n](const Vector& v, size_t r, Tensor* t) {
    for (int64_t i = 0; i < n; ++i) t->set(static_cast<int64_t>(r) * n + i, v(i));
  };
  problem.map = [p, row, write](const Tensor& z, const std::vector<int64_t>& ids, Tensor* out) {
    for (size_t r = 0; r < ids.size(); ++r) write(p.map(row(z, r)), r, out);
    return true;
  };
  problem.jvp = [p, row, write](const Tensor& z, const Tensor& v, const std::vector<int64_t>& ids,
                                Tensor* out) {
    for (size_t r = 0; r < ids.size(); ++r) {
      write(Vector(p.jacobian(row(z, r)) * row(v, r)), r, out);
    }
    return true;
  };
  if (p.energy) {
    problem.energy = [p, row, write](const Tensor& z, const std::vector<int64_t>& ids,
                                     Tensor* energy, Tensor* gradient) {
      for (size_t r = 0; r < ids.size(); ++r) {
        Vector g;
        energy->set(static_cast<int64_t>(r), p.energy(row(z, r), &g));
        write(g, r, gradient);
      }
      return true;
    };
  }
  return problem;
}

ForwardSolverOptions Options(ForwardSolverType type) {
  ForwardSolverOptions o;
  o.type = type;
  o.stop_mode = StopMode::kAbsolute;
  o.absolute_tolerance = 1e-10;
  o.max_iterations = 300;
  // The secant methods' residuals are not monotone: give them room before
  // a stall is called (the window's own rules are tested below).
  o.stagnation_window = 50;
  // Anderson's memory spans these small states (a windowed Krylov method).
  o.anderson_memory = 8;
  // The automatic initial Jacobian scale: the stiff step needs it.
  o.broyden_initial_scale = 0.0;
  // Broyden without a line search wanders off on the stiff step, and a
  // memory that drops pairs stalls it on the expansive map.
  o.broyden_line_search = true;
  o.broyden_memory = 30;
  // Ceres' line searches compare energies, which resolve residuals down to
  // about 1e-8 only (docs/solvers.md).
  if (type == ForwardSolverType::kCeresLbfgs) o.absolute_tolerance = 1e-7;
  return o;
}

std::vector<ReferenceProblem> Problems() {
  return {Expansive(), StiffEuler(), DoubleWell(), NonNormal()};
}

TEST(ReferenceRoots, EverySolverIsTruthfulAndTheExpectedOnesConverge) {
  for (const ReferenceProblem& p : Problems()) {
    const FixedPointProblem problem = ToSolverProblem(p);
    for (ForwardSolverType type : AllForwardSolverTypes()) {
      if (type == ForwardSolverType::kCeresLbfgs && !p.energy) continue;
      SCOPED_TRACE(p.name + " / " + ToString(type));
      Tensor z(Shape{p.starts.rows(), p.n}, DType::kFloat64);
      for (int64_t b = 0; b < p.starts.rows(); ++b) {
        for (int64_t i = 0; i < p.n; ++i) z.set(b * p.n + i, p.starts(b, i));
      }
      const SolverSummary s = SolveFixedPoint(Options(type), problem, &z);
      for (int64_t b = 0; b < p.starts.rows(); ++b) {
        Vector zb(p.n);
        for (int64_t i = 0; i < p.n; ++i) zb(i) = z.at(b * p.n + i);
        double nearest = 1e300;
        for (const Vector& root : p.roots) nearest = std::min(nearest, (zb - root).norm());
        if (s.sample_termination[b] == TerminationType::kConverged) {
          // ||z - z*|| <= ||(I - J)^-1|| ||F(z)||: at most 10 ||F(z)|| on
          // these maps (the expansive one's I - A has singular values >= 0.1).
          EXPECT_LT(nearest, 1e3 * Options(type).absolute_tolerance)
              << "sample " << b << " reported CONVERGED away from every "
              << "reference root\n"
              << s.FullReport();
        }
        if (p.must_converge.count(type)) {
          EXPECT_EQ(s.sample_termination[b], TerminationType::kConverged) << "sample " << b << "\n"
                                                                          << s.FullReport();
        }
        if (p.must_diverge.count(type)) {
          EXPECT_EQ(s.sample_termination[b], TerminationType::kDiverged) << "sample " << b << "\n"
                                                                         << s.FullReport();
        }
      }
    }
  }
}

// Picard on the expansive map: the residual grows by the spectral radius
// each step. It ends DIVERGED once it has risen at every iteration of the
// stagnation window, not STAGNATED (and not only when it has grown by
// divergence_factor, about a hundred iterations later).
TEST(ReferenceRoots, PicardOnAnExpansiveMapDivergesWithinTheWindow) {
  const ReferenceProblem p = Expansive();
  Tensor z(Shape{2, p.n}, DType::kFloat64);
  for (int64_t i = 0; i < 2 * p.n; ++i) z.set(i, p.starts(i / p.n, i % p.n));
  ForwardSolverOptions o = Options(ForwardSolverType::kPicard);
  o.stagnation_window = 10;
  const SolverSummary s = SolveFixedPoint(o, ToSolverProblem(p), &z);
  EXPECT_EQ(s.termination_type, TerminationType::kDiverged) << s.FullReport();
  EXPECT_LE(s.iterations, 30) << s.FullReport();
  EXPECT_NE(s.message.find("rising at each of 10 iterations"), std::string::npos) << s.message;
  // A map whose residual rises for a few steps and then falls (non-normal)
  // is not called diverged.
  const ReferenceProblem q = NonNormal();
  Tensor y(Shape{2, q.n}, DType::kFloat64);
  for (int64_t i = 0; i < 2 * q.n; ++i) y.set(i, q.starts(i / q.n, i % q.n));
  const SolverSummary t = SolveFixedPoint(o, ToSolverProblem(q), &y);
  EXPECT_EQ(t.termination_type, TerminationType::kConverged) << t.FullReport();
}

// Broyden's initial inverse Jacobian -alpha I on the stiffer step (h = 1,
// J_f's eigenvalues down to -1000), with the line search on. alpha = 1 starts
// with a plain fixed-point step about 1000 times too long, which backtracking
// (at most 2^-8) cannot shorten enough: the memory is reset and the plain
// step taken, and the sample diverges. alpha = 0.01 and the automatic choice
// (a first step of at most half of max(||z0||, 1)) converge.
TEST(ReferenceRoots, BroydenInitialScaleSolvesTheStiffStep) {
  const ReferenceProblem p = StiffEuler(1.0);
  const FixedPointProblem problem = ToSolverProblem(p);
  auto solve = [&](double scale) {
    Tensor z(Shape{2, p.n}, DType::kFloat64);
    for (int64_t i = 0; i < 2 * p.n; ++i) z.set(i, p.starts(i / p.n, i % p.n));
    ForwardSolverOptions o = Options(ForwardSolverType::kBroyden);
    o.broyden_initial_scale = scale;
    o.absolute_tolerance = 1e-6;
    const SolverSummary s = SolveFixedPoint(o, problem, &z);
    double error = 0.0;
    for (int64_t b = 0; b < 2; ++b) {
      Vector zb(p.n);
      for (int64_t i = 0; i < p.n; ++i) zb(i) = z.at(b * p.n + i);
      error = std::max(error, (zb - p.roots[0]).norm());
    }
    return std::make_pair(s, error);
  };
  const auto [plain, plain_error] = solve(1.0);
  EXPECT_EQ(plain.termination_type, TerminationType::kDiverged) << plain.FullReport();
  // ||z - z*|| <= ||F(z)|| here (the eigenvalues of J_F are below -1).
  const auto [automatic, automatic_error] = solve(0.0);
  EXPECT_TRUE(automatic.IsUsable()) << automatic.FullReport();
  EXPECT_LT(automatic_error, 1e-6);
  bool reported = false;
  for (const OptionUsage& usage : automatic.option_usage) {
    reported |= usage.name == "broyden_initial_scale" && usage.requested == "0 (automatic)";
  }
  EXPECT_TRUE(reported) << automatic.FullReport();
  const auto [scaled, scaled_error] = solve(0.01);
  EXPECT_TRUE(scaled.IsUsable()) << scaled.FullReport();
  EXPECT_LT(scaled_error, 1e-6);
}

}  // namespace
}  // namespace stillpoint::reference_roots_test
