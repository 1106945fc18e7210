#include "layers/hopfield.h"

#include <cmath>
#include <limits>
#include <sstream>
#include <utility>

#include "framework/ops_hopfield.h"
#include "framework/init.h"
#include "framework/ops.h"

namespace stillpoint {
namespace {

// The options with their 0 defaults filled in (checked first: after it every
// size and beta is positive).
HopfieldOptions Resolve(HopfieldOptions options) {
  std::string error;
  SP_CHECK(options.IsValid(&error), "HopfieldAttention: ", error);
  if (options.stored_size == 0) options.stored_size = options.state_size;
  if (options.value_size == 0) options.value_size = options.stored_size;
  if (options.head_dim == 0) options.head_dim = options.state_size / options.heads;
  if (options.value_head_dim == 0) options.value_head_dim = options.head_dim;
  if (options.output_size == 0) options.output_size = options.state_size;
  if (options.beta == 0.0) options.beta = 1.0 / std::sqrt(static_cast<double>(options.head_dim));
  return options;
}

void CheckInput(const char* what, const Var& x, int64_t width, DType dtype) {
  SP_CHECK(x.defined() && x.rank() == 3 && x.dim(2) == width && x.dtype() == dtype,
           "HopfieldAttention: ", what, " must be [B, T, ", width, "] ", ToString(dtype), ", got ",
           x.defined() ? x.shape().ToString() : std::string("undefined"),
           x.defined() ? std::string(" ") + ToString(x.dtype()) : std::string());
}

}  // namespace

HopfieldAttention::HopfieldAttention(const HopfieldOptions& options, Rng& rng)
    : options_(Resolve(options)) {
  const HopfieldOptions& o = options_;
  beta_ = RegisterParameter("beta", Tensor::Full({o.heads}, o.beta, o.dtype), o.learn_beta);
  LinearOptions linear;
  linear.bias = o.projection_bias;
  linear.dtype = o.dtype;
  wq_ = RegisterModule("wq",
                       std::make_shared<Linear>(o.state_size, o.heads * o.head_dim, rng, linear));
  wk_ = RegisterModule("wk",
                       std::make_shared<Linear>(o.stored_size, o.heads * o.head_dim, rng, linear));
  wv_ = RegisterModule(
      "wv", std::make_shared<Linear>(o.value_size, o.heads * o.value_head_dim, rng, linear));
  wo_ = RegisterModule(
      "wo", std::make_shared<Linear>(o.heads * o.value_head_dim, o.output_size, rng, linear));
  LayerNormOptions norm;
  norm.dtype = o.dtype;
  if (o.normalize_stored) {
    norm_stored_ = RegisterModule("norm_stored", std::make_shared<LayerNorm>(o.stored_size, norm));
  }
  if (o.normalize_state) {
    norm_state_ = RegisterModule("norm_state", std::make_shared<LayerNorm>(o.state_size, norm));
  }
}

const ContextFields<HopfieldContext>& HopfieldContext::Fields() {
  static const auto fields = ContextFields<HopfieldContext>("HopfieldContext")
                                 .PerSample("keys", &HopfieldContext::keys)
                                 .PerSample("mask", &HopfieldContext::mask)
                                 .PerSample("field", &HopfieldContext::field);
  return fields;
}

std::string HopfieldAttention::Name() const {
  std::ostringstream out;
  out << "HopfieldAttention(heads " << options_.heads << ", head_dim " << options_.head_dim << ", "
      << stillpoint::ToString(options_.solve.mode);
  if (options_.solve.mode == EnergySolveMode::kFixedSteps) out << " " << options_.solve.steps;
  out << ")";
  return out.str();
}

Var HopfieldAttention::SplitHeads(const Var& x, int64_t head_width) const {
  Var split = reshape(x, Shape{x.dim(0), x.dim(1), options_.heads, head_width});
  return permute(split, {0, 2, 1, 3});
}

Var HopfieldAttention::Beta4() const { return reshape(beta_, Shape{1, options_.heads, 1, 1}); }

HopfieldProblem HopfieldAttention::Prepare(const Var& stored,
                                           const Var& state,
                                           const Var& values,
                                           const AttentionMask& mask) const {
  const HopfieldOptions& o = options_;
  CheckInput("stored patterns", stored, o.stored_size, o.dtype);
  CheckInput("state patterns", state, o.state_size, o.dtype);
  CheckInput("values", values, o.value_size, o.dtype);
  SP_CHECK(stored.dim(0) == state.dim(0) && values.dim(0) == stored.dim(0) &&
               values.dim(1) == stored.dim(1),
           "HopfieldAttention: stored ", stored.shape(), ", state ", state.shape(), " and values ",
           values.shape(), " disagree on the batch or the number of patterns");
  const int64_t batch = stored.dim(0);
  Var y = norm_stored_ ? norm_stored_->Forward(stored) : stored;
  Var r = norm_state_ ? norm_state_->Forward(state) : state;
  HopfieldProblem problem;
  Var keys = SplitHeads(wk_->Forward(y), o.head_dim);  // [B, H, S, d]
  if (o.contraction > 0.0) {
    // k_j / sqrt(1 + |beta| |k_j|^2 / c): |beta| |k_j|^2 < c (see the option).
    const Var scaled =
        mul_scalar(mul(abs(Beta4()), sum(square(keys), -1, /*keepdim=*/true)), 1.0 / o.contraction);
    keys = div(keys, sqrt(add_scalar(scaled, 1.0)));
  }
  problem.context.keys = keys;
  problem.context.mask =
      MakeAttentionMask(mask, o.causal, batch, o.heads, state.dim(1), stored.dim(1), o.dtype);
  problem.initial_state = SplitHeads(wq_->Forward(r), o.head_dim);
  if (o.query_field) problem.context.field = problem.initial_state;
  problem.values = SplitHeads(wv_->Forward(values), o.value_head_dim);
  return problem;
}

void HopfieldAttention::CheckState(const Var& xi, const HopfieldContext& ctx) const {
  const Var& keys = ctx.keys;
  SP_CHECK(xi.rank() == 4 && xi.dim(1) == options_.heads && xi.dim(3) == options_.head_dim &&
               xi.dim(0) == keys.dim(0),
           "HopfieldAttention: state ", xi.shape(), " must be [B, ", options_.heads, ", N, ",
           options_.head_dim, "] with the keys' batch (keys ", keys.shape(), ")");
}

Var HopfieldAttention::Scores(const Var& xi, const HopfieldContext& ctx) const {
  CheckState(xi, ctx);
  Var scores = mul(matmul(xi, ctx.keys, false, true), Beta4());
  return ApplyAttentionMask(scores, ctx.mask);
}

Var HopfieldAttention::Association(const Var& xi, const HopfieldContext& ctx) const {
  return softmax(Scores(xi, ctx));
}

Var HopfieldAttention::Energy(const Var& xi, const HopfieldContext& ctx) const {
  const int64_t heads = options_.heads;
  Var beta3 = reshape(beta_, Shape{1, heads, 1});
  // [B, H, N]
  Var per_query = sub(mul_scalar(sum(square(xi), -1), 0.5), div(logsumexp(Scores(xi, ctx)), beta3));
  if (options_.query_field) per_query = sub(per_query, sum(mul(xi, ctx.field), -1));
  Var energy = sum(sum(per_query, -1), -1);  // [B]
  if (options_.energy_constants) {
    const Var& keys = ctx.keys;
    const double num_keys = static_cast<double>(keys.dim(2));
    const double num_queries = static_cast<double>(xi.dim(2));
    // M^2 = max_s |k_s|^2 per (sample, head): [B, H]
    Var max_norm_sq = max(sum(square(keys), -1), -1);
    Var log_n_over_beta = rdiv_scalar(std::log(num_keys), reshape(beta_, Shape{1, heads}));
    Var per_head = mul_scalar(add(log_n_over_beta, mul_scalar(max_norm_sq, 0.5)), num_queries);
    energy = add(energy, sum(per_head, -1));
  }
  return energy;
}

Var HopfieldAttention::Update(const Var& xi, const HopfieldContext& ctx) const {
  CheckState(xi, ctx);
  Var retrieved = hopfield_update(xi, ctx.keys, Beta4(), ctx.mask);
  return options_.query_field ? add(ctx.field, retrieved) : retrieved;
}

Var HopfieldAttention::EnergyGrad(const Var& xi, const HopfieldContext& ctx) const {
  return sub(xi, Update(xi, ctx));
}

Var HopfieldAttention::Readout(const Var& xi, const HopfieldProblem& problem) const {
  Var heads_out = matmul(Association(xi, problem.context), problem.values);  // [B, H, N, dv]
  Var merged = permute(heads_out, {0, 2, 1, 3});
  merged = reshape(merged, Shape{xi.dim(0), xi.dim(2), options_.heads * options_.value_head_dim});
  return wo_->Forward(merged);
}

Var HopfieldAttention::Forward(const Var& stored,
                               const Var& state,
                               const Var& values,
                               const AttentionMask& mask) const {
  HopfieldProblem problem = Prepare(stored, state, values, mask);
  Var xi = Solve(problem.initial_state, problem.context, options_.solve);
  return Readout(xi, problem);
}

Var HopfieldAttention::Forward(const Var& stored,
                               const Var& state,
                               const AttentionMask& mask) const {
  return Forward(stored, state, stored, mask);
}

// ------------------------------------------------------------ HopfieldPooling

HopfieldPooling::HopfieldPooling(const HopfieldOptions& options, int64_t quantity, Rng& rng) {
  SP_CHECK(quantity > 0, "HopfieldPooling: quantity must be > 0, got ", quantity);
  hopfield_ = RegisterModule("hopfield", std::make_shared<HopfieldAttention>(options, rng));
  const HopfieldOptions& o = hopfield_->options();
  SP_CHECK(o.value_size == o.stored_size,
           "HopfieldPooling: the input serves as stored patterns "
           "and values, so value_size (",
           o.value_size, ") must equal stored_size (", o.stored_size, ") or be 0");
  Tensor patterns(Shape{quantity, o.state_size}, o.dtype);
  init::Normal(patterns, 0.0, 0.02, rng);
  state_patterns_ = RegisterParameter("state_patterns", patterns);
}

std::string HopfieldPooling::Name() const {
  return "HopfieldPooling(quantity " + std::to_string(state_patterns_.dim(0)) + ")";
}

Var HopfieldPooling::Forward(const Var& stored, const AttentionMask& mask) const {
  SP_CHECK(stored.defined() && stored.rank() == 3, "HopfieldPooling: input must be [B, S, d], got ",
           stored.defined() ? stored.shape().ToString() : std::string("undefined"));
  const Shape shape{stored.dim(0), state_patterns_.dim(0), state_patterns_.dim(1)};
  return hopfield_->Forward(stored, broadcast_to(state_patterns_, shape), stored, mask);
}

// ------------------------------------------------------------- HopfieldLookup

HopfieldLookup::HopfieldLookup(const HopfieldOptions& options, int64_t quantity, Rng& rng) {
  SP_CHECK(quantity > 0, "HopfieldLookup: quantity must be > 0, got ", quantity);
  hopfield_ = RegisterModule("hopfield", std::make_shared<HopfieldAttention>(options, rng));
  const HopfieldOptions& o = hopfield_->options();
  Tensor stored(Shape{quantity, o.stored_size}, o.dtype);
  init::Normal(stored, 0.0, 0.02, rng);
  stored_patterns_ = RegisterParameter("stored_patterns", stored);
  Tensor targets(Shape{quantity, o.value_size}, o.dtype);
  init::Normal(targets, 0.0, 0.02, rng);
  targets_ = RegisterParameter("targets", targets);
}

std::string HopfieldLookup::Name() const {
  return "HopfieldLookup(quantity " + std::to_string(stored_patterns_.dim(0)) + ")";
}

Var HopfieldLookup::Forward(const Var& state, const AttentionMask& mask) const {
  SP_CHECK(state.defined() && state.rank() == 3, "HopfieldLookup: input must be [B, N, d], got ",
           state.defined() ? state.shape().ToString() : std::string("undefined"));
  const int64_t batch = state.dim(0);
  Var stored = broadcast_to(stored_patterns_,
                            Shape{batch, stored_patterns_.dim(0), stored_patterns_.dim(1)});
  Var targets = broadcast_to(targets_, Shape{batch, targets_.dim(0), targets_.dim(1)});
  return hopfield_->Forward(stored, state, targets, mask);
}

const OptionFields<HopfieldOptions>& HopfieldOptions::Fields() {
  using O = HopfieldOptions;
  constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();
  static const auto* fields =
      &(new OptionFields<O>)
           ->Int("state_size", &O::state_size, 1, kNoLimit,
                 "Width of the state patterns R (the query source)")
           .Int("stored_size", &O::stored_size, 0, kNoLimit,
                "Width of the stored patterns Y (the key source); 0: state_size")
           .Int("value_size", &O::value_size, 0, kNoLimit,
                "Width of the value source Z; 0: stored_size")
           .Int("heads", &O::heads, 1, kNoLimit, "Attention heads")
           .Int("head_dim", &O::head_dim, 0, kNoLimit,
                "Query/key width per head; 0: state_size / heads")
           .Int("value_head_dim", &O::value_head_dim, 0, kNoLimit,
                "Value width per head; 0: head_dim")
           .Int("output_size", &O::output_size, 0, kNoLimit, "Output width; 0: state_size")
           .Double("beta", &O::beta, 0.0, std::numeric_limits<double>::max(),
                   "Initial inverse temperature of every head; 0: 1/sqrt(head_dim)")
           .Bool("learn_beta", &O::learn_beta, "Learn beta")
           .Bool("normalize_stored", &O::normalize_stored,
                 "LayerNorm on the stored patterns before their projections")
           .Bool("normalize_state", &O::normalize_state,
                 "LayerNorm on the state patterns before their projections")
           .Bool("projection_bias", &O::projection_bias, "Biases on the four projections")
           .Bool("causal", &O::causal, "Autoregressive masking (query i sees keys j <= i + S - N)")
           .Bool("energy_constants", &O::energy_constants,
                 "Add Ramsauer's constants (1/beta) ln S + M^2/2 per query to the energy")
           .Bool("query_field", &O::query_field, "The queries as an external field on the state")
           .Double("contraction", &O::contraction, OptionBounds::Open(0.0, 1.0).OrZero(),
                   "Scale the keys to |beta| |k_j|^2 < c so the update contracts by at most c "
                   "(0: off)")
           .Include("solve.", &O::solve, EnergySolveOptions::Fields())
           .Enum("dtype", &O::dtype, {DType::kFloat32, DType::kFloat64}, stillpoint::ToString,
                 "The dtype of the parameters");
  return *fields;
}

bool HopfieldOptions::IsValid(std::string* error) const {
  std::string problem = Fields().Check(*this);
  if (problem.empty() && head_dim == 0 && state_size % heads != 0) {
    problem = "state_size " + std::to_string(state_size) + " is not a multiple of heads " +
              std::to_string(heads) + "; set head_dim";
  }
  if (!problem.empty() && error != nullptr) *error = "HopfieldOptions: " + problem;
  return problem.empty();
}

std::string HopfieldOptions::ToString() const { return Fields().Describe(*this) + "\n"; }

}  // namespace stillpoint
