#include "layers/attention.h"

#include <cmath>
#include <limits>
#include <sstream>

#include "framework/ops.h"

namespace stillpoint {
namespace {

// [Tq, Tk] with 1 where query i may not see key j (j > i + Tk - Tq).
Tensor CausalMask(int64_t tq, int64_t tk, DType dtype) {
  Tensor mask = Tensor::Zeros(Shape{tq, tk}, dtype);
  const int64_t offset = tk - tq;
  for (int64_t i = 0; i < tq; ++i) {
    for (int64_t j = std::max<int64_t>(0, i + offset + 1); j < tk; ++j) mask.set(i * tk + j, 1.0);
  }
  return mask;
}

}  // namespace

MultiHeadAttention::MultiHeadAttention(int64_t dim,
                                       int64_t heads,
                                       Rng& rng,
                                       const AttentionOptions& options)
    : dim_(dim),
      heads_(heads),
      causal_(options.causal ||
              (options.layout && options.layout->mask == AttentionMaskKind::kCausal)),
      layout_(options.layout) {
  SP_CHECK(dim > 0 && heads > 0 && dim % heads == 0, "MultiHeadAttention: dim ", dim,
           " must be a positive multiple of heads ", heads);
  std::string error;
  SP_CHECK(options.IsValid(&error), "MultiHeadAttention: ", error);
  if (layout_) {
    const std::string problem = layout_->Check(heads, dim / heads);
    SP_CHECK(problem.empty(), "MultiHeadAttention: ", problem);
  }
  scale_ = options.scale > 0.0 ? options.scale : 1.0 / std::sqrt(static_cast<double>(dim / heads));
  const LinearOptions linear{.bias = options.bias, .dtype = options.dtype};
  wq_ = RegisterModule("wq", std::make_shared<Linear>(dim, dim, rng, linear));
  wk_ = RegisterModule("wk", std::make_shared<Linear>(dim, dim, rng, linear));
  wv_ = RegisterModule("wv", std::make_shared<Linear>(dim, dim, rng, linear));
  wo_ = RegisterModule("wo", std::make_shared<Linear>(dim, dim, rng, linear));
}

std::string MultiHeadAttention::Name() const {
  std::ostringstream out;
  out << "MultiHeadAttention(dim " << dim_ << ", heads " << heads_ << ", "
      << (causal_ ? "causal" : "non-causal") << ", scale " << scale_;
  if (layout_) out << ", " << layout_->ToString();
  out << ")";
  return out.str();
}

Var MultiHeadAttention::SplitHeads(const Var& x) const {
  const int64_t batch = x.dim(0);
  const int64_t length = x.dim(1);
  return permute(reshape(x, Shape{batch, length, heads_, dim_ / heads_}), {0, 2, 1, 3});
}

Var MultiHeadAttention::MergeHeads(const Var& x) const {
  const int64_t batch = x.dim(0);
  const int64_t length = x.dim(2);
  return reshape(permute(x, {0, 2, 1, 3}), Shape{batch, length, dim_});
}

Var MultiHeadAttention::Forward(const Var& x, const AttentionMask& mask) const {
  SP_CHECK(x.defined(), "MultiHeadAttention: the input is undefined");
  SP_CHECK(x.rank() == 3 && x.dim(2) == dim_, "MultiHeadAttention(dim ", dim_, "): input ",
           x.shape(), " must be [B, T, ", dim_, "]");
  SP_CHECK(x.dtype() == wq_->weight().dtype(), "MultiHeadAttention: input is ",
           stillpoint::ToString(x.dtype()), " but the weights are ",
           stillpoint::ToString(wq_->weight().dtype()));
  // Three projections of their own, not one product with the weights side
  // by side ([dim, 3 dim], which read x once but cost a copy of the weights
  // and a pack of the copy per call, and a copy of each weight's gradient
  // out of the joint one): each weight is then read in place by the packed
  // kernel and each gradient written where it belongs. The explicit model
  // gains; the implicit one pays a little, since each adjoint product then
  // adds three input gradients instead of one (bench/RESULTS.md).
  return Forward(x, x, mask);
}

Var MultiHeadAttention::ForwardAtZero(int64_t batch, int64_t length) const {
  SP_CHECK(batch >= 1 && length >= 1,
           "MultiHeadAttention: ForwardAtZero needs batch and length >= 1, got ", batch, " and ",
           length);
  const Var value = wv_->bias().defined()
                        ? reshape(wv_->bias(), Shape{1, dim_})
                        : constant(Tensor::Zeros(Shape{1, dim_}, wv_->weight().dtype()));
  Var row = reshape(wo_->Forward(value), Shape{1, 1, dim_});
  // Plus 0 x (the sum of each projection the output does not depend on), so
  // those get a gradient of zeros, as through Forward(zeros), not none: the
  // optimizer then treats them alike (weight decay) and gradient sums over
  // shards find every parameter.
  for (const Var& unused :
       {wq_->weight(), wq_->bias(), wk_->weight(), wk_->bias(), wv_->weight()}) {
    if (unused.defined()) row = add(row, mul_scalar(sum(unused), 0.0));
  }
  return broadcast_to(row, Shape{batch, length, dim_});
}

Var MultiHeadAttention::Forward(const Var& x, const Var& context, const AttentionMask& mask) const {
  SP_CHECK(x.defined() && context.defined(), "MultiHeadAttention: an input is undefined");
  SP_CHECK(x.rank() == 3 && x.dim(2) == dim_, "MultiHeadAttention(dim ", dim_, "): queries ",
           x.shape(), " must be [B, Tq, ", dim_, "]");
  SP_CHECK(context.rank() == 3 && context.dim(2) == dim_ && context.dim(0) == x.dim(0),
           "MultiHeadAttention(dim ", dim_, "): context ", context.shape(), " must be [", x.dim(0),
           ", Tk, ", dim_, "] for queries ", x.shape());
  const int64_t batch = x.dim(0);
  const int64_t tq = x.dim(1);
  const int64_t tk = context.dim(1);

  // The layout's mask and ALiBi bias (a plain causal mask is the fused
  // kernel's own), and its rotary positions on the projections.
  Tensor layout_bias;
  Var q_projected = wq_->Forward(x), k_projected = wk_->Forward(context);
  // A local mask with no other mask: each query's few keys only
  // (neighbour_attention), not the dense [Tq, Tk] scores masked.
  const bool neighbours_only = layout_ && layout_->mask == AttentionMaskKind::kLocal && !causal_ &&
                               !mask.additive.defined() && !mask.key_mask.defined();
  if (layout_) {
    if (layout_->NeedsBias() && !neighbours_only) {
      SP_CHECK(tq == tk, "MultiHeadAttention: the layout's mask and positions apply to "
                         "self-attention (Tq = Tk), got Tq ", tq, ", Tk ", tk);
      layout_bias = AttentionBias(*layout_, heads_, tq, x.dtype());
    }
    if (layout_->Rotary()) {
      SP_CHECK(tq == tk, "MultiHeadAttention: rotary positions apply to self-attention (Tq = Tk), "
                         "got Tq ", tq, ", Tk ", tk);
      q_projected = ApplyRotaryMerged(q_projected, *layout_, heads_);
      k_projected = ApplyRotaryMerged(k_projected, *layout_, heads_);
    }
  }

  if (neighbours_only) {
    SP_CHECK(tq == tk, "MultiHeadAttention: the local mask applies to self-attention (Tq = Tk), "
                       "got Tq ", tq, ", Tk ", tk);
    const Var heads_out =
        neighbour_attention(q_projected, k_projected, wv_->Forward(context), heads_, scale_,
                            LocalNeighbours(*layout_, heads_, tq, x.dtype()));
    return wo_->Forward(heads_out);
  }
  if (!mask.additive.defined() && !mask.key_mask.defined() && !layout_bias.defined()) {
    // The fused kernel: heads read in place from the projections, the
    // [Tq, Tk] blocks never leave the cache, and no permuted copies.
    const Var heads_out = multi_head_attention(q_projected, k_projected, wv_->Forward(context),
                                               heads_, scale_, causal_);
    return wo_->Forward(heads_out);
  }

  // Scaling Q (Tq x dh per head) is cheaper than scaling the Tq x Tk scores.
  const Var q = SplitHeads(mul_scalar(q_projected, scale_));
  const Var k = SplitHeads(k_projected);
  const Var v = SplitHeads(wv_->Forward(context));
  Var scores = matmul(q, k, false, true);  // [B, H, Tq, Tk]

  if (mask.additive.defined()) {
    Tensor additive =
        mask.additive.dtype() == scores.dtype() ? mask.additive : mask.additive.To(scores.dtype());
    scores = add(scores, constant(additive));
  }
  if (layout_bias.defined()) scores = add(scores, constant(layout_bias));
  const double hidden = -std::numeric_limits<double>::infinity();
  if (causal_) scores = masked_fill(scores, CausalMask(tq, tk, scores.dtype()), hidden);
  if (mask.key_mask.defined()) {
    const Shape& km = mask.key_mask.shape();
    const bool fits =
        (km.rank() == 1 && km[0] == tk) || (km.rank() == 2 && km[0] == batch && km[1] == tk);
    SP_CHECK(fits, "MultiHeadAttention: key_mask ", km, " must be [", batch, ", ", tk, "] or [", tk,
             "]");
    // [B, Tk] -> [B, 1, 1, Tk]: the same keys hidden for every head and query.
    const Tensor key_mask =
        km.rank() == 1 ? mask.key_mask : mask.key_mask.Reshape(Shape{batch, 1, 1, tk});
    scores = masked_fill(scores, key_mask, hidden);
  }
  const Var weights = softmax(scores);
  return wo_->Forward(MergeHeads(matmul(weights, v)));
}

bool MultiHeadAttention::SupportsStep(std::string* why) const {
  std::string problem;
  if (!causal_) {
    problem = "the attention is not causal";
  } else if (layout_ && (layout_->Rotary() || layout_->Alibi() || layout_->TwoDimensional() ||
                         layout_->window > 0)) {
    problem = "its layout (" + layout_->ToString() +
              ") makes the scores depend on the query's position";
  }
  if (why != nullptr) *why = problem;
  return problem.empty();
}

Var MultiHeadAttention::ForwardStep(const Var& x, const KeyValueCache& past,
                                    KeyValueCache* next) const {
  std::string why;
  SP_CHECK(SupportsStep(&why), "MultiHeadAttention: no incremental step: ", why);
  SP_CHECK(x.defined() && x.rank() == 3 && x.dim(2) == dim_,
           "MultiHeadAttention(dim ", dim_, "): a step's input must be [B, n, ", dim_, "], got ",
           x.defined() ? x.shape().ToString() : std::string("undefined"));
  const Var key = wk_->Forward(x), value = wv_->Forward(x);
  Var keys = key, values = value;
  if (past.length() > 0) {
    SP_CHECK(past.keys.dim(0) == x.dim(0) && past.keys.dim(2) == dim_ &&
                 past.values.shape() == past.keys.shape(),
             "MultiHeadAttention: cached keys ", past.keys.shape(), " and values ",
             past.values.shape(), " do not fit a step input ", x.shape());
    keys = concat({constant(past.keys), key}, 1);
    values = concat({constant(past.values), value}, 1);
  }
  // The kernel's causal mask with Tk > Tq: query i sees keys j <= i + (Tk -
  // Tq), every cached key and the new ones up to itself.
  const Var out = wo_->Forward(
      multi_head_attention(wq_->Forward(x), keys, values, heads_, scale_, /*causal=*/true));
  if (next != nullptr) {
    next->keys = keys.value();
    next->values = values.value();
  }
  return out;
}

const OptionFields<AttentionOptions>& AttentionOptions::Fields() {
  using O = AttentionOptions;
  static const auto* fields =
      &(new OptionFields<O>)
           ->Bool("causal", &O::causal, "Lower-triangular (autoregressive) masking")
           .Double("scale", &O::scale, 0.0, std::numeric_limits<double>::max(),
                   "Multiplies Q K^T in every head; 0: 1/sqrt(dim / heads)")
           .Bool("bias", &O::bias, "Biases on the four projections")
           .Enum("dtype", &O::dtype, {DType::kFloat32, DType::kFloat64}, stillpoint::ToString,
                 "The dtype of the parameters");
  return *fields;
}

bool AttentionOptions::IsValid(std::string* error) const {
  const std::string problem = Fields().Check(*this);
  if (!problem.empty() && error != nullptr) *error = "AttentionOptions: " + problem;
  return problem.empty();
}

std::string AttentionOptions::ToString() const { return Fields().Describe(*this) + "\n"; }

}  // namespace stillpoint
