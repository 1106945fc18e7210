// Seeded random numbers. Every random choice in stillpoint (initialisers,
// data, dropout masks, probe vectors) draws from an Rng that was given a
// seed, so runs are reproducible. The generator is std::mt19937_64 and the
// distributions are computed here (not by <random>'s distributions, whose
// output differs between standard libraries), so a seed means the same
// numbers everywhere. The state can be saved and restored (checkpoints).
#pragma once

#include <cstdint>
#include <random>
#include <string>

#include "framework/tensor.h"

namespace stillpoint {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) : engine_(seed) {}

  uint64_t NextU64() { return engine_(); }
  // Uniform in [0, 1) with 53 random bits.
  double Uniform();
  double Uniform(double low, double high) { return low + (high - low) * Uniform(); }
  // Standard normal (Box-Muller, one value per call).
  double Normal();
  double Normal(double mean, double stddev) { return mean + stddev * Normal(); }
  // Uniform integer in [0, n).
  int64_t UniformInt(int64_t n);

  // The engine state as text (std::mt19937_64's stream format).
  std::string SaveState() const;
  // Restores SaveState()'s text; returns false if it does not parse.
  bool LoadState(const std::string& state);

 private:
  std::mt19937_64 engine_;
};

Tensor RandomUniform(const Shape& shape, double low, double high, DType dtype, Rng& rng);
Tensor RandomNormal(const Shape& shape, double mean, double stddev, DType dtype, Rng& rng);

}  // namespace stillpoint
