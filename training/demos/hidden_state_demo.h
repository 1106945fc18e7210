// `stillpoint demo hidden-state` (seeds 000/002, Shim; docs/seeds.md S7a,
// S7b): the distribution of the hidden states over the iterations of an
// implicit solve, and the layer-norm equilibrium.
//
// Without a run: the S7b model. The attention update with a Gaussian
// intrinsic measure N(0, Sigma) is the affine expansion eta -> (I + Sigma)
// eta (eigenvalues 1 + lambda_i > 1); per-token layer normalisation (gain
// 1, bias 0) contracts it back. The map z -> LN((I + Sigma) z) is then
// power iteration on M = P (I + Sigma) P, P = I - 11'/D: every token tends
// to +- sqrt(D) times the top eigenvector of M, at the rate lambda_2 /
// lambda_1 per iteration (the predicted rate). The measured rate is the
// median over tokens of the per-iteration factor by which tan(angle to the
// top eigenvector) shrinks between iteration `burn_in` and the last one.
// Also reported: the spectral radius of the map's Jacobian at the final
// states by power iteration (solvers/regularizers.h), which is the same
// number computed another way.
//
// With a run (--run RUN, a model with an implicit layer: model.kind
// implicit or energy): the model's own map (the cell f(z; u), or the energy
// block's update) iterated from the solver's start on the first held-out
// examples by plain fixed-point iteration. The measured rate is the
// geometric mean of successive relative-residual ratios (over iterations
// after `burn_in` whose residual is above 1e-5, the float32 floor); the
// predicted rate is the spectral radius of the map's Jacobian at the last
// iterate. The hidden states are the tokens' rows (implicit: z [B, T, d];
// energy: the per-head values, concatenated).
//
// Writes hidden_state.csv (per iteration: the mean state's norm and its
// first 8 components, the first 8 covariance eigenvalues, the alignment
// with the top eigenvector, the median tangent to it, the residual),
// spectrum.svg,
// convergence.svg and summary.json with ln_rate_measured and
// ln_rate_predicted (and, without a run, lambda_1, lambda_2,
// jacobian_radius).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

namespace stillpoint {

struct HiddenStateDemoOptions {
  std::string out_dir;
  bool overwrite = false;  // write into an out_dir that holds files
  // A trained run (directory or .ckpt); empty: the S7b model.
  std::string run;
  // S7b: state width D (>= 3) and number of tokens (>= 2 D).
  int64_t dim = 8;
  int64_t tokens = 512;
  // Iterations recorded (>= burn_in + 5).
  int64_t iterations = 40;
  // Iterations left out of the rate measurement (transient).
  int64_t burn_in = 10;
  // With a run: held-out examples in the batch.
  int64_t examples = 16;
  uint64_t seed = 0;
};

struct HiddenStateDemoResult {
  double ln_rate_measured = 0.0;
  double ln_rate_predicted = 0.0;
};

// Throws an Error naming the option when one is invalid.
void CheckHiddenStateDemoOptions(const HiddenStateDemoOptions& options);
// Checks the options, then runs. With a run whose model has no implicit
// layer, throws an Error naming the run and its model kind.
HiddenStateDemoResult RunHiddenStateDemo(const HiddenStateDemoOptions& options, std::ostream& out);

}  // namespace stillpoint
