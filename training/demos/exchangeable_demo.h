// `stillpoint demo exchangeable` (seed 003, Zhang et al. 2022; docs/seeds.md
// Z1, Z2): attention over exchangeable tokens estimates a conditional mean,
// with an error that falls like L^-1/2 in the number of tokens L.
//
// Each trial draws a latent z ~ N(0, I_2), then L tokens iid given z:
//   dot-product variant: k_l ~ N(z, Sigma), v_l = A k_l; the attention
//     sum_l softmax_l(q.W k_l) v_l tends to the kernel-weighted mean
//     E[exp(q.W k) v | z] / E[exp(q.W k) | z] = A (z + Sigma W^T q)
//     (the exponential tilt of a Gaussian shifts its mean by Sigma W^T q);
//   RBF variant (distance logits -b/2 |q - k|^2, no magnitude priors, the
//     probabilistic attention's query term): k_l ~ N(z, I), v_l = A k_l;
//     the limit is the smoothed conditional mean A (b q + z) / (1 + b)
//     (A b q / (1 + b) for z = 0, tending to E[v | k = q] = A q as b grows).
// The attention is computed with the framework's ops in float64. For each L
// of 4, 8, ..., 4096 the error is the root mean square over trials of
// |attention - limit|; the expected Monte Carlo error is the delta-method
// standard deviation of a self-normalised average,
//   sqrt(E[w^2 |v - m|^2] / (L E[w]^2)),
// in closed form for both variants (docs/seeds.md Z1, Z2).
//
// Writes exchangeable.csv (L, error, rbf_error, expected_error,
// rbf_expected_error), error.svg (both errors and their fitted lines on
// log-log axes) and summary.json: slope, rbf_slope (log-log least squares
// over all L), final_error, rbf_final_error (at the largest L) and
// expected_final_error, rbf_expected_final_error.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

namespace stillpoint {

struct ExchangeableDemoOptions {
  std::string out_dir;
  bool overwrite = false;  // write into an out_dir that holds files
  // Token counts L = min_tokens, 2 min_tokens, ..., up to max_tokens
  // (powers of two apart; min_tokens >= 2).
  int64_t min_tokens = 4;
  int64_t max_tokens = 4096;
  // Independent trials (latents z) per L; >= 10.
  int64_t trials = 400;
  // RBF inverse bandwidth b > 0.
  double rbf_bandwidth = 1.0;
  uint64_t seed = 0;
};

struct ExchangeableDemoResult {
  double slope = 0.0, rbf_slope = 0.0;
  double final_error = 0.0, rbf_final_error = 0.0;
  double expected_final_error = 0.0, rbf_expected_final_error = 0.0;
};

// Throws an Error naming the option when one is invalid.
void CheckExchangeableDemoOptions(const ExchangeableDemoOptions& options);
// Checks the options, then runs; throws an Error for an unwritable directory.
ExchangeableDemoResult RunExchangeableDemo(const ExchangeableDemoOptions& options,
                                           std::ostream& out);

}  // namespace stillpoint
