// Linear: an affine map of the last axis, y = x W + b.
//
// Shapes: x [..., in] (rank 1 to 4) -> y [..., out]. W is stored [in, out]
// (the row-vector convention: no transpose in the forward product), b is
// [out]. Leading axes are folded into rows, so a [B, T, in] input costs one
// [B*T, in] x [in, out] product.
//
// Parameters: "weight" [in, out] and, unless options.bias is false, "bias"
// [out]. Initialisation: weight ~ U(-1/sqrt(in), 1/sqrt(in)) (the scale of
// PyTorch's nn.Linear weight; small enough that a weight-tied DEQ cell starts
// near a contraction), bias = 0.
//
// Contract: x has the parameters' dtype and last extent `in`; otherwise a
// stillpoint::Error names the layer and the shapes.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "framework/autograd.h"
#include "framework/module.h"
#include "framework/option_fields.h"
#include "framework/random.h"
#include "framework/tensor.h"

namespace stillpoint {

struct LinearOptions {
  // Add a learned bias b.
  bool bias = true;
  // The dtype of the parameters (and so of the inputs it accepts).
  DType dtype = DType::kFloat32;

  // The fields, declared once (framework/option_fields.h); not config keys.
  static const OptionFields<LinearOptions>& Fields();
  // Always valid (a dtype and a flag); declared for ToString and
  // uniformity.
  bool IsValid(std::string* error) const;
  std::string ToString() const;
};

class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, Rng& rng, const LinearOptions& options = {});

  std::string Name() const override;

  // x [..., in] -> [..., out].
  Var Forward(const Var& x) const;
  // gelu(Forward(x)), bitwise, in one pass over the output (linear_gelu in
  // framework/ops.h): the feed-forward sublayer's first half.
  Var ForwardGelu(const Var& x) const;
  // next.Forward(ForwardGelu(x)), bitwise, as one op (feed_forward in
  // framework/ops.h), whose backward multiplies by gelu' as it forms the
  // gradient at this layer's output: the whole feed-forward sublayer.
  // next.in_features() must be out_features().
  Var ForwardGeluThen(const Linear& next, const Var& x) const;

  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }
  const Var& weight() const { return weight_; }
  // Undefined when the layer has no bias.
  const Var& bias() const { return bias_; }

 private:
  // x [..., in] folded into rows [rows, in], op(rows) ([rows, out]),
  // unfolded to [..., out].
  Var Apply(const Var& x, int64_t out, const std::function<Var(const Var& rows)>& op) const;

  int64_t in_features_;
  int64_t out_features_;
  Var weight_;
  Var bias_;
};

}  // namespace stillpoint
