// LayerNorm over the last axis:
//   y = (x - mean(x)) / sqrt(var(x) + eps) * gain + bias
// with the biased variance over the last `dim` entries of each row.
//
// Shapes: x [..., dim] -> y [..., dim]. Parameters: "gain" [dim] (ones) and
// "bias" [dim] (zeros); options.elementwise_affine = false leaves both out.
// The forward and backward are the fused layer_norm op; Forward(parts)
// normalises a residual sum with the fused layer_norm_of_sum op.
#pragma once

#include <cstdint>
#include <string>

#include "framework/autograd.h"
#include "framework/module.h"
#include "framework/option_fields.h"
#include "framework/tensor.h"

namespace stillpoint {

struct LayerNormOptions {
  // Added to the variance before the square root.
  double eps = 1e-5;
  // Learn a per-feature gain and bias.
  bool elementwise_affine = true;
  DType dtype = DType::kFloat32;

  // The fields, declared once (framework/option_fields.h); not config keys.
  static const OptionFields<LayerNormOptions>& Fields();
  // The fields' ranges: eps >= 0 (0 is exact normalisation).
  bool IsValid(std::string* error) const;
  std::string ToString() const;
};

class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, const LayerNormOptions& options = {});

  std::string Name() const override;

  // x [..., dim] -> [..., dim].
  Var Forward(const Var& x) const;
  // The norm of parts[0] + parts[1] + ..., all of one shape [..., dim]:
  // bitwise the value of Forward(add(add(parts[0], parts[1]), ...)), without
  // materialising the sum (see layer_norm_of_sum).
  Var Forward(const VarList& parts) const;

  int64_t dim() const { return dim_; }
  double eps() const { return eps_; }
  // Undefined when elementwise_affine is false.
  const Var& gain() const { return gain_; }
  const Var& bias() const { return bias_; }

 private:
  int64_t dim_;
  double eps_;
  Var gain_;
  Var bias_;
};

}  // namespace stillpoint
