#include "layers/probabilistic_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <sstream>
#include <utility>

#include "framework/ops_em.h"
#include "framework/ops.h"

namespace stillpoint {
namespace {

constexpr double kLogTwoPi = 1.8378770664093453;  // log(2 pi)

// A precision broadcastable to [B, H, S] (rank 3) as [b, H, s, 1] (scales key rows).
Var AsRows(const Var& p) { return reshape(p, Shape{p.dim(0), p.dim(1), p.dim(2), 1}); }
// ... as [b, H, 1, s] (scales the key columns of logits [B, H, N, S]).
Var AsCols(const Var& p) { return reshape(p, Shape{p.dim(0), p.dim(1), 1, p.dim(2)}); }

// |x|^2 over the last axis, kept: [..., 1].
Var SquaredNorm(const Var& x) { return sum(square(x), -1, /*keepdim=*/true); }
// |x_j|^2 of [B, H, S, d] as columns [B, H, 1, S].
Var SquaredNormCols(const Var& x) {
  Var norms = sum(square(x), -1);  // [B, H, S]
  return reshape(norms, Shape{norms.dim(0), norms.dim(1), 1, norms.dim(2)});
}

double MinValue(const Var& x) {
  const std::vector<double> values = x.value().ToVector();
  return values.empty() ? 0.0 : *std::min_element(values.begin(), values.end());
}

void CheckPrecision(const char* op,
                    const char* what,
                    const Var& p,
                    int64_t batch,
                    int64_t heads,
                    int64_t keys,
                    bool allow_zero) {
  SP_CHECK(p.defined() && p.rank() == 3 && (p.dim(0) == 1 || p.dim(0) == batch) &&
               p.dim(1) == heads && (p.dim(2) == 1 || p.dim(2) == keys),
           op, ": ", what, " must broadcast to [", batch, ", ", heads, ", ", keys,
           "] as a rank-3 tensor, got ",
           p.defined() ? p.shape().ToString() : std::string("undefined"));
  const double smallest = MinValue(p);
  SP_CHECK(allow_zero ? smallest >= 0.0 : smallest > 0.0, op, ": ", what, " must be ",
           allow_zero ? ">= 0" : "> 0", ", smallest entry is ", smallest);
}

// log pi_ij normalised over j (a scalar -log S when log_prior is undefined).
Var NormalizedLogPrior(const Var& log_prior, const Var& like, int64_t keys) {
  if (!log_prior.defined()) return scalar_like(like, -std::log(static_cast<double>(keys)));
  SP_CHECK(log_prior.dim(-1) == keys, "log prior ", log_prior.shape(), " must have ", keys,
           " entries on its last axis");
  return sub(log_prior, logsumexp(log_prior, /*keepdim=*/true));
}

// log N(q_i; xi_j, alpha_j^-1 I_d): [B, H, N, S].
Var LogGaussian(const Var& q, const Var& xi, const Var& precision) {
  const double d = static_cast<double>(q.dim(-1));
  Var sq =
      add(sub(SquaredNorm(q), mul_scalar(matmul(q, xi, false, true), 2.0)), SquaredNormCols(xi));
  Var cols = AsCols(precision);
  return add(mul(cols, mul_scalar(sq, -0.5)),
             add_scalar(mul_scalar(log(cols), 0.5 * d), -0.5 * d * kLogTwoPi));
}

// sum_i w_ij |x_i - c_j|^2 = (w^T |x|^2)_j - 2 c_j . (w^T x)_j + (sum_i w_ij) |c_j|^2, [B, H, S].
Var WeightedSquaredDistance(
    const Var& w, const Var& x, const Var& weighted_x, const Var& weight_sum, const Var& centres) {
  Var xx = matmul(w, SquaredNorm(x), /*transpose_a=*/true);  // [B, H, S, 1]
  xx = reshape(xx, Shape{xx.dim(0), xx.dim(1), xx.dim(2)});
  return add(sub(xx, mul_scalar(sum(mul(centres, weighted_x), -1), 2.0)),
             mul(weight_sum, sum(square(centres), -1)));
}

// sum of a Var's entries as a double, without recording.
double Total(const Var& x) {
  NoGrad no_grad;
  return sum(x).item();
}

bool IsInfinite(double x) { return std::isinf(x) && x > 0.0; }

}  // namespace

// ----------------------------------------------------------------- AdaptKeys

const OptionFields<KeyAdaptationOptions>& KeyAdaptationOptions::Fields() {
  using O = KeyAdaptationOptions;
  constexpr double kInf = std::numeric_limits<double>::max();
  static const auto* fields =
      &(new OptionFields<O>)
           ->Int("iterations", &O::iterations, 0, 1 << 16,
                 "probabilistic: online key adaptation, MAP-EM iterations over the keys given the "
                 "queries before value inference (0: off)")
           .Double("prior_precision", &O::key_prior_precision, 0.0, kInf,
                   "probabilistic: precision of the Gaussian prior centring each adapted key on "
                   "its projection (0: soft k-means)")
           .Bool("recentre_prior", &O::recentre_prior,
                 "probabilistic: centre the prior on the current key at each iteration (the "
                 "reference code's variant; not exact MAP-EM)")
           .Bool("adapt_precision", &O::adapt_precision,
                 "probabilistic: also re-estimate each key's precision (Gamma prior)")
           .Double("precision_prior_shape", &O::precision_prior_shape, 1.0, kInf,
                   "probabilistic: shape of the key precisions' Gamma prior (>= 1)")
           .Double("precision_prior_rate", &O::precision_prior_rate, 0.0, kInf,
                   "probabilistic: rate of the key precisions' Gamma prior");
  return *fields;
}

bool KeyAdaptationOptions::IsValid(std::string* error) const {
  KeyAdaptationOptions finite = *this;
  if (key_prior_precision == std::numeric_limits<double>::infinity()) {
    finite.key_prior_precision = 0.0;  // frozen keys
  }
  const std::string problem = Fields().Check(finite);
  if (!problem.empty() && error != nullptr) *error = "KeyAdaptationOptions: " + problem;
  return problem.empty();
}

std::string KeyAdaptationOptions::ToString() const { return Fields().Describe(*this) + "\n"; }

KeyAdaptationResult AdaptKeys(const Var& queries,
                              const Var& keys,
                              const Var& key_precision,
                              const Var& log_prior,
                              const KeyAdaptationOptions& options) {
  const char* op = "AdaptKeys";
  SP_CHECK(queries.rank() == 4 && keys.rank() == 4 && queries.dim(0) == keys.dim(0) &&
               queries.dim(1) == keys.dim(1) && queries.dim(3) == keys.dim(3),
           op, ": queries [B, H, N, d] ", queries.shape(), " and keys [B, H, S, d] ", keys.shape(),
           " do not match");
  const int64_t batch = keys.dim(0), heads = keys.dim(1), num_keys = keys.dim(2);
  const double d = static_cast<double>(keys.dim(3));
  CheckPrecision(op, "key_precision", key_precision, batch, heads, num_keys, false);
  const double lambda = options.key_prior_precision;
  // precision_prior_shape >= 1, else the precision update can turn negative.
  std::string error;
  SP_CHECK(options.IsValid(&error), op, ": ", error);

  Var log_pi = NormalizedLogPrior(log_prior, queries, num_keys);
  Var alpha = broadcast_to(key_precision, Shape{batch, heads, num_keys});
  Var xi = keys;
  const double a = options.precision_prior_shape, b = options.precision_prior_rate;

  KeyAdaptationResult result;
  for (int it = 0;; ++it) {
    Var logits = add(log_pi, LogGaussian(queries, xi, alpha));  // [B, H, N, S]
    double log_posterior = Total(logsumexp(logits));
    if (lambda > 0.0 && !IsInfinite(lambda)) {
      NoGrad no_grad;
      log_posterior +=
          static_cast<double>(batch * heads * num_keys) * 0.5 * d * (std::log(lambda) - kLogTwoPi) -
          0.5 * lambda * sum(square(sub(xi, keys))).item();
    }
    if (options.adapt_precision) {
      NoGrad no_grad;
      log_posterior += (a - 1.0) * sum(log(alpha)).item() - b * sum(alpha).item();
    }
    result.log_posterior.push_back(log_posterior);
    if (it == options.iterations) break;

    Var w = softmax(logits);
    Var weight_sum = sum(w, 2);                                 // [B, H, S]
    Var weighted_q = matmul(w, queries, /*transpose_a=*/true);  // [B, H, S, d]
    if (!IsInfinite(lambda)) {
      Var centre = options.recentre_prior ? xi : keys;
      Var alpha_rows = AsRows(alpha);
      xi = div(add(mul_scalar(centre, lambda), mul(alpha_rows, weighted_q)),
               add_scalar(mul(alpha_rows, AsRows(weight_sum)), lambda));
    }
    if (options.adapt_precision) {
      Var spread = WeightedSquaredDistance(w, queries, weighted_q, weight_sum, xi);
      alpha =
          div(add_scalar(mul_scalar(weight_sum, d), 2.0 * (a - 1.0)), add_scalar(spread, 2.0 * b));
    }
  }
  result.keys = xi;
  result.key_precision = alpha;
  return result;
}

// ---------------------------------------------------- PropagateClampedValues

ValueBeliefResult PropagateClampedValues(const Var& queries,
                                         const Var& keys,
                                         const Var& key_precision,
                                         const Var& values,
                                         const Var& value_precision,
                                         const Var& log_prior,
                                         const Var& clamped_values,
                                         const Tensor& clamp_mask,
                                         const ValueBeliefOptions& options) {
  const char* op = "PropagateClampedValues";
  SP_CHECK(
      queries.rank() == 4 && keys.rank() == 4 && values.rank() == 4 && clamped_values.rank() == 4,
      op, ": queries, keys, values and clamped_values must be rank 4");
  const int64_t batch = keys.dim(0), heads = keys.dim(1), num_keys = keys.dim(2);
  const int64_t num_queries = queries.dim(2);
  const double dv = static_cast<double>(values.dim(3));
  SP_CHECK(queries.shape() == Shape({batch, heads, num_queries, keys.dim(3)}) &&
               values.dim(0) == batch && values.dim(1) == heads && values.dim(2) == num_keys &&
               clamped_values.shape() == Shape({batch, heads, num_queries, values.dim(3)}),
           op, ": shapes do not agree: queries ", queries.shape(), ", keys ", keys.shape(),
           ", values ", values.shape(), ", clamped_values ", clamped_values.shape());
  SP_CHECK(clamp_mask.defined() && clamp_mask.shape() == Shape({batch, num_queries}), op,
           ": clamp_mask must be [", batch, ", ", num_queries, "], got ",
           clamp_mask.defined() ? clamp_mask.shape().ToString() : std::string("undefined"));
  CheckPrecision(op, "key_precision", key_precision, batch, heads, num_keys, false);
  CheckPrecision(op, "value_precision", value_precision, batch, heads, num_keys, false);
  const double lambda = options.value_prior_precision;
  std::string error;
  SP_CHECK(options.IsValid(&error), op, ": ", error);
  SP_CHECK(!options.adapt_mixing || !log_prior.defined() || log_prior.rank() < 2 ||
               log_prior.dim(-2) == 1,
           op,
           ": adapt_mixing needs a prior shared by all query units (extent 1 on axis -2), "
           "got log_prior ",
           log_prior.shape());

  std::vector<double> mask_values = clamp_mask.ToVector();
  for (double& m : mask_values) m = m != 0.0 ? 1.0 : 0.0;
  Var clamped(Tensor::FromVector(Shape{batch, 1, num_queries, 1}, mask_values, values.dtype()));
  const Shape per_key{batch, heads, num_keys};
  Var alpha = broadcast_to(key_precision, per_key);
  Var beta = broadcast_to(value_precision, per_key);
  Var log_pi = NormalizedLogPrior(log_prior, queries, num_keys);
  Var mu = values;
  const Var query_term = LogGaussian(queries, keys, alpha);  // fixed: keys do not move
  const double a = options.precision_prior_shape, b = options.precision_prior_rate;
  const double c = options.mixing_concentration;

  ValueBeliefResult result;
  result.log_prior = log_prior;
  for (int it = 0;; ++it) {
    Var value_term = mul(clamped, LogGaussian(clamped_values, mu, beta));
    Var logits = add(add(log_pi, query_term), value_term);  // [B, H, N, S]
    double log_posterior = Total(logsumexp(logits));
    {
      NoGrad no_grad;
      if (lambda > 0.0 && !IsInfinite(lambda)) {
        log_posterior += static_cast<double>(batch * heads * num_keys) * 0.5 * dv *
                             (std::log(lambda) - kLogTwoPi) -
                         0.5 * lambda * sum(square(sub(mu, values))).item();
      }
      if (options.adapt_value_precision) {
        log_posterior += (a - 1.0) * sum(log(beta)).item() - b * sum(beta).item();
      }
      if (options.adapt_mixing && c != 1.0) {
        Var shared = broadcast_to(log_pi, Shape{batch, heads, 1, num_keys});
        log_posterior += (c - 1.0) * sum(shared).item();
      }
    }
    result.log_posterior.push_back(log_posterior);
    if (it == options.iterations) break;

    Var w = softmax(logits);
    Var w_clamped = mul(w, clamped);
    Var weight_sum = sum(w_clamped, 2);                                        // [B, H, S]
    Var weighted_v = matmul(w_clamped, clamped_values, /*transpose_a=*/true);  // [B, H, S, dv]
    if (!IsInfinite(lambda)) {
      Var beta_rows = AsRows(beta);
      mu = div(add(mul_scalar(values, lambda), mul(beta_rows, weighted_v)),
               add_scalar(mul(beta_rows, AsRows(weight_sum)), lambda));
    }
    if (options.adapt_value_precision) {
      Var spread = WeightedSquaredDistance(w_clamped, clamped_values, weighted_v, weight_sum, mu);
      beta =
          div(add_scalar(mul_scalar(weight_sum, dv), 2.0 * (a - 1.0)), add_scalar(spread, 2.0 * b));
    }
    if (options.adapt_mixing) {
      Var counts = add_scalar(sum(w, 2), c - 1.0);  // [B, H, S]
      Var log_mix = sub(log(counts), log(sum(counts, -1, /*keepdim=*/true)));
      log_pi = AsCols(log_mix);
      result.log_prior = log_pi;
    }
  }
  result.values = mu;
  result.value_precision = beta;
  return result;
}

// ------------------------------------------------------ ProbabilisticAttention

namespace {

// The options with their 0 defaults filled in (checked first).
ProbabilisticAttentionOptions Resolve(ProbabilisticAttentionOptions o) {
  std::string error;
  SP_CHECK(o.IsValid(&error), "ProbabilisticAttention: ", error);
  if (o.head_dim == 0) o.head_dim = o.dim / o.heads;
  if (o.value_head_dim == 0) o.value_head_dim = o.head_dim;
  if (o.query_precision == 0.0)
    o.query_precision = 1.0 / std::sqrt(static_cast<double>(o.head_dim));
  return o;
}

}  // namespace

ProbabilisticAttention::ProbabilisticAttention(const ProbabilisticAttentionOptions& options,
                                               Rng& rng)
    : options_(Resolve(options)) {
  const ProbabilisticAttentionOptions& o = options_;
  log_query_precision_ =
      RegisterParameter("log_query_precision",
                        Tensor::Full({o.heads}, std::log(o.query_precision), o.dtype),
                        o.learn_precisions);
  if (o.value_precision > 0.0) {
    log_value_precision_ =
        RegisterParameter("log_value_precision",
                          Tensor::Full({o.heads}, std::log(o.value_precision), o.dtype),
                          o.learn_precisions);
  }
  LinearOptions linear;
  linear.bias = o.projection_bias;
  linear.dtype = o.dtype;
  wq_ = RegisterModule("wq", std::make_shared<Linear>(o.dim, o.heads * o.head_dim, rng, linear));
  wk_ = RegisterModule("wk", std::make_shared<Linear>(o.dim, o.heads * o.head_dim, rng, linear));
  wv_ = RegisterModule("wv",
                       std::make_shared<Linear>(o.dim, o.heads * o.value_head_dim, rng, linear));
  wo_ = RegisterModule("wo",
                       std::make_shared<Linear>(o.heads * o.value_head_dim, o.dim, rng, linear));
}

std::string ProbabilisticAttention::Name() const {
  std::ostringstream out;
  out << "ProbabilisticAttention(heads " << options_.heads << ", head_dim " << options_.head_dim
      << ", " << stillpoint::ToString(options_.solve.mode) << ")";
  return out.str();
}

Var ProbabilisticAttention::query_precision() const { return exp(log_query_precision_); }

Var ProbabilisticAttention::value_precision() const {
  if (log_value_precision_.defined()) return exp(log_value_precision_);
  return Var(Tensor::Zeros({options_.heads}, options_.dtype));
}

Var ProbabilisticAttention::SplitHeads(const Var& x, int64_t head_width) const {
  return permute(reshape(x, Shape{x.dim(0), x.dim(1), options_.heads, head_width}), {0, 2, 1, 3});
}

ProbabilisticProblem ProbabilisticAttention::Prepare(const Var& x,
                                                     const Var& context,
                                                     const ProbabilisticAttentionInputs& given,
                                                     bool with_initial_state) const {
  const ProbabilisticAttentionOptions& o = options_;
  const KeyAdaptationOptions& key_adaptation =
      test_time_ ? test_time_->key_adaptation : o.key_adaptation;
  const ValueBeliefOptions& value_belief = test_time_ ? test_time_->value_belief : o.value_belief;
  ProbabilisticAttentionInputs with_clamps;
  if (test_time_ && !given.clamp_mask.defined() && test_time_->clamp_mask.defined()) {
    with_clamps = given;
    with_clamps.clamp_mask = test_time_->clamp_mask;
    with_clamps.clamped_values = test_time_->clamped_values;
  }
  const ProbabilisticAttentionInputs& inputs =
      with_clamps.clamp_mask.defined() ? with_clamps : given;
  const char* op = "ProbabilisticAttention";
  for (const Var* input : {&x, &context}) {
    SP_CHECK(input->defined() && input->rank() == 3 && input->dim(2) == o.dim &&
                 input->dtype() == o.dtype,
             op, ": inputs must be [B, T, ", o.dim, "] ", stillpoint::ToString(o.dtype), ", got ",
             input->defined() ? input->shape().ToString() : std::string("undefined"));
  }
  SP_CHECK(x.dim(0) == context.dim(0), op, ": x ", x.shape(), " and context ", context.shape(),
           " have different batch sizes");
  const int64_t batch = x.dim(0), heads = o.heads, num_queries = x.dim(1);
  const int64_t num_keys = context.dim(1);

  Var q = SplitHeads(wq_->Forward(x), o.head_dim);         // [B, H, N, d]
  Var xi = SplitHeads(wk_->Forward(context), o.head_dim);  // [B, H, S, d]
  Var mu = SplitHeads(wv_->Forward(context), o.value_head_dim);
  if (inputs.positions != nullptr && inputs.positions->Rotary()) {
    SP_CHECK(num_queries == num_keys, op, ": rotary positions need self-attention (N = S), got N ",
             num_queries, ", S ", num_keys);
    q = ApplyRotary(q, *inputs.positions, 2);
    xi = ApplyRotary(xi, *inputs.positions, 2);
  }

  bool per_key_alpha = inputs.key_precision.defined();
  bool per_key_beta = inputs.value_precision.defined();
  Var alpha = per_key_alpha ? inputs.key_precision : reshape(query_precision(), Shape{1, heads, 1});
  Var beta = per_key_beta ? inputs.value_precision : reshape(value_precision(), Shape{1, heads, 1});
  if (o.contraction > 0.0 && !per_key_beta && o.value_precision > 0.0) {
    // mu_j / sqrt(1 + beta |mu_j|^2 / c): beta |mu_j|^2 < c (see the option).
    const Var scaled = mul_scalar(mul(AsRows(beta), SquaredNorm(mu)), 1.0 / o.contraction);
    mu = div(mu, sqrt(add_scalar(scaled, 1.0)));
  }
  CheckPrecision(op, "key precision", alpha, batch, heads, num_keys, false);
  CheckPrecision(op, "value precision", beta, batch, heads, num_keys, true);
  Var base_log_prior = inputs.log_prior;
  auto magnitude = [&](const Var& keys, const Var& values) {
    return add(mul(AsCols(alpha), mul_scalar(SquaredNormCols(keys), 0.5)),
               mul(AsCols(beta), mul_scalar(SquaredNormCols(values), 0.5)));
  };
  auto with_magnitude = [&](const Var& keys, const Var& values) {
    if (!o.magnitude_prior) return base_log_prior;
    Var m = magnitude(keys, values);
    return base_log_prior.defined() ? add(base_log_prior, m) : m;
  };

  ProbabilisticProblem problem;
  if (key_adaptation.iterations > 0) {
    KeyAdaptationResult adapted = AdaptKeys(q, xi, alpha, with_magnitude(xi, mu), key_adaptation);
    xi = adapted.keys;
    if (key_adaptation.adapt_precision) {
      alpha = adapted.key_precision;
      per_key_alpha = true;
    }
    problem.key_log_posterior = adapted.log_posterior;
  }
  bool mixing_adapted = false;
  if (inputs.clamp_mask.defined()) {
    SP_CHECK(
        inputs.clamped_values.defined() &&
            inputs.clamped_values.shape() == Shape({batch, num_queries, heads * o.value_head_dim}),
        op, ": clamped_values must be [", batch, ", ", num_queries, ", ", heads * o.value_head_dim,
        "] with a clamp_mask");
    problem.clamp_mask = inputs.clamp_mask;
    problem.clamped_values = SplitHeads(inputs.clamped_values, o.value_head_dim);
  }
  if (value_belief.iterations > 0) {
    SP_CHECK(problem.clamp_mask.defined(), op,
             ": value belief propagation needs clamp_mask and clamped_values");
    SP_CHECK(num_queries == num_keys, op,
             ": value belief propagation needs self-attention (N = S), got N ", num_queries, ", S ",
             num_keys);
    ValueBeliefResult belief =
        PropagateClampedValues(q, xi, alpha, mu, beta, with_magnitude(xi, mu),
                               problem.clamped_values, problem.clamp_mask, value_belief);
    mu = belief.values;
    if (value_belief.adapt_value_precision) {
      beta = belief.value_precision;
      per_key_beta = true;
    }
    if (value_belief.adapt_mixing) {
      base_log_prior = belief.log_prior;
      mixing_adapted = true;
    }
    problem.value_log_posterior = belief.log_posterior;
  }

  // The v-independent part of l_ij. Under the magnitude prior the key and
  // value norms cancel exactly, so they are left out rather than added and
  // subtracted.
  Var alpha_cols = AsCols(alpha);
  // One fused op for a precision per head (framework/ops_em.h).
  Var logits = per_key_alpha ? sub(mul(alpha_cols, matmul(q, xi, false, true)),
                                   mul(alpha_cols, mul_scalar(SquaredNorm(q), 0.5)))
                             : em_query_logits(q, xi, alpha_cols);
  if (base_log_prior.defined()) logits = add(logits, base_log_prior);
  if (!o.magnitude_prior || mixing_adapted) logits = sub(logits, magnitude(xi, mu));
  if (o.log_normalizer && per_key_alpha) {
    logits = add(logits, mul_scalar(log(alpha_cols), 0.5 * static_cast<double>(o.head_dim)));
  }
  if (o.log_normalizer && per_key_beta) {
    logits =
        add(logits, mul_scalar(log(AsCols(beta)), 0.5 * static_cast<double>(o.value_head_dim)));
  }
  logits = ApplyAttentionMask(logits, MakeAttentionMask(inputs.mask, o.causal, batch, heads,
                                                        num_queries, num_keys, o.dtype));

  problem.context.logits = logits;
  problem.context.values = mu;
  if (per_key_beta) {
    problem.context.value_precision_per_key =
        AsCols(broadcast_to(beta, Shape{batch, heads, num_keys}));
  } else {
    problem.context.value_precision = reshape(beta, Shape{1, heads, 1, 1});
  }
  if (with_initial_state) problem.initial_state = matmul(softmax(logits), mu);
  return problem;
}

const ContextFields<ProbabilisticContext>& ProbabilisticContext::Fields() {
  using C = ProbabilisticContext;
  static const auto fields = ContextFields<C>("ProbabilisticContext")
                                 .PerSample("logits", &C::logits)
                                 .PerSample("values", &C::values)
                                 .Shared("value_precision", &C::value_precision)
                                 .PerSample("value_precision_per_key", &C::value_precision_per_key);
  return fields;
}

Var ProbabilisticAttention::Logits(const Var& v, const ProbabilisticContext& ctx) const {
  const Var& logits = ctx.logits;
  const Var& mu = ctx.values;
  const Var& beta = ctx.ValuePrecision();
  SP_CHECK(v.rank() == 4 && v.dim(0) == mu.dim(0) && v.dim(1) == mu.dim(1) &&
               v.dim(2) == logits.dim(2) && v.dim(3) == mu.dim(3),
           "ProbabilisticAttention: state ", v.shape(), " does not match values ", mu.shape(),
           " and logits ", logits.shape());
  Var v_term = sub(matmul(v, mu, false, true), mul_scalar(SquaredNorm(v), 0.5));
  return add(logits, mul(beta, v_term));
}

Var ProbabilisticAttention::Responsibilities(const Var& v, const ProbabilisticContext& ctx) const {
  return softmax(Logits(v, ctx));
}

Var ProbabilisticAttention::Energy(const Var& v, const ProbabilisticContext& ctx) const {
  Var per_query = logsumexp(Logits(v, ctx));  // [B, H, N]
  return neg(sum(sum(per_query, -1), -1));
}

Var ProbabilisticAttention::Update(const Var& v, const ProbabilisticContext& ctx) const {
  const Var& mu = ctx.values;
  const Var& beta = ctx.ValuePrecision();
  // Uniform beta: eq 19 (also right at beta = 0, where eq 15 would be 0/0),
  // fused (framework/ops_em.h: the value term's -|v|^2 / 2 is a constant
  // per query row, which the softmax ignores).
  if (beta.dim(-1) == 1) {
    SP_CHECK(
        v.rank() == 4 && v.dim(0) == mu.dim(0) && v.dim(1) == mu.dim(1) && v.dim(3) == mu.dim(3),
        "ProbabilisticAttention: state ", v.shape(), " does not match values ", mu.shape());
    return em_update(v, ctx.logits, mu, beta);
  }
  Var w = Responsibilities(v, ctx);
  Var weighted = mul(w, beta);
  return div(matmul(weighted, mu), sum(weighted, -1, /*keepdim=*/true));
}

Var ProbabilisticAttention::Readout(const Var& v, const ProbabilisticProblem& problem) const {
  Var out = v;
  if (options_.force_clamped_output && problem.clamp_mask.defined()) {
    std::vector<double> m = problem.clamp_mask.ToVector();
    for (double& value : m) value = value != 0.0 ? 1.0 : 0.0;
    Var clamped(Tensor::FromVector(Shape{v.dim(0), 1, v.dim(2), 1}, m, v.dtype()));
    out = add(out, mul(clamped, sub(problem.clamped_values, out)));
  }
  Var merged = reshape(permute(out, {0, 2, 1, 3}),
                       Shape{v.dim(0), v.dim(2), options_.heads * options_.value_head_dim});
  return wo_->Forward(merged);
}

Var ProbabilisticAttention::Forward(const Var& x,
                                    const Var& context,
                                    const ProbabilisticAttentionInputs& inputs) const {
  ProbabilisticProblem problem = Prepare(x, context, inputs);
  Var v = Solve(problem.initial_state, problem.context, options_.solve);
  return Readout(v, problem);
}

Var ProbabilisticAttention::Forward(const Var& x,
                                    const ProbabilisticAttentionInputs& inputs) const {
  return Forward(x, x, inputs);
}

const OptionFields<ValueBeliefOptions>& ValueBeliefOptions::Fields() {
  using O = ValueBeliefOptions;
  constexpr double kInf = std::numeric_limits<double>::max();
  static const auto* fields =
      &(new OptionFields<O>)
           ->Int("iterations", &O::iterations, 0, std::numeric_limits<int>::max(),
                 "EM iterations over the value parameters (0: off)")
           .Double("value_prior_precision", &O::value_prior_precision, 0.0, kInf,
                   "Precision of the Gaussian prior on each value mean, centred on the "
                   "pretrained value (0: the weighted mean of the clamped values; +infinity, "
                   "accepted by IsValid, freezes the values)")
           .Bool("adapt_value_precision", &O::adapt_value_precision,
                 "Re-estimate the value precisions (Gamma prior)")
           .Double("precision_prior_shape", &O::precision_prior_shape, 1.0, kInf,
                   "Shape of the value precisions' Gamma prior (>= 1, else the precision update "
                   "can turn negative)")
           .Double("precision_prior_rate", &O::precision_prior_rate, 0.0, kInf,
                   "Rate of the value precisions' Gamma prior")
           .Bool("adapt_mixing", &O::adapt_mixing,
                 "Re-estimate the mixing proportions (symmetric Dirichlet prior)")
           .Double("mixing_concentration", &O::mixing_concentration, 1.0, kInf,
                   "Concentration of the mixing proportions' Dirichlet prior (>= 1)");
  return *fields;
}

bool ValueBeliefOptions::IsValid(std::string* error) const {
  ValueBeliefOptions finite = *this;
  if (value_prior_precision == std::numeric_limits<double>::infinity()) {
    finite.value_prior_precision = 0.0;  // frozen values
  }
  const std::string problem = Fields().Check(finite);
  if (!problem.empty() && error != nullptr) *error = "ValueBeliefOptions: " + problem;
  return problem.empty();
}

std::string ValueBeliefOptions::ToString() const { return Fields().Describe(*this) + "\n"; }

const OptionFields<ProbabilisticAttentionOptions>& ProbabilisticAttentionOptions::Fields() {
  using O = ProbabilisticAttentionOptions;
  constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();
  constexpr double kInf = std::numeric_limits<double>::max();
  static const auto* fields =
      &(new OptionFields<O>)
           ->Int("dim", &O::dim, 1, kNoLimit, "Model width of x and the context (and the output)")
           .Int("heads", &O::heads, 1, kNoLimit, "Attention heads")
           .Int("head_dim", &O::head_dim, 0, kNoLimit, "Query/key width d per head; 0: dim / heads")
           .Int("value_head_dim", &O::value_head_dim, 0, kNoLimit,
                "Value width dv per head; 0: head_dim")
           .Double("query_precision", &O::query_precision, 0.0, kInf,
                   "Initial uniform query/key precision alpha; 0: 1/sqrt(head_dim)")
           .Double("value_precision", &O::value_precision, 0.0, kInf,
                   "Initial uniform value precision beta (0: standard attention)")
           .Bool("learn_precisions", &O::learn_precisions, "Learn the precisions alpha and beta")
           .Double("contraction", &O::contraction, OptionBounds::Open(0.0, 1.0).OrZero(),
                   "Scale the values to beta |mu_j|^2 < c so the EM map contracts by at most c "
                   "(0: off)")
           .Bool("magnitude_prior", &O::magnitude_prior,
                 "pi_ij proportional to exp(alpha_j/2 |xi_j|^2 + beta_j/2 |mu_j|^2) (eq 17)")
           .Bool("log_normalizer", &O::log_normalizer,
                 "Keep (d/2) log alpha_j + (dv/2) log beta_j in the logits")
           .Bool("causal", &O::causal, "Autoregressive masking")
           .Bool("projection_bias", &O::projection_bias, "Biases on the projections")
           .Include("solve.", &O::solve, EnergySolveOptions::Fields())
           .Include("key_adaptation.", &O::key_adaptation, KeyAdaptationOptions::Fields())
           .Include("value_belief.", &O::value_belief, ValueBeliefOptions::Fields())
           .Bool("force_clamped_output", &O::force_clamped_output,
                 "Output the clamped value itself at clamped units")
           .Enum("dtype", &O::dtype, {DType::kFloat32, DType::kFloat64}, stillpoint::ToString,
                 "The dtype of the parameters");
  return *fields;
}

bool ProbabilisticAttentionOptions::IsValid(std::string* error) const {
  // The nested options are checked by their own IsValid (which accepts an
  // infinite prior precision: frozen keys or values).
  ProbabilisticAttentionOptions own = *this;
  own.key_adaptation = KeyAdaptationOptions();
  own.value_belief = ValueBeliefOptions();
  std::string problem = Fields().Check(own);
  if (problem.empty() && head_dim == 0 && dim % heads != 0) {
    problem = "dim " + std::to_string(dim) + " is not a multiple of heads " +
              std::to_string(heads) + "; set head_dim";
  }
  std::string nested;
  if (problem.empty() && !key_adaptation.IsValid(&nested)) problem = "key_adaptation: " + nested;
  if (problem.empty() && !value_belief.IsValid(&nested)) problem = "value_belief: " + nested;
  if (!problem.empty() && error != nullptr) *error = "ProbabilisticAttentionOptions: " + problem;
  return problem.empty();
}

std::string ProbabilisticAttentionOptions::ToString() const {
  return Fields().Describe(*this) + "\n";
}

}  // namespace stillpoint
