#include "layers/energy_transformer.h"

#include <cmath>
#include <limits>
#include <sstream>
#include <utility>

#include "framework/init.h"
#include "framework/ops.h"

namespace stillpoint {

const char* ToString(EnergyTransformerMemory memory) {
  return memory == EnergyTransformerMemory::kRelu2 ? "relu2" : "softmax";
}

bool StringToEnergyTransformerMemory(const std::string& text, EnergyTransformerMemory* memory) {
  if (text == "relu2") {
    *memory = EnergyTransformerMemory::kRelu2;
  } else if (text == "softmax") {
    *memory = EnergyTransformerMemory::kSoftmax;
  } else {
    return false;
  }
  return true;
}

const char* ToString(EnergyTransformerDynamics dynamics) {
  return dynamics == EnergyTransformerDynamics::kNonLeaky ? "non_leaky" : "leaky";
}

bool StringToEnergyTransformerDynamics(const std::string& text,
                                       EnergyTransformerDynamics* dynamics) {
  if (text == "non_leaky") {
    *dynamics = EnergyTransformerDynamics::kNonLeaky;
  } else if (text == "leaky") {
    *dynamics = EnergyTransformerDynamics::kLeaky;
  } else {
    return false;
  }
  return true;
}

EnergyTransformerBlock::EnergyTransformerBlock(const EnergyTransformerOptions& options, Rng& rng)
    : options_(options) {
  EnergyTransformerOptions& o = options_;
  std::string error;
  SP_CHECK(o.IsValid(&error), "EnergyTransformerBlock: ", error);
  if (o.beta == 0.0) o.beta = 1.0 / std::sqrt(static_cast<double>(o.head_dim));
  gamma_ = RegisterParameter("gamma", Tensor::Ones({1}, o.dtype));
  delta_ = RegisterParameter("delta", Tensor::Zeros({o.dim}, o.dtype));
  Tensor wq(Shape{o.dim, o.heads * o.head_dim}, o.dtype);
  init::Normal(wq, 0.0, o.weight_std, rng);
  wq_ = RegisterParameter("wq", wq);
  Tensor wk(Shape{o.dim, o.heads * o.head_dim}, o.dtype);
  init::Normal(wk, 0.0, o.weight_std, rng);
  wk_ = RegisterParameter("wk", wk);
  beta_ = RegisterParameter("beta", Tensor::Full({o.heads}, o.beta, o.dtype), o.learn_beta);
  Tensor memories(Shape{o.memories, o.dim}, o.dtype);
  init::Normal(memories, 0.0, o.memory_std, rng);
  memories_ = RegisterParameter("memories", memories);
}

std::string EnergyTransformerBlock::Name() const {
  std::ostringstream out;
  out << "EnergyTransformerBlock(dim " << options_.dim << ", heads " << options_.heads << ", "
      << stillpoint::ToString(options_.dynamics) << ", " << stillpoint::ToString(options_.memory)
      << " memory, key_grad " << stillpoint::ToString(options_.key_grad) << ")";
  return out.str();
}

Var EnergyTransformerBlock::SplitHeads(const Var& x) const {
  return permute(reshape(x, Shape{x.dim(0), x.dim(1), options_.heads, options_.head_dim}),
                 {0, 2, 1, 3});
}

Var EnergyTransformerBlock::MergeHeads(const Var& x) const {
  return reshape(permute(x, {0, 2, 1, 3}),
                 Shape{x.dim(0), x.dim(2), options_.heads * options_.head_dim});
}

const ContextFields<EnergyTransformerContext>& EnergyTransformerContext::Fields() {
  static const auto fields = ContextFields<EnergyTransformerContext>("EnergyTransformerContext")
                                 .PerSample("mask", &EnergyTransformerContext::mask)
                                 .PerSample("input", &EnergyTransformerContext::input);
  return fields;
}

EnergyTransformerContext EnergyTransformerBlock::Prepare(const Var& x,
                                                         const AttentionMask& mask) const {
  SP_CHECK(x.defined() && x.rank() == 3 && x.dim(2) == options_.dim && x.dtype() == options_.dtype,
           "EnergyTransformerBlock: tokens must be [B, N, ", options_.dim, "] ",
           stillpoint::ToString(options_.dtype), ", got ",
           x.defined() ? x.shape().ToString() : std::string("undefined"));
  const int64_t n = x.dim(1);
  AttentionMask combined = mask;
  if (options_.exclude_self) {
    SP_CHECK(n >= 2, "EnergyTransformerBlock: exclude_self needs at least 2 tokens, got ", n);
    Tensor diagonal = Tensor::Zeros({n, n}, DType::kFloat64);
    for (int64_t i = 0; i < n; ++i) diagonal.set(i * n + i, -INFINITY);
    combined.additive =
        mask.additive.defined()
            ? add(constant(mask.additive.To(DType::kFloat64)), constant(diagonal)).value()
            : diagonal;
  }
  EnergyTransformerContext ctx;
  ctx.mask =
      MakeAttentionMask(combined, options_.causal, x.dim(0), options_.heads, n, n, options_.dtype);
  return ctx;
}

Var EnergyTransformerBlock::Normalize(const Var& x) const {
  return layer_norm(x, broadcast_to(gamma_, Shape{options_.dim}), delta_, options_.layer_norm_eps);
}

Var EnergyTransformerBlock::Lagrangian(const Var& x) const {
  Var centred = sub(x, mean(x, -1, /*keepdim=*/true));
  Var spread = sqrt(add_scalar(mean(square(centred), -1), options_.layer_norm_eps));  // [B, N]
  Var per_token = add(mul(mul_scalar(spread, static_cast<double>(options_.dim)), gamma_),
                      sum(mul(x, delta_), -1));
  return sum(per_token, -1);
}

Var EnergyTransformerBlock::LayerNormEnergy(const Var& x) const {
  return sub(sum(sum(mul(Normalize(x), x), -1), -1), Lagrangian(x));
}

Var EnergyTransformerBlock::Scores(const Var& q,
                                   const Var& k,
                                   const EnergyTransformerContext& ctx) const {
  Var scores = mul(matmul(q, k, false, true), reshape(beta_, Shape{1, options_.heads, 1, 1}));
  return ApplyAttentionMask(scores, ctx.mask);
}

Var EnergyTransformerBlock::Project(const Var& g, const Var& weight) const {
  const Var split = SplitHeads(matmul(g, weight));
  return options_.layout ? ApplyRotary(split, *options_.layout, 2) : split;
}

Var EnergyTransformerBlock::UnrotateMerge(const Var& x) const {
  return MergeHeads(options_.layout ? ApplyRotary(x, *options_.layout, 2, /*inverse=*/true) : x);
}

Var EnergyTransformerBlock::AttentionEnergy(const Var& g,
                                            const EnergyTransformerContext& ctx) const {
  Var q = Project(g, wq_);
  Var k = Project(g, wk_);
  Var per_query = div(logsumexp(Scores(q, k, ctx)), reshape(beta_, Shape{1, options_.heads, 1}));
  return neg(sum(sum(per_query, -1), -1));
}

Var EnergyTransformerBlock::AttentionWeights(const Var& x,
                                             const EnergyTransformerContext& ctx) const {
  const Var g = Normalize(x);
  return softmax(Scores(Project(g, wq_), Project(g, wk_), ctx));
}

Var EnergyTransformerBlock::AttentionEnergyGrad(const Var& g,
                                                const EnergyTransformerContext& ctx) const {
  Var q = Project(g, wq_);
  Var k = Project(g, wk_);
  Var p = softmax(Scores(q, k, ctx));  // [B, H, query, key]
  // The beta of the scores cancels against the 1/beta of the energy; rotary
  // positions turn the query- and key-side forces back (R^T) before W^T.
  Var query_side = matmul(UnrotateMerge(matmul(p, k)), wq_, false, true);
  if (options_.key_grad == KeyGrad::kStop) return neg(query_side);
  Var key_side = matmul(UnrotateMerge(matmul(p, q, /*transpose_a=*/true)), wk_, false, true);
  return neg(add(query_side, key_side));
}

Var EnergyTransformerBlock::MemoryEnergy(const Var& g) const {
  Var h = matmul(g, memories_, false, true);  // [B, N, M]
  if (options_.memory == EnergyTransformerMemory::kRelu2) {
    return mul_scalar(sum(sum(square(relu(h)), -1), -1), -0.5);
  }
  const double b = options_.memory_beta;
  return mul_scalar(sum(logsumexp(mul_scalar(h, b)), -1), -1.0 / b);
}

Var EnergyTransformerBlock::MemoryEnergyGrad(const Var& g) const {
  Var h = matmul(g, memories_, false, true);
  Var weights = options_.memory == EnergyTransformerMemory::kRelu2
                    ? relu(h)
                    : softmax(mul_scalar(h, options_.memory_beta));
  return neg(matmul(weights, memories_));
}

Var EnergyTransformerBlock::Energy(const Var& x, const EnergyTransformerContext& ctx) const {
  Var g = Normalize(x);
  Var energy = add(AttentionEnergy(g, ctx), MemoryEnergy(g));
  if (options_.dynamics == EnergyTransformerDynamics::kLeaky) {
    energy = add(energy, LayerNormEnergy(x));
  }
  if (ctx.input.defined()) {
    // The external current's term -sum_A I_A.g_A, per sample.
    energy = sub(energy, sum(sum(mul(ctx.input, g), 2), 1));
  }
  return energy;
}

Var EnergyTransformerBlock::Update(const Var& x, const EnergyTransformerContext& ctx) const {
  Var g = Normalize(x);
  Var force = add(AttentionEnergyGrad(g, ctx), MemoryEnergyGrad(g));  // dE/dg
  if (options_.dynamics == EnergyTransformerDynamics::kLeaky) force = add(x, force);
  if (ctx.input.defined()) force = sub(force, ctx.input);
  return sub(x, mul_scalar(force, options_.step));
}

Var EnergyTransformerBlock::Forward(const Var& x, const AttentionMask& mask) const {
  return Solve(x, Prepare(x, mask), options_.solve);
}

const OptionFields<EnergyTransformerOptions>& EnergyTransformerOptions::Fields() {
  using O = EnergyTransformerOptions;
  constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();
  constexpr double kInf = std::numeric_limits<double>::max();
  static const auto* fields =
      &(new OptionFields<O>)
           ->Int("dim", &O::dim, 1, kNoLimit, "Token width D")
           .Int("heads", &O::heads, 1, kNoLimit, "Attention heads")
           .Int("head_dim", &O::head_dim, 1, kNoLimit, "Query/key width Y per head")
           .Int("memories", &O::memories, 1, kNoLimit, "Hopfield memories M (the paper uses 4 D)")
           .Enum("memory", &O::memory,
                 {EnergyTransformerMemory::kRelu2, EnergyTransformerMemory::kSoftmax},
                 stillpoint::ToString, "Hopfield memory term")
           .Double("memory_beta", &O::memory_beta, OptionBounds::OpenClosed(0.0, kInf),
                   "Inverse temperature of the softmax memory")
           .Double("beta", &O::beta, 0.0, kInf,
                   "Initial attention inverse temperature of every head; 0: 1/sqrt(head_dim)")
           .Bool("learn_beta", &O::learn_beta, "Learn beta")
           .Bool("exclude_self", &O::exclude_self,
                 "Drop B = C from the attention energy (the paper); false keeps it (the reference "
                 "code)")
           .Bool("causal", &O::causal, "Autoregressive masking of the attention")
           .Enum("key_grad", &O::key_grad, {KeyGrad::kFull, KeyGrad::kStop}, stillpoint::ToString,
                 "full keeps the key-side attention gradient; stop holds keys fixed in the update")
           .Enum("dynamics", &O::dynamics,
                 {EnergyTransformerDynamics::kLeaky, EnergyTransformerDynamics::kNonLeaky},
                 stillpoint::ToString, "leaky has isolated fixed points; non_leaky does not")
           .Double("step", &O::step, OptionBounds::OpenClosed(0.0, kInf), "Euler step alpha")
           .Double("layer_norm_eps", &O::layer_norm_eps, 0.0, kInf,
                   "Epsilon of the energy layer norm")
           .Double("weight_std", &O::weight_std, 0.0, kInf,
                   "Initial W_Q, W_K ~ N(0, weight_std^2)")
           .Double("memory_std", &O::memory_std, 0.0, kInf, "Initial memories ~ N(0, memory_std^2)")
           .Include("solve.", &O::solve, EnergySolveOptions::Fields())
           .Enum("dtype", &O::dtype, {DType::kFloat32, DType::kFloat64}, stillpoint::ToString,
                 "The dtype of the parameters");
  return *fields;
}

bool EnergyTransformerOptions::IsValid(std::string* error) const {
  const std::string problem = Fields().Check(*this);
  if (!problem.empty() && error != nullptr) *error = "EnergyTransformerOptions: " + problem;
  return problem.empty();
}

std::string EnergyTransformerOptions::ToString() const { return Fields().Describe(*this) + "\n"; }

}  // namespace stillpoint
