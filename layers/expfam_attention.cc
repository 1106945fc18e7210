#include "layers/expfam_attention.h"

#include <cmath>
#include <limits>
#include <sstream>
#include <utility>

#include "framework/init.h"
#include "framework/ops.h"

namespace stillpoint {

const char* ToString(ExpFamMeasure measure) {
  switch (measure) {
    case ExpFamMeasure::kDiscrete:
      return "discrete";
    case ExpFamMeasure::kGaussian:
      return "gaussian";
    case ExpFamMeasure::kMixture:
      return "mixture";
  }
  return "unknown";
}

bool StringToExpFamMeasure(const std::string& text, ExpFamMeasure* measure) {
  for (ExpFamMeasure m :
       {ExpFamMeasure::kDiscrete, ExpFamMeasure::kGaussian, ExpFamMeasure::kMixture}) {
    if (text == ToString(m)) {
      *measure = m;
      return true;
    }
  }
  return false;
}

const char* ToString(ExpFamUpdate update) {
  return update == ExpFamUpdate::kCccp ? "cccp" : "residual";
}

bool StringToExpFamUpdate(const std::string& text, ExpFamUpdate* update) {
  if (text == "cccp") {
    *update = ExpFamUpdate::kCccp;
  } else if (text == "residual") {
    *update = ExpFamUpdate::kResidual;
  } else {
    return false;
  }
  return true;
}

ExpFamAttention::ExpFamAttention(const ExpFamAttentionOptions& options, Rng& rng)
    : options_(options) {
  const ExpFamAttentionOptions& o = options_;
  std::string error;
  SP_CHECK(o.IsValid(&error), "ExpFamAttention: ", error);
  const int64_t dh = head_dim();
  switch (o.measure) {
    case ExpFamMeasure::kDiscrete: {
      beta_ = RegisterParameter("beta", Tensor::Full({o.heads}, o.beta, o.dtype), o.learn_beta);
      if (o.project_patterns) {
        LinearOptions linear;
        linear.bias = false;
        linear.dtype = o.dtype;
        wk_ = RegisterModule("wk", std::make_shared<Linear>(o.dim, o.dim, rng, linear));
      }
      break;
    }
    case ExpFamMeasure::kGaussian: {
      Tensor mu(Shape{o.heads, dh}, o.dtype);
      init::Normal(mu, 0.0, 0.02, rng);
      mu_ = RegisterParameter("mu", mu);
      break;
    }
    case ExpFamMeasure::kMixture: {
      Tensor means(Shape{o.heads, o.components, dh}, o.dtype);
      init::Normal(means, 0.0, 1.0 / std::sqrt(static_cast<double>(dh)), rng);
      means_ = RegisterParameter("means", means);
      log_weights_ =
          RegisterParameter("log_weights", Tensor::Zeros({o.heads, o.components}, o.dtype));
      break;
    }
  }
  if (o.measure != ExpFamMeasure::kDiscrete) {
    // Sigma = L L^T starts small (eigenvalues around 0.25), so the CCCP map
    // eta <- mu + Sigma eta starts as a contraction.
    Tensor scale(Shape{o.heads, dh, dh}, o.dtype);
    init::Normal(scale, 0.0, 0.5 / std::sqrt(static_cast<double>(dh)), rng);
    scale_ = RegisterParameter("scale", scale);
  }
  if (o.query_field) {
    LinearOptions linear;
    linear.bias = false;
    linear.dtype = o.dtype;
    wq_ = RegisterModule("wq", std::make_shared<Linear>(o.dim, o.dim, rng, linear));
  }
  if (o.update == ExpFamUpdate::kResidual && o.layer_norm) {
    LayerNormOptions norm;
    norm.eps = o.layer_norm_eps;
    norm.elementwise_affine = o.layer_norm_affine;
    norm.dtype = o.dtype;
    norm_ = RegisterModule("norm", std::make_shared<LayerNorm>(o.dim, norm));
  }
}

std::string ExpFamAttention::Name() const {
  std::ostringstream out;
  out << "ExpFamAttention(" << stillpoint::ToString(options_.measure) << ", "
      << stillpoint::ToString(options_.update) << (norm_ ? " + layer norm" : "") << ", heads "
      << options_.heads << ")";
  return out.str();
}

Var ExpFamAttention::SplitHeads(const Var& x) const {
  SP_CHECK(x.rank() == 3 && x.dim(2) == options_.dim, "ExpFamAttention: tokens must be [B, N, ",
           options_.dim, "], got ", x.shape());
  return permute(reshape(x, Shape{x.dim(0), x.dim(1), options_.heads, head_dim()}), {0, 2, 1, 3});
}

Var ExpFamAttention::MergeHeads(const Var& x) const {
  return reshape(permute(x, {0, 2, 1, 3}), Shape{x.dim(0), x.dim(2), options_.dim});
}

Var ExpFamAttention::PatternNorm() const {
  SP_CHECK(options_.measure == ExpFamMeasure::kDiscrete && options_.contraction > 0.0,
           "ExpFamAttention: only the discrete measure with contraction > 0 rescales its "
           "patterns");
  return sqrt(rdiv_scalar(options_.contraction, beta_));
}

Var ExpFamAttention::Covariance() const {
  SP_CHECK(scale_.defined(), "ExpFamAttention: the discrete measure has no covariance");
  return matmul(scale_, scale_, false, true);
}

Var ExpFamAttention::TimesCovariance(const Var& eta) const {
  const int64_t dh = head_dim();
  Var sigma = broadcast_to(Covariance(), Shape{eta.dim(0), options_.heads, dh, dh});
  return matmul(eta, sigma);  // Sigma is symmetric: rows eta Sigma = (Sigma eta)^T
}

const ContextFields<ExpFamContext>& ExpFamContext::Fields() {
  static const auto fields = ContextFields<ExpFamContext>("ExpFamContext")
                                 .PerSample("field", &ExpFamContext::field)
                                 .PerSample("patterns", &ExpFamContext::patterns)
                                 .PerSample("mask", &ExpFamContext::mask);
  return fields;
}

ExpFamContext ExpFamAttention::Prepare(const Var& patterns) const {
  return Prepare(patterns, Var());
}

ExpFamContext ExpFamAttention::Prepare(const Var& patterns, const Var& queries) const {
  ExpFamContext ctx;
  if (wq_) {
    SP_CHECK(queries.defined() && queries.rank() == 3 && queries.dim(2) == options_.dim &&
                 queries.dtype() == options_.dtype,
             "ExpFamAttention: query_field needs queries [B, N, ", options_.dim,
             "] of the layer's dtype, got ",
             queries.defined() ? queries.shape().ToString() : std::string("undefined"));
    ctx.field = wq_->Forward(queries);
  } else {
    SP_CHECK(!queries.defined(), "ExpFamAttention: queries are read only with query_field");
  }
  if (options_.measure != ExpFamMeasure::kDiscrete) {
    SP_CHECK(!patterns.defined(), "ExpFamAttention: the ", stillpoint::ToString(options_.measure),
             " measure takes no stored patterns");
    return ctx;
  }
  SP_CHECK(patterns.defined() && patterns.dtype() == options_.dtype,
           "ExpFamAttention: the discrete measure needs stored patterns [B, S, ", options_.dim,
           "] of the layer's dtype");
  Var split = SplitHeads(wk_ ? wk_->Forward(patterns) : patterns);  // [B, H, S, dh]
  if (options_.contraction > 0.0) {
    // x_s sqrt(c / beta_h) / |x_s| (the epsilon only guards a zero pattern).
    constexpr double kNormEps = 1e-12;
    Var inverse_norm = rsqrt(add_scalar(sum(square(split), -1, true), kNormEps));
    split = mul(mul(split, inverse_norm), reshape(PatternNorm(), Shape{1, options_.heads, 1, 1}));
  }
  ctx.patterns = split;
  return ctx;
}

Var ExpFamAttention::LogPartition(const Var& eta, const ExpFamContext& ctx) const {
  Var e = SplitHeads(eta);  // [B, H, N, dh]
  const int64_t heads = options_.heads;
  switch (options_.measure) {
    case ExpFamMeasure::kDiscrete: {
      const Var& x = ctx.patterns;
      Var scores = ApplyAttentionMask(
          mul(matmul(e, x, false, true), reshape(beta_, Shape{1, heads, 1, 1})), ctx.mask);
      return div(logsumexp(scores), reshape(beta_, Shape{1, heads, 1}));
    }
    case ExpFamMeasure::kGaussian: {
      Var linear = sum(mul(e, reshape(mu_, Shape{1, heads, 1, head_dim()})), -1);
      return add(linear, mul_scalar(sum(mul(e, TimesCovariance(e)), -1), 0.5));
    }
    case ExpFamMeasure::kMixture: {
      const int64_t k = options_.components;
      Var means = broadcast_to(means_, Shape{e.dim(0), heads, k, head_dim()});
      Var logits = add(matmul(e, means, false, true),
                       reshape(log_softmax(log_weights_), Shape{1, heads, 1, k}));
      return add(logsumexp(logits), mul_scalar(sum(mul(e, TimesCovariance(e)), -1), 0.5));
    }
  }
  return Var();
}

Var ExpFamAttention::LogPartitionGrad(const Var& eta, const ExpFamContext& ctx) const {
  Var e = SplitHeads(eta);
  const int64_t heads = options_.heads;
  switch (options_.measure) {
    case ExpFamMeasure::kDiscrete: {
      const Var& x = ctx.patterns;
      Var scores = ApplyAttentionMask(
          mul(matmul(e, x, false, true), reshape(beta_, Shape{1, heads, 1, 1})), ctx.mask);
      return MergeHeads(matmul(softmax(scores), x));
    }
    case ExpFamMeasure::kGaussian:
      return MergeHeads(add(TimesCovariance(e), reshape(mu_, Shape{1, heads, 1, head_dim()})));
    case ExpFamMeasure::kMixture: {
      const int64_t k = options_.components;
      Var means = broadcast_to(means_, Shape{e.dim(0), heads, k, head_dim()});
      Var logits = add(matmul(e, means, false, true),
                       reshape(log_softmax(log_weights_), Shape{1, heads, 1, k}));
      return MergeHeads(add(TimesCovariance(e), matmul(softmax(logits), means)));
    }
  }
  return Var();
}

Var ExpFamAttention::Weights(const Var& eta, const ExpFamContext& ctx) const {
  SP_CHECK(options_.measure == ExpFamMeasure::kDiscrete,
           "ExpFamAttention: only the discrete measure has pattern weights");
  const Var& x = ctx.patterns;
  Var scores =
      mul(matmul(SplitHeads(eta), x, false, true), reshape(beta_, Shape{1, options_.heads, 1, 1}));
  return softmax(ApplyAttentionMask(scores, ctx.mask));
}

Var ExpFamAttention::Energy(const Var& eta, const ExpFamContext& ctx) const {
  Var quadratic = mul_scalar(sum(sum(square(eta), -1), -1), 0.5);  // [B]
  Var energy = sub(quadratic, sum(sum(LogPartition(eta, ctx), -1), -1));
  if (wq_) energy = sub(energy, sum(sum(mul(eta, ctx.field), -1), -1));
  return energy;
}

Var ExpFamAttention::EnergyGrad(const Var& eta, const ExpFamContext& ctx) const {
  Var grad = sub(eta, LogPartitionGrad(eta, ctx));
  return wq_ ? sub(grad, ctx.field) : grad;
}

Var ExpFamAttention::Update(const Var& eta, const ExpFamContext& ctx) const {
  if (options_.update == ExpFamUpdate::kCccp) {
    Var step = LogPartitionGrad(eta, ctx);
    return wq_ ? add(ctx.field, step) : step;
  }
  const Var step = LogPartitionGrad(eta, ctx);
  // With the norm, the residual sum goes into the fused norm of a sum (the
  // same values as add then LayerNorm, without the intermediate tensor).
  return norm_ ? norm_->Forward(VarList{eta, step}) : add(eta, step);
}

Var ExpFamAttention::Forward(const Var& x) const {
  SP_CHECK(options_.measure != ExpFamMeasure::kDiscrete,
           "ExpFamAttention: the discrete measure needs stored patterns: Forward(x, patterns)");
  return Solve(x, Prepare(Var(), wq_ ? x : Var()), options_.solve);
}

Var ExpFamAttention::Forward(const Var& x, const Var& patterns) const {
  return Solve(x, Prepare(patterns, wq_ ? x : Var()), options_.solve);
}

const OptionFields<ExpFamAttentionOptions>& ExpFamAttentionOptions::Fields() {
  using O = ExpFamAttentionOptions;
  constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();
  constexpr double kInf = std::numeric_limits<double>::max();
  static const auto* fields =
      &(new OptionFields<O>)
           ->Enum("measure", &O::measure,
                  {ExpFamMeasure::kDiscrete, ExpFamMeasure::kGaussian, ExpFamMeasure::kMixture},
                  stillpoint::ToString, "The intrinsic measure")
           .Int("dim", &O::dim, 1, kNoLimit, "Width of the tokens (state and input)")
           .Int("heads", &O::heads, 1, kNoLimit,
                "Heads; dim must be a multiple. Each head has its own measure")
           .Int("components", &O::components, 1, kNoLimit, "Mixture measure: components K")
           .AppliesWhen([](const O& o) { return o.measure == ExpFamMeasure::kMixture; })
           .Double("beta", &O::beta, OptionBounds::OpenClosed(0.0, kInf),
                   "Discrete measure: initial inverse temperature beta of every head")
           .AppliesWhen([](const O& o) { return o.measure == ExpFamMeasure::kDiscrete; })
           .Bool("learn_beta", &O::learn_beta, "Discrete measure: learn beta")
           .Bool("project_patterns", &O::project_patterns,
                 "Discrete measure: project the stored patterns with W_K (dim -> dim)")
           .Double("contraction", &O::contraction, OptionBounds::Open(0.0, 1.0).OrZero(),
                   "Discrete measure: rescale each head's patterns to the norm sqrt(c / beta), "
                   "so the CCCP map contracts with factor at most c; 0: the patterns as given")
           .AppliesWhen([](const O& o) { return o.measure == ExpFamMeasure::kDiscrete; })
           .Enum("update", &O::update, {ExpFamUpdate::kCccp, ExpFamUpdate::kResidual},
                 stillpoint::ToString,
                 "cccp: energy descent; residual: the attention sublayer's update")
           .Bool("query_field", &O::query_field,
                 "The queries as an external field (needs update = cccp)")
           .Bool("layer_norm", &O::layer_norm,
                 "Residual update: renormalise with a layer norm over dim")
           .Double("layer_norm_eps", &O::layer_norm_eps, 0.0, kInf,
                   "The layer norm's epsilon (0 is allowed: exact normalisation)")
           .Bool("layer_norm_affine", &O::layer_norm_affine, "Learn the layer norm's gain and bias")
           .Include("solve.", &O::solve, EnergySolveOptions::Fields())
           .Enum("dtype", &O::dtype, {DType::kFloat32, DType::kFloat64}, stillpoint::ToString,
                 "The dtype of the parameters");
  return *fields;
}

bool ExpFamAttentionOptions::IsValid(std::string* error) const {
  // beta, contraction and components are checked only for the measure that reads them
  // (an unread value is left as it was accepted before).
  ExpFamAttentionOptions read = *this;
  const ExpFamAttentionOptions defaults;
  if (measure != ExpFamMeasure::kDiscrete) {
    read.beta = defaults.beta;
    read.contraction = defaults.contraction;
  }
  if (measure != ExpFamMeasure::kMixture) read.components = defaults.components;
  std::string problem = Fields().Check(read);
  if (problem.empty() && dim % heads != 0) {
    problem = "dim " + std::to_string(dim) + " must be a multiple of heads " +
              std::to_string(heads);
  }
  if (problem.empty() && query_field && update != ExpFamUpdate::kCccp) {
    problem =
        "query_field needs the cccp update (the residual update has no energy to add the field "
        "to)";
  }
  if (!problem.empty() && error != nullptr) *error = "ExpFamAttentionOptions: " + problem;
  return problem.empty();
}

std::string ExpFamAttentionOptions::ToString() const { return Fields().Describe(*this) + "\n"; }

}  // namespace stillpoint
