#include "framework/random.h"

#include <cmath>
#include <numbers>
#include <sstream>

namespace stillpoint {

double Rng::Uniform() {
  return static_cast<double>(engine_() >> 11) * (1.0 / 9007199254740992.0);
}

double Rng::Normal() {
  // Box-Muller; 1 - u keeps the logarithm's argument in (0, 1].
  const double u = 1.0 - Uniform();
  const double v = Uniform();
  return std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * std::numbers::pi * v);
}

int64_t Rng::UniformInt(int64_t n) {
  SP_CHECK(n > 0, "Rng::UniformInt: n must be positive, got ", n);
  return static_cast<int64_t>(Uniform() * static_cast<double>(n)) % n;
}

std::string Rng::SaveState() const {
  std::ostringstream out;
  out << engine_;
  return out.str();
}

bool Rng::LoadState(const std::string& state) {
  std::istringstream in(state);
  std::mt19937_64 engine;
  in >> engine;
  if (in.fail()) return false;
  engine_ = engine;
  return true;
}

Tensor RandomUniform(const Shape& shape, double low, double high, DType dtype, Rng& rng) {
  Tensor t(shape, dtype);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, rng.Uniform(low, high));
  return t;
}

Tensor RandomNormal(const Shape& shape, double mean, double stddev, DType dtype, Rng& rng) {
  Tensor t(shape, dtype);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, rng.Normal(mean, stddev));
  return t;
}

}  // namespace stillpoint
