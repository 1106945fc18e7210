// Parameter initialisers. Each writes into an existing tensor (any shape,
// float32 or float64, including a view such as a SliceRows block) and draws
// from the given Rng, one draw per element in row-major order, so a seed
// fixes the values. Uniform(t, a, b, rng) produces exactly the values of
// RandomUniform(t.shape(), a, b, t.dtype(), rng), and Normal likewise.
//
// Fans. A weight is stored [in, out] (y = x W), so for rank >= 2
//   fan_in  = dim(-2),   fan_out = dim(-1);
// leading axes (e.g. [heads, in, out]) are independent matrices and do not
// change the fans. Rank 0 and 1 tensors have no fans; the fan-based
// initialisers reject them (initialise biases with Zeros or Uniform).
//
// Formulas (gain g, see Gain()):
//   XavierUniform:  U(-a, a),   a = g * sqrt(6 / (fan_in + fan_out))
//   XavierNormal:   N(0, s^2),  s = g * sqrt(2 / (fan_in + fan_out))
//   KaimingUniform: U(-a, a),   a = g * sqrt(3 / fan_in)
//   KaimingNormal:  N(0, s^2),  s = g / sqrt(fan_in)
// so Xavier keeps Var(y) ~ Var(x) averaged over forward and backward
// (variance g^2 * 2 / (fan_in + fan_out)), and Kaiming keeps the forward
// variance through a nonlinearity with that gain (variance g^2 / fan_in;
// g = sqrt(2) for relu, the default).
#pragma once

#include <cstdint>
#include <numbers>
#include <string>

#include "framework/random.h"
#include "framework/tensor.h"

namespace stillpoint {
namespace init {

// ------------------------------------------------------------ constants

void Zeros(Tensor& tensor);
void Ones(Tensor& tensor);
void Constant(Tensor& tensor, double value);

// ------------------------------------------------------------ plain random

// U(low, high): every element in [low, high) (float32 rounding may give high
// itself). Requires low <= high.
void Uniform(Tensor& tensor, double low, double high, Rng& rng);
// N(mean, stddev^2). Requires stddev >= 0.
void Normal(Tensor& tensor, double mean, double stddev, Rng& rng);

// ------------------------------------------------------------ fan-based

struct Fans {
  int64_t fan_in = 0;
  int64_t fan_out = 0;
};
// The fans of an [..., in, out] weight (see above). Throws for rank < 2.
Fans ComputeFans(const Shape& shape);

// The nonlinearity that follows a layer, which fixes the gain that keeps the
// activations' variance from shrinking or growing with depth.
enum class Nonlinearity { kLinear, kRelu, kTanh, kSigmoid };
// 1 for linear and sigmoid, sqrt(2) for relu, 5/3 for tanh.
double Gain(Nonlinearity nonlinearity);
const char* ToString(Nonlinearity nonlinearity);
// Parses "linear", "relu", "tanh", "sigmoid"; returns false otherwise.
bool StringToNonlinearity(const std::string& text, Nonlinearity* nonlinearity);

inline constexpr double kReluGain = std::numbers::sqrt2;

// In place. An empty tensor (a zero extent) is left as is.
void XavierUniform(Tensor& tensor, Rng& rng, double gain = 1.0);
void XavierNormal(Tensor& tensor, Rng& rng, double gain = 1.0);
void KaimingUniform(Tensor& tensor, Rng& rng, double gain = kReluGain);
void KaimingNormal(Tensor& tensor, Rng& rng, double gain = kReluGain);

// Fresh tensors, for RegisterParameter("w", init::XavierUniform({in, out},
// DType::kFloat32, rng)).
Tensor XavierUniform(const Shape& shape, DType dtype, Rng& rng, double gain = 1.0);
Tensor XavierNormal(const Shape& shape, DType dtype, Rng& rng, double gain = 1.0);
Tensor KaimingUniform(const Shape& shape, DType dtype, Rng& rng, double gain = kReluGain);
Tensor KaimingNormal(const Shape& shape, DType dtype, Rng& rng, double gain = kReluGain);

}  // namespace init
}  // namespace stillpoint
