#include "layers/linear.h"

#include <cmath>
#include <sstream>

#include "framework/init.h"
#include "framework/ops.h"

namespace stillpoint {

Linear::Linear(int64_t in_features, int64_t out_features, Rng& rng, const LinearOptions& options)
    : in_features_(in_features), out_features_(out_features) {
  SP_CHECK(in_features > 0 && out_features > 0, "Linear: extents must be positive, got ",
           in_features, " -> ", out_features);
  Tensor weight(Shape{in_features, out_features}, options.dtype);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
  init::Uniform(weight, -bound, bound, rng);
  weight_ = RegisterParameter("weight", weight);
  if (options.bias) {
    bias_ = RegisterParameter("bias", Tensor::Zeros(Shape{out_features}, options.dtype));
  }
}

std::string Linear::Name() const {
  std::ostringstream out;
  out << "Linear(" << in_features_ << " -> " << out_features_
      << (bias_.defined() ? "" : ", no bias") << ")";
  return out.str();
}

Var Linear::Forward(const Var& x) const { return Apply(x, &linear); }

Var Linear::ForwardGelu(const Var& x) const { return Apply(x, &linear_gelu); }

Var Linear::Apply(const Var& x, Var (*op)(const Var&, const Var&, const Var&)) const {
  SP_CHECK(x.defined(), "Linear: input is undefined");
  const Shape& shape = x.shape();
  SP_CHECK(shape.rank() >= 1 && shape[-1] == in_features_, "Linear(", in_features_, " -> ",
           out_features_, "): input ", shape, " must have last extent ", in_features_);
  SP_CHECK(x.dtype() == weight_.dtype(), "Linear: input is ", stillpoint::ToString(x.dtype()),
           " but the weight is ", stillpoint::ToString(weight_.dtype()));
  // Fold the leading axes into rows: one GEMM instead of a batch of small ones.
  const int64_t rows = shape.numel() / in_features_;
  const Var y = op(reshape(x, Shape{rows, in_features_}), weight_, bias_);
  std::vector<int64_t> dims = shape.dims();
  dims.back() = out_features_;
  return reshape(y, Shape(dims));
}

}  // namespace stillpoint
