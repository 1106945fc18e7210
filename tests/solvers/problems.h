// A zoo of batched fixed-point problems with known answers, for the solver
// conformance tests and the solver benchmark.
//
// Every problem is a FixedPointProblem on [B, n] tensors. The maps accept
// float32 and float64 states (they compute in float64 internally and write
// the state's dtype); InitialPoint() and Solution() are float64. Where it is
// cheap the problem also has an analytic jvp and an energy E with
// grad E(z) = z - f(z) (so f = z - grad E, step size 1).
//
//   name            B x n     what                                    fixed point
//   cos             3 x 1     z = cos(z)                              0.739085133215161
//   affine200       3 x 200   z = W z + b, ||W||_2 = 0.9, W not sym.  (I - W)^-1 b
//   tanh            4 x 32    z = tanh(W z + U x_b + c), ||W||_2=0.8  reference solve
//   hopfield        4 x 16    z = X softmax(beta X^T z), beta = 16    a stored pattern
//   layernorm_eig   2 x 12    z = LN((I + Sigma) z)                   top eigenvector of
//                                                                     P(I+Sigma)P, |z|=sqrt(12)
//   mixed_batch     4 x 6     z = a_b tanh(z) + c_b, per-sample a_b   per-element solve
//   no_fixed_point  2 x 4     z + 1 + sin(z)/2 + |z|/2 (no fixed     none
//                             point, not even in floating point)
//   nan_map         2 x 3     0.5 z + 2, NaN once any entry > 1        none (4 is in the NaN zone)
//
// The mixed batch starts sample 0 at its fixed point, sample 1 close to it
// and samples 2 and 3 far away, so solvers need different iteration counts
// per sample.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "framework/tensor.h"
#include "solvers/problem.h"

namespace stillpoint {
namespace zoo {

enum class Expectation {
  kConverges,     // a fixed point exists and the start is in its basin
  kNoFixedPoint,  // a solver must not report convergence
  kNonFinite      // iterates reach a region where the map returns NaN
};

// What the maps of a problem have been asked to do (for tests of the
// active-set contract). Calls are recorded only when log_calls is true.
struct CallLog {
  bool log_calls = false;
  std::vector<std::vector<int64_t>> map_calls;  // sample_ids of every map call
  int64_t map_rows = 0;                         // rows evaluated by the map
  int64_t jvp_rows = 0;
  int64_t energy_rows = 0;
};

struct ZooProblem {
  std::string name;
  FixedPointProblem problem;
  Expectation expectation = Expectation::kConverges;
  // Plain iteration (Picard, tau = 1) converges from InitialPoint().
  bool contractive = true;
  std::shared_ptr<CallLog> log = std::make_shared<CallLog>();

  // [B, n] float64, a fresh copy each call.
  Tensor InitialPoint() const { return initial_point.Clone(); }
  bool HasSolution() const { return solution.defined(); }
  // [B, n] float64, a fresh copy; undefined when no fixed point is known.
  Tensor Solution() const { return solution.defined() ? solution.Clone() : Tensor(); }

  Tensor initial_point;
  Tensor solution;
};

ZooProblem MakeCosProblem();
ZooProblem MakeAffineContraction(int64_t n = 200,
                                 int64_t batch = 3,
                                 double norm = 0.9,
                                 uint64_t seed = 7);
ZooProblem MakeTanhProblem(uint64_t seed = 11);
ZooProblem MakeHopfieldProblem(double beta = 16.0, uint64_t seed = 13);
ZooProblem MakeLayerNormEigenProblem(uint64_t seed = 17);
ZooProblem MakeMixedBatchProblem();
ZooProblem MakeNoFixedPointProblem();
ZooProblem MakeNanProblem();

// z = W z + b_s with W symmetric tridiagonal (0.475 off the diagonal, so its
// eigenvalues are 0.95 cos(k pi / (n + 1))) and b_s[i] = sin(frequency i
// (s + 1)) per sample s: Picard contracts by about 0.95 per step, Anderson
// (a windowed Krylov method on a real spectrum) needs far fewer evaluations.
// Not in the zoo table: a plain map (float64 states) for the tests that
// compare solvers' effort.
FixedPointProblem MakeSlowTridiagonalMap(int64_t n, int64_t batch, double frequency);

// The problems with a fixed point in reach, in the order of the table.
std::vector<ZooProblem> ConvergentZoo();
// Every problem of the table.
std::vector<ZooProblem> FullZoo();

// Max over samples of ||f(z_b) - z_b||_2, evaluated in float64 (for tests
// that recompute a summary's residuals). Also returns per-sample values.
std::vector<double> ResidualNorms(const ZooProblem& problem, const Tensor& z);

}  // namespace zoo
}  // namespace stillpoint
