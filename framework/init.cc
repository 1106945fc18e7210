#include "framework/init.h"

#include <cmath>

namespace stillpoint {
namespace init {
namespace {

void CheckDefined(const Tensor& tensor, const char* op) {
  SP_CHECK(tensor.defined(), "init::", op, ": the tensor is empty (undefined)");
}

// Writes draw() into every element in row-major order.
template <typename Draw>
void FillWith(Tensor& tensor, Draw&& draw) {
  DispatchDType(tensor.dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* out = tensor.data<T>();
    const int64_t n = tensor.numel();
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(draw());
  });
}

void FillUniform(Tensor& tensor, double low, double high, Rng& rng) {
  FillWith(tensor, [&] { return rng.Uniform(low, high); });
}

void FillNormal(Tensor& tensor, double mean, double stddev, Rng& rng) {
  FillWith(tensor, [&] { return rng.Normal(mean, stddev); });
}

void CheckGain(double gain, const char* op) {
  SP_CHECK(std::isfinite(gain) && gain >= 0.0, "init::", op,
           ": gain must be finite and non-negative, got ", gain);
}

}  // namespace

void Zeros(Tensor& tensor) { Constant(tensor, 0.0); }
void Ones(Tensor& tensor) { Constant(tensor, 1.0); }

void Constant(Tensor& tensor, double value) {
  CheckDefined(tensor, "Constant");
  tensor.Fill(value);
}

void Uniform(Tensor& tensor, double low, double high, Rng& rng) {
  CheckDefined(tensor, "Uniform");
  SP_CHECK(std::isfinite(low) && std::isfinite(high) && low <= high,
           "init::Uniform: needs finite low <= high, got [", low, ", ", high, ")");
  FillUniform(tensor, low, high, rng);
}

void Normal(Tensor& tensor, double mean, double stddev, Rng& rng) {
  CheckDefined(tensor, "Normal");
  SP_CHECK(std::isfinite(mean) && std::isfinite(stddev) && stddev >= 0.0,
           "init::Normal: needs a finite mean and a finite stddev >= 0, got mean ", mean,
           ", stddev ", stddev);
  FillNormal(tensor, mean, stddev, rng);
}

Fans ComputeFans(const Shape& shape) {
  SP_CHECK(shape.rank() >= 2, "init::ComputeFans: a weight needs rank >= 2 ([..., in, out]), got ",
           shape);
  return Fans{shape.dim(-2), shape.dim(-1)};
}

double Gain(Nonlinearity nonlinearity) {
  switch (nonlinearity) {
    case Nonlinearity::kLinear:
    case Nonlinearity::kSigmoid:
      return 1.0;
    case Nonlinearity::kRelu:
      return std::numbers::sqrt2;
    case Nonlinearity::kTanh:
      return 5.0 / 3.0;
  }
  return 1.0;
}

const char* ToString(Nonlinearity nonlinearity) {
  switch (nonlinearity) {
    case Nonlinearity::kLinear:
      return "linear";
    case Nonlinearity::kRelu:
      return "relu";
    case Nonlinearity::kTanh:
      return "tanh";
    case Nonlinearity::kSigmoid:
      return "sigmoid";
  }
  return "unknown";
}

bool StringToNonlinearity(const std::string& text, Nonlinearity* nonlinearity) {
  for (const Nonlinearity candidate :
       {Nonlinearity::kLinear, Nonlinearity::kRelu, Nonlinearity::kTanh, Nonlinearity::kSigmoid}) {
    if (text == ToString(candidate)) {
      *nonlinearity = candidate;
      return true;
    }
  }
  return false;
}

void XavierUniform(Tensor& tensor, Rng& rng, double gain) {
  CheckDefined(tensor, "XavierUniform");
  CheckGain(gain, "XavierUniform");
  const Fans fans = ComputeFans(tensor.shape());
  if (tensor.numel() == 0) return;
  const double bound = gain * std::sqrt(6.0 / static_cast<double>(fans.fan_in + fans.fan_out));
  FillUniform(tensor, -bound, bound, rng);
}

void XavierNormal(Tensor& tensor, Rng& rng, double gain) {
  CheckDefined(tensor, "XavierNormal");
  CheckGain(gain, "XavierNormal");
  const Fans fans = ComputeFans(tensor.shape());
  if (tensor.numel() == 0) return;
  const double stddev = gain * std::sqrt(2.0 / static_cast<double>(fans.fan_in + fans.fan_out));
  FillNormal(tensor, 0.0, stddev, rng);
}

void KaimingUniform(Tensor& tensor, Rng& rng, double gain) {
  CheckDefined(tensor, "KaimingUniform");
  CheckGain(gain, "KaimingUniform");
  const Fans fans = ComputeFans(tensor.shape());
  if (tensor.numel() == 0) return;
  const double bound = gain * std::sqrt(3.0 / static_cast<double>(fans.fan_in));
  FillUniform(tensor, -bound, bound, rng);
}

void KaimingNormal(Tensor& tensor, Rng& rng, double gain) {
  CheckDefined(tensor, "KaimingNormal");
  CheckGain(gain, "KaimingNormal");
  const Fans fans = ComputeFans(tensor.shape());
  if (tensor.numel() == 0) return;
  const double stddev = gain / std::sqrt(static_cast<double>(fans.fan_in));
  FillNormal(tensor, 0.0, stddev, rng);
}

Tensor XavierUniform(const Shape& shape, DType dtype, Rng& rng, double gain) {
  Tensor tensor(shape, dtype);
  XavierUniform(tensor, rng, gain);
  return tensor;
}

Tensor XavierNormal(const Shape& shape, DType dtype, Rng& rng, double gain) {
  Tensor tensor(shape, dtype);
  XavierNormal(tensor, rng, gain);
  return tensor;
}

Tensor KaimingUniform(const Shape& shape, DType dtype, Rng& rng, double gain) {
  Tensor tensor(shape, dtype);
  KaimingUniform(tensor, rng, gain);
  return tensor;
}

Tensor KaimingNormal(const Shape& shape, DType dtype, Rng& rng, double gain) {
  Tensor tensor(shape, dtype);
  KaimingNormal(tensor, rng, gain);
  return tensor;
}

}  // namespace init
}  // namespace stillpoint
