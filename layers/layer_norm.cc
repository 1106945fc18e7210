#include "layers/layer_norm.h"

#include <sstream>

#include "framework/ops.h"

namespace stillpoint {

LayerNorm::LayerNorm(int64_t dim, const LayerNormOptions& options) : dim_(dim), eps_(options.eps) {
  SP_CHECK(dim > 0, "LayerNorm: dim must be positive, got ", dim);
  SP_CHECK(options.eps >= 0, "LayerNorm: eps must be >= 0, got ", options.eps);
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

Var LayerNorm::Forward(const Var& x) const {
  SP_CHECK(x.defined() && x.rank() >= 1 && x.dim(-1) == dim_, "LayerNorm(", dim_, "): input ",
           (x.defined() ? x.shape().ToString() : "undefined"), " must have last extent ", dim_);
  return layer_norm(x, gain_, bias_, eps_);
}

}  // namespace stillpoint
