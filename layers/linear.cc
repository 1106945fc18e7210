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
  std::string error;
  SP_CHECK(options.IsValid(&error), "Linear: ", error);
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

Var Linear::Forward(const Var& x) const {
  return Apply(x, out_features_, [this](const Var& rows) { return linear(rows, weight_, bias_); });
}

Var Linear::ForwardGelu(const Var& x) const {
  return Apply(x, out_features_,
               [this](const Var& rows) { return linear_gelu(rows, weight_, bias_); });
}

Var Linear::ForwardGeluThen(const Linear& next, const Var& x) const {
  SP_CHECK(next.in_features_ == out_features_, "Linear(", in_features_, " -> ", out_features_,
           "): the layer after it takes ", next.in_features_, " features");
  SP_CHECK(next.weight_.dtype() == weight_.dtype(), "Linear: the layer after it is ",
           stillpoint::ToString(next.weight_.dtype()), ", this one ",
           stillpoint::ToString(weight_.dtype()));
  return Apply(x, next.out_features_, [&](const Var& rows) {
    return feed_forward(rows, weight_, bias_, next.weight_, next.bias_);
  });
}

Var Linear::Apply(const Var& x, int64_t out, const std::function<Var(const Var& rows)>& op) const {
  SP_CHECK(x.defined(), "Linear: input is undefined");
  const Shape& shape = x.shape();
  SP_CHECK(shape.rank() >= 1 && shape[-1] == in_features_, "Linear(", in_features_, " -> ",
           out_features_, "): input ", shape, " must have last extent ", in_features_);
  SP_CHECK(x.dtype() == weight_.dtype(), "Linear: input is ", stillpoint::ToString(x.dtype()),
           " but the weight is ", stillpoint::ToString(weight_.dtype()));
  // Fold the leading axes into rows: one GEMM instead of a batch of small ones.
  const int64_t rows = shape.numel() / in_features_;
  const Var y = op(reshape(x, Shape{rows, in_features_}));
  std::vector<int64_t> dims = shape.dims();
  dims.back() = out;
  return reshape(y, Shape(dims));
}

const OptionFields<LinearOptions>& LinearOptions::Fields() {
  using O = LinearOptions;
  static const auto* fields =
      &(new OptionFields<O>)
           ->Bool("bias", &O::bias, "Add a learned bias b")
           .Enum("dtype", &O::dtype, {DType::kFloat32, DType::kFloat64}, stillpoint::ToString,
                 "The dtype of the parameters (and so of the inputs it accepts)");
  return *fields;
}

bool LinearOptions::IsValid(std::string* error) const {
  const std::string problem = Fields().Check(*this);
  if (!problem.empty() && error != nullptr) *error = "LinearOptions: " + problem;
  return problem.empty();
}

std::string LinearOptions::ToString() const { return Fields().Describe(*this) + "\n"; }

}  // namespace stillpoint
