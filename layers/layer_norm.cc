#include "layers/layer_norm.h"

#include <limits>
#include <sstream>

#include "framework/ops.h"

namespace stillpoint {

LayerNorm::LayerNorm(int64_t dim, const LayerNormOptions& options) : dim_(dim), eps_(options.eps) {
  SP_CHECK(dim > 0, "LayerNorm: dim must be positive, got ", dim);
  std::string error;
  SP_CHECK(options.IsValid(&error), "LayerNorm: ", error);
  if (options.elementwise_affine) {
    gain_ = RegisterParameter("gain", Tensor::Ones(Shape{dim}, options.dtype));
    bias_ = RegisterParameter("bias", Tensor::Zeros(Shape{dim}, options.dtype));
  }
}

std::string LayerNorm::Name() const {
  std::ostringstream out;
  out << "LayerNorm(" << dim_ << ", eps " << eps_ << ")";
  return out.str();
}

namespace {

void CheckLastExtent(const Var& x, int64_t dim, const char* what) {
  SP_CHECK(x.defined() && x.rank() >= 1 && x.dim(-1) == dim, "LayerNorm(", dim, "): ", what, " ",
           (x.defined() ? x.shape().ToString() : "undefined"), " must have last extent ", dim);
}

}  // namespace

Var LayerNorm::Forward(const Var& x) const {
  CheckLastExtent(x, dim_, "input");
  return layer_norm(x, gain_, bias_, eps_);
}

Var LayerNorm::Forward(const VarList& parts) const {
  SP_CHECK(!parts.empty(), "LayerNorm(", dim_, "): no parts to sum");
  for (const Var& part : parts) CheckLastExtent(part, dim_, "part");
  return layer_norm_of_sum(parts, gain_, bias_, eps_);
}

const OptionFields<LayerNormOptions>& LayerNormOptions::Fields() {
  using O = LayerNormOptions;
  static const auto* fields =
      &(new OptionFields<O>)
           ->Double("eps", &O::eps, 0.0, std::numeric_limits<double>::max(),
                    "Added to the variance before the square root")
           .Bool("elementwise_affine", &O::elementwise_affine,
                 "Learn a per-feature gain and bias")
           .Enum("dtype", &O::dtype, {DType::kFloat32, DType::kFloat64}, stillpoint::ToString,
                 "The dtype of the parameters");
  return *fields;
}

bool LayerNormOptions::IsValid(std::string* error) const {
  const std::string problem = Fields().Check(*this);
  if (!problem.empty() && error != nullptr) *error = "LayerNormOptions: " + problem;
  return problem.empty();
}

std::string LayerNormOptions::ToString() const { return Fields().Describe(*this) + "\n"; }

}  // namespace stillpoint
