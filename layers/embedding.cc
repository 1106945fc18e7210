#include "layers/embedding.h"

#include <limits>
#include <sstream>

#include "framework/init.h"
#include "framework/ops.h"

namespace stillpoint {

TokenEmbedding::TokenEmbedding(int64_t vocab_size,
                               int64_t dim,
                               Rng& rng,
                               const EmbeddingOptions& options)
    : vocab_size_(vocab_size), dim_(dim) {
  SP_CHECK(vocab_size > 0 && dim > 0, "TokenEmbedding: extents must be positive, got vocab ",
           vocab_size, ", dim ", dim);
  std::string error;
  SP_CHECK(options.IsValid(&error), "TokenEmbedding: ", error);
  Tensor table(Shape{vocab_size, dim}, options.dtype);
  init::Normal(table, 0.0, options.init_std, rng);
  weight_ = RegisterParameter("weight", table);
}

std::string TokenEmbedding::Name() const {
  std::ostringstream out;
  out << "TokenEmbedding(" << vocab_size_ << " x " << dim_ << ")";
  return out.str();
}

Var TokenEmbedding::Forward(const std::vector<int64_t>& ids, const Shape& ids_shape) const {
  return embedding(weight_, ids, ids_shape);
}

PositionalEmbedding::PositionalEmbedding(int64_t max_length,
                                         int64_t dim,
                                         Rng& rng,
                                         const EmbeddingOptions& options)
    : max_length_(max_length), dim_(dim) {
  SP_CHECK(max_length > 0 && dim > 0,
           "PositionalEmbedding: extents must be positive, got max_length ", max_length, ", dim ",
           dim);
  std::string error;
  SP_CHECK(options.IsValid(&error), "PositionalEmbedding: ", error);
  Tensor table(Shape{max_length, dim}, options.dtype);
  init::Normal(table, 0.0, options.init_std, rng);
  weight_ = RegisterParameter("weight", table);
}

std::string PositionalEmbedding::Name() const {
  std::ostringstream out;
  out << "PositionalEmbedding(" << max_length_ << " x " << dim_ << ")";
  return out.str();
}

Var PositionalEmbedding::Positions(int64_t length) const {
  SP_CHECK(length >= 1 && length <= max_length_, "PositionalEmbedding: length ", length,
           " is outside [1, ", max_length_, "] (the table has ", max_length_, " positions)");
  if (length == max_length_) return weight_;
  return slice(weight_, 0, 0, length);
}

Var PositionalEmbedding::Forward(const Var& x) const {
  SP_CHECK(x.defined() && x.rank() == 3 && x.dim(2) == dim_, "PositionalEmbedding: input ",
           (x.defined() ? x.shape().ToString() : "undefined"), " must be [B, T, ", dim_, "]");
  return add(x, Positions(x.dim(1)));
}

const OptionFields<EmbeddingOptions>& EmbeddingOptions::Fields() {
  using O = EmbeddingOptions;
  static const auto* fields =
      &(new OptionFields<O>)
           ->Double("init_std", &O::init_std, 0.0, std::numeric_limits<double>::max(),
                    "Standard deviation of the normal initialisation")
           .Enum("dtype", &O::dtype, {DType::kFloat32, DType::kFloat64}, stillpoint::ToString,
                 "The dtype of the table");
  return *fields;
}

bool EmbeddingOptions::IsValid(std::string* error) const {
  const std::string problem = Fields().Check(*this);
  if (!problem.empty() && error != nullptr) *error = "EmbeddingOptions: " + problem;
  return problem.empty();
}

std::string EmbeddingOptions::ToString() const { return Fields().Describe(*this) + "\n"; }

}  // namespace stillpoint
