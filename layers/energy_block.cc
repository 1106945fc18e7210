#include "layers/energy_block.h"

#include <cmath>
#include <functional>
#include <limits>
#include <utility>

#include "framework/check.h"
#include "framework/ops.h"
#include "layers/expfam_attention.h"
#include "layers/hopfield.h"
#include "layers/layer_norm.h"
#include "layers/linear.h"
#include "layers/probabilistic_attention.h"

namespace stillpoint {
namespace {

void CheckInjection(const std::string& block, const Var& u, int64_t dim) {
  SP_CHECK(u.defined() && u.rank() == 3 && u.dim(2) == dim, block, ": the injection must be [B, T, ",
           dim, "], got ", u.defined() ? u.shape().ToString() : std::string("undefined"));
}

// The Energy Transformer block's energy layer norm epsilon. Its gain
// 1/sqrt(var + eps) is the slope of g(x) at a token of zero variance, such
// as the zero state an explicit stack starts from; with the reference 1e-5
// (slope 316) the leaky dynamics expand there and neither the inner solve
// nor its adjoint converges. For tokens of unit variance (the block's
// normalised input) 0.1 changes g by 5%.
constexpr double kEnergyLayerNormEps = 0.1;

// The expfam block (discrete measure): each head's patterns are rescaled to
// the norm sqrt(c / beta), so its CCCP map contracts with factor at most c
// (ExpFamAttentionOptions::contraction) whatever W_K, beta and the input
// learn. Its scores are then sqrt(c beta) u_s.eta (u_s the unit patterns):
// the default beta makes c beta = 2, scores sqrt(2) u_s.eta, which depend on
// the width as softmax attention's q.k / sqrt(dh) do for unit-variance
// tokens (docs/energy-layers.md, "Operating points", has the measurements
// behind c and beta).
constexpr double kExpFamContraction = 0.5;
constexpr double kExpFamScoreScaleSquared = 2.0;

// The Energy Transformer block's W_Q and W_K start at N(0, (0.3)^2 / d) and
// its default attention inverse temperature is 4 / sqrt(dh). The weights set
// the size of the attention force (the energy has no value matrix, so the
// force carries W_Q W_K^T g): at this scale the leaky dynamics contract and
// the solve converges in about 10 Anderson iterations, while at N(0, 1/d)
// the solves stop at their cap. beta sets the sharpness of the scores
// without changing the force: beta q.k then has about the scale of softmax
// attention's scores at its initialisation (weights uniform in
// +-1/sqrt(d)), 0.36 against 0.33. At the softmax scale 1/sqrt(dh) the
// scores start four times smaller and the routing learns too slowly
// (docs/energy-layers.md, "Operating points").
constexpr double kEnergyTransformerWeightStd = 0.3;
constexpr double kEnergyTransformerBeta = 4.0;

// 1/sqrt(dh) when beta is 0 (the options' default), else beta.
double ResolvedBeta(const EnergyBlockOptions& o) {
  return o.beta > 0.0 ? o.beta : 1.0 / std::sqrt(static_cast<double>(o.dim / o.heads));
}

// The expfam block's contraction: kExpFamContraction for the discrete
// measure (the learned measures have no patterns to rescale).
double ExpFamContraction(const EnergyBlockOptions& o) {
  return o.measure == ExpFamMeasure::kDiscrete ? kExpFamContraction : 0.0;
}

// The expfam block's beta: 2 / c (scores sqrt(2) u_s.eta) when beta is 0,
// else beta.
double ExpFamBeta(const EnergyBlockOptions& o) {
  return o.beta > 0.0 ? o.beta : kExpFamScoreScaleSquared / kExpFamContraction;
}

// The common part: owns the layer as the child "layer" and the input norm
// as "norm" (normalize_input).
template <typename Layer>
class CatalogueBlock : public EnergyBlock {
 public:
  CatalogueBlock(const char* name, const EnergyBlockOptions& o, std::shared_ptr<Layer> layer)
      : name_(name),
        dim_(o.dim),
        heads_(o.heads),
        causal_(o.causal),
        dtype_(o.dtype),
        layout_(o.layout),
        typed_(layer),
        layer_(std::move(layer)) {
    if (layout_) {
      const std::string problem = layout_->Check(o.heads, o.dim / o.heads);
      SP_CHECK(problem.empty(), name, ": ", problem);
    }
    RegisterModule("layer", layer_);
    if (o.normalize_input) {
      norm_ = RegisterModule("norm", std::make_shared<LayerNorm>(
                                         o.dim, LayerNormOptions{.dtype = o.dtype}));
    }
  }
  std::string Name() const override { return name_; }
  const std::shared_ptr<EnergyLayer>& layer() const override { return layer_; }

 protected:
  // The checked injection u, normalised when the block normalises its input.
  Var Input(const Var& u) const {
    CheckInjection(name_, u, dim_);
    return norm_ ? norm_->Forward(u) : u;
  }
  // The layout's mask and ALiBi bias over the self-attention of `length`
  // tokens (positions.h); empty without a layout.
  AttentionMask Mask(int64_t length) const {
    AttentionMask mask;
    if (layout_) mask.additive = AttentionBias(*layout_, heads_, length, dtype_);
    return mask;
  }
  // Heads [B, H, T, dh] turned by the layout's rotary positions (else as
  // they are).
  Var Rotate(const Var& heads) const {
    return layout_ ? ApplyRotary(heads, *layout_, 2) : heads;
  }
  bool Rotary() const { return layout_ && layout_->Rotary(); }

  const char* name_;
  int64_t dim_;
  int64_t heads_;
  bool causal_;
  DType dtype_;
  std::shared_ptr<const AttentionLayout> layout_;
  std::shared_ptr<Layer> typed_;

 private:
  std::shared_ptr<EnergyLayer> layer_;
  std::shared_ptr<LayerNorm> norm_;
};

class HopfieldBlock : public CatalogueBlock<HopfieldAttention> {
 public:
  HopfieldBlock(const EnergyBlockOptions& o, Rng& rng)
      : CatalogueBlock("HopfieldBlock", o,
                       std::make_shared<HopfieldAttention>(
                           HopfieldOptions{.state_size = o.dim,
                                           .heads = o.heads,
                                           .head_dim = o.dim / o.heads,
                                           .beta = ResolvedBeta(o),
                                           .causal = o.causal,
                                           .query_field = true,
                                           .dtype = o.dtype},
                           rng)) {}

  EnergyBlockProblem Prepare(const Var& u) const override {
    const Var x = Input(u);
    HopfieldProblem hopfield = typed_->Prepare(x, x, x, Mask(x.dim(1)));
    if (Rotary()) {
      // Keys and queries (the start and the field) turned by position; the
      // values are not.
      hopfield.context.Set("keys", Rotate(hopfield.context.Get("keys")));
      hopfield.initial_state = Rotate(hopfield.initial_state);
      if (hopfield.context.Has("field")) hopfield.context.Set("field", hopfield.initial_state);
    }
    EnergyBlockProblem problem{hopfield.context, hopfield.initial_state, u, {}};
    problem.extras.Set("values", hopfield.values);
    return problem;
  }
  Var Output(const Var& xi, const EnergyBlockProblem& problem) const override {
    const HopfieldProblem hopfield{problem.context, problem.initial_state,
                                   problem.extras.Get("values")};
    return typed_->Readout(xi, hopfield);
  }
  Var AttentionWeights(const Var& xi, const EnergyBlockProblem& problem) const override {
    return typed_->Association(xi, problem.context);
  }
};

class ProbabilisticBlock : public CatalogueBlock<ProbabilisticAttention> {
 public:
  ProbabilisticBlock(const EnergyBlockOptions& o, Rng& rng)
      : CatalogueBlock("ProbabilisticBlock", o,
                       std::make_shared<ProbabilisticAttention>(
                           [&] {
                             ProbabilisticAttentionOptions options;
                             options.dim = o.dim;
                             options.heads = o.heads;
                             options.query_precision = ResolvedBeta(o);
                             options.value_precision =
                                 o.value_precision / static_cast<double>(o.dim / o.heads);
                             options.key_adaptation = o.key_adaptation;
                             options.projection_bias = o.projection_bias;
                             options.learn_precisions = o.learn_precisions;
                             options.causal = o.causal;
                             options.dtype = o.dtype;
                             return options;
                           }(),
                           rng)) {}

  EnergyBlockProblem Prepare(const Var& u) const override {
    const Var x = Input(u);
    ProbabilisticProblem p = typed_->Prepare(x, x, Inputs(x.dim(1)));
    return EnergyBlockProblem{p.context, p.initial_state, u, {}};
  }
  EnergyBlockProblem PrepareForWarmStart(const Var& u) const override {
    const Var x = Input(u);
    ProbabilisticProblem p = typed_->Prepare(x, x, Inputs(x.dim(1)), /*with_initial_state=*/false);
    return EnergyBlockProblem{p.context, Var(), u, {}};
  }
  Var Output(const Var& v, const EnergyBlockProblem& problem) const override {
    ProbabilisticProblem p;
    p.context = problem.context;
    p.initial_state = problem.initial_state;
    return typed_->Readout(v, p);
  }
  Var AttentionWeights(const Var& v, const EnergyBlockProblem& problem) const override {
    return typed_->Responsibilities(v, problem.context);
  }

 private:
  ProbabilisticAttentionInputs Inputs(int64_t length) const {
    ProbabilisticAttentionInputs inputs;
    inputs.mask = Mask(length);
    inputs.positions = layout_.get();
    return inputs;
  }
};

class ExpFamBlock : public CatalogueBlock<ExpFamAttention> {
 public:
  ExpFamBlock(const EnergyBlockOptions& o, Rng& rng)
      : CatalogueBlock("ExpFamBlock", o,
                       std::make_shared<ExpFamAttention>(
                           ExpFamAttentionOptions{.measure = o.measure,
                                                  .dim = o.dim,
                                                  .heads = o.heads,
                                                  .components = o.components,
                                                  .beta = ExpFamBeta(o),
                                                  .contraction = ExpFamContraction(o),
                                                  .update = ExpFamUpdate::kCccp,
                                                  .query_field = true,
                                                  .dtype = o.dtype},
                           rng)) {
    wo_ = RegisterModule("wo", std::make_shared<Linear>(o.dim, o.dim, rng,
                                                        LinearOptions{.dtype = o.dtype}));
  }

  EnergyBlockProblem Prepare(const Var& u) const override {
    const Var x = Input(u);
    const bool discrete = typed_->options().measure == ExpFamMeasure::kDiscrete;
    EnergyContext context = typed_->Prepare(discrete ? x : Var(), x);
    if (discrete) {
      // The gaussian and mixture measures attend over no tokens: a token's
      // fixed point depends on that token alone, so there is nothing to mask
      // or to place.
      const int64_t length = x.dim(1);
      AddAttentionMask(Mask(length), causal_, x.dim(0), heads_, length, length, dtype_, &context);
      if (Rotary()) {
        context.Set("patterns", Rotate(context.Get("patterns")));
        context.Set("field", ApplyRotaryMerged(context.Get("field"), *layout_, heads_));
      }
    }
    const Var field = context.Get("field");
    return EnergyBlockProblem{std::move(context), field, u, {}};
  }
  Var Output(const Var& eta, const EnergyBlockProblem& problem) const override {
    Var mean = typed_->LogPartitionGrad(eta, problem.context);
    if (typed_->options().contraction > 0.0) {
      // grad G is the mean of patterns of norm sqrt(c / beta), small by
      // design; W_O reads it at the scale of a unit-variance token instead,
      // sqrt(dh) times the mean of the unit patterns.
      const int64_t heads = typed_->options().heads, dh = typed_->head_dim();
      Var scale =
          mul_scalar(rdiv_scalar(1.0, typed_->PatternNorm()), std::sqrt(static_cast<double>(dh)));
      Var split = reshape(mean, Shape{mean.dim(0), mean.dim(1), heads, dh});
      mean = reshape(mul(split, reshape(scale, Shape{1, 1, heads, 1})), mean.shape());
    }
    return wo_->Forward(mean);
  }
  Var AttentionWeights(const Var& eta, const EnergyBlockProblem& problem) const override {
    // Only the discrete measure attends over tokens.
    if (typed_->options().measure != ExpFamMeasure::kDiscrete) return Var();
    return typed_->Weights(eta, problem.context);
  }

 private:
  // The patterns are keys and content at once (grad G is their weighted
  // mean); the output projection lets the content read out differ from the
  // address, as W_V W_O does for the other blocks.
  std::shared_ptr<Linear> wo_;
};

class EnergyTransformerEnergyBlock : public CatalogueBlock<EnergyTransformerBlock> {
 public:
  EnergyTransformerEnergyBlock(const EnergyBlockOptions& o, Rng& rng)
      : CatalogueBlock("EnergyTransformerEnergyBlock", o,
                       std::make_shared<EnergyTransformerBlock>(
                           [&] {
                             EnergyTransformerOptions options;
                             options.dim = o.dim;
                             options.heads = o.heads;
                             options.head_dim = o.dim / o.heads;
                             options.memories = o.memories;
                             options.memory = o.memory;
                             options.beta = o.beta > 0.0 ? o.beta
                                                         : kEnergyTransformerBeta /
                                                               std::sqrt(static_cast<double>(
                                                                   o.dim / o.heads));
                             options.causal = o.causal;
                             options.layout = o.layout;
                             // Masks can leave a token only itself to attend
                             // to (the first token under causal), so the self
                             // term stays in the energy with them.
                             options.exclude_self =
                                 !o.causal && (!o.layout || o.layout->mask == AttentionMaskKind::kNone);
                             options.key_grad = o.key_grad;
                             options.dynamics = o.dynamics;
                             options.step = o.step;
                             options.weight_std =
                                 kEnergyTransformerWeightStd / std::sqrt(static_cast<double>(o.dim));
                             options.layer_norm_eps = kEnergyLayerNormEps;
                             options.dtype = o.dtype;
                             return options;
                           }(),
                           rng)),
        readout_(o.readout) {
    // The key-side force of the attention energy pulls each token toward
    // the queries that see it, later ones under a causal mask: only the
    // query-side update keeps a token's state independent of later tokens.
    const bool causal =
        o.causal || (o.layout && o.layout->mask == AttentionMaskKind::kCausal);
    SP_CHECK(!causal || o.key_grad == KeyGrad::kStop,
             "EnergyTransformerEnergyBlock: a causal mask needs key_grad stop (the full "
             "key-side force moves earlier tokens with later queries)");
    if (readout_ == EnergyTransformerReadout::kAttention) {
      const LinearOptions linear{.dtype = o.dtype};
      wv_ = RegisterModule("wv", std::make_shared<Linear>(o.dim, o.dim, rng, linear));
      wo_ = RegisterModule("wo", std::make_shared<Linear>(o.dim, o.dim, rng, linear));
    }
  }

  EnergyBlockProblem Prepare(const Var& u) const override {
    const Var x = Input(u);
    EnergyContext context = typed_->Prepare(x, Mask(x.dim(1)));
    context.Set("input", x);  // the external current
    EnergyBlockProblem problem{context, x, u, {}};
    problem.extras.Set("start", x);
    return problem;
  }
  Var Output(const Var& state, const EnergyBlockProblem& problem) const override {
    if (readout_ == EnergyTransformerReadout::kMove) {
      return sub(state, problem.extras.Get("start"));
    }
    // Values per head, weighted by the attention at x*, and merged back.
    const Var values = typed_->SplitHeads(wv_->Forward(state));
    const Var mixed = matmul(typed_->AttentionWeights(state, problem.context), values);
    return wo_->Forward(typed_->MergeHeads(mixed));
  }
  Var AttentionWeights(const Var& state, const EnergyBlockProblem& problem) const override {
    return typed_->AttentionWeights(state, problem.context);
  }

 private:
  EnergyTransformerReadout readout_;
  // The value and output maps of the attention readout: the energy has no
  // value matrix (its attention force carries W_Q W_K^T g), so without them
  // the content a token receives is tied to the bilinear form that routes it.
  std::shared_ptr<Linear> wv_, wo_;
};

template <typename Block>
EnergyBlockFactory Factory() {
  return [](const EnergyBlockOptions& options, Rng& rng) -> std::shared_ptr<EnergyBlock> {
    return std::make_shared<Block>(options, rng);
  };
}

}  // namespace

const char* ToString(EnergyTransformerReadout readout) {
  return readout == EnergyTransformerReadout::kAttention ? "attention" : "move";
}

Var EnergyBlock::Readout(const Var& state, const EnergyBlockProblem& problem) const {
  return add(problem.injection, Output(state, problem));
}

Var EnergyBlock::AttentionWeights(const Var&, const EnergyBlockProblem&) const { return Var(); }

Registry<EnergyBlockFactory>& EnergyBlockRegistry() {
  // Created on first use and never destroyed (see registry.cc).
  static Registry<EnergyBlockFactory>* registry = [] {
    auto* r = new Registry<EnergyBlockFactory>("energy block");
    r->Register("hopfield", Factory<HopfieldBlock>(),
                "modern Hopfield attention with the query as an external field: CCCP "
                "xi <- q + K^T softmax(beta K xi) from xi_0 = q; out = values read with the "
                "final association");
    r->Register("probabilistic", Factory<ProbabilisticBlock>(),
                "probabilistic (Gaussian-mixture) attention: EM over the values; out = "
                "values W_O");
    r->Register("expfam", Factory<ExpFamBlock>(),
                "exponential-family attention, discrete measure over x W_K (each head's "
                "patterns at norm sqrt(0.5 / beta): a contraction) with the query x W_Q as a "
                "field: eta <- q + grad G(eta); out = grad G(eta*) W_O");
    r->Register("energy_transformer", Factory<EnergyTransformerEnergyBlock>(),
                "Energy Transformer block: tokens from x, driven by x, to the stationary "
                "state; out = x* - x");
    return r;
  }();
  return *registry;
}

namespace {

// The applies-when predicate of a field read by one block only.
std::function<bool(const EnergyBlockOptions&)> ReadBy(const std::string& block) {
  return [block](const EnergyBlockOptions& o) { return o.layer == block; };
}

}  // namespace

const OptionFields<EnergyBlockOptions>& EnergyBlockOptions::Fields() {
  using O = EnergyBlockOptions;
  constexpr double kInf = std::numeric_limits<double>::max();
  static const auto* fields =
      &(new OptionFields<O>)
           ->String("layer", &O::layer,
                    "energy kind: the energy attention block, by registered name (built-in: "
                    "hopfield, probabilistic, expfam, energy_transformer), unless model.attention "
                    "names one")
           .Double("beta", &O::beta, 0.0, kInf,
                   "Energy attention: initial inverse temperature per head (hopfield, expfam and "
                   "energy_transformer beta; probabilistic query precision alpha); 0: 1/sqrt(head "
                   "width), expfam 4 (its patterns are rescaled, docs/energy-layers.md), "
                   "energy_transformer 4/sqrt(head width)")
           .Double("value_precision", &O::value_precision, 0.0, kInf,
                   "Energy attention, probabilistic only (an error for a config without it): "
                   "initial value precision times the head width (beta_v = value_precision / head "
                   "width; the EM value term's scale is about value_precision / 3 at "
                   "initialisation); 0: one-step softmax attention")
           .AppliesWhen(ReadBy("probabilistic"))
           .Bool("normalize_input", &O::normalize_input,
                 "Energy attention: layer norm of the block's input before its projections "
                 "(keeps the operating point whatever the embedding scale)")
           .Enum("key_grad", &O::key_grad, {KeyGrad::kFull, KeyGrad::kStop}, stillpoint::ToString,
                 "energy, energy_transformer only (an error for a config without it): full keeps "
                 "the key-side attention gradient (energy descent); stop holds keys fixed in the "
                 "update")
           .AppliesWhen(ReadBy("energy_transformer"))
           .Enum("dynamics", &O::dynamics,
                 {EnergyTransformerDynamics::kLeaky, EnergyTransformerDynamics::kNonLeaky},
                 stillpoint::ToString,
                 "energy, energy_transformer only (an error for a config without it): leaky has "
                 "isolated fixed points; non_leaky (the reference Euler steps) does not, so solve "
                 "it with few fixed steps")
           .AppliesWhen(ReadBy("energy_transformer"))
           .Enum("memory", &O::memory,
                 {EnergyTransformerMemory::kRelu2, EnergyTransformerMemory::kSoftmax},
                 stillpoint::ToString,
                 "energy, energy_transformer only (an error for a config without it): Hopfield "
                 "memory term")
           .AppliesWhen(ReadBy("energy_transformer"))
           .Int("memories", &O::memories, 1, 1 << 20,
                "energy, energy_transformer only (an error for a config without it): number of "
                "memories")
           .AppliesWhen(ReadBy("energy_transformer"))
           .Double("step", &O::step, 1e-12, kInf,
                   "energy, energy_transformer only (an error for a config without it): Euler step "
                   "alpha of the leaky dynamics the solver iterates (the stationary state does not "
                   "depend on it; 1 contracts fastest at the block's initialisation)")
           .AppliesWhen(ReadBy("energy_transformer"))
           .Enum("readout", &O::readout,
                 {EnergyTransformerReadout::kAttention, EnergyTransformerReadout::kMove},
                 stillpoint::ToString,
                 "energy, energy_transformer only (an error for a config without it): attention "
                 "reads values of the stationary tokens x* with the attention weights at x* "
                 "(softmax(beta Q* K*^T) x* W_V W_O); move is x* - x")
           .AppliesWhen(ReadBy("energy_transformer"))
           .Include("key_adaptation.", &O::key_adaptation, KeyAdaptationOptions::Fields(), {},
                    ReadBy("probabilistic"))
           .Enum("measure", &O::measure,
                 {ExpFamMeasure::kDiscrete, ExpFamMeasure::kGaussian, ExpFamMeasure::kMixture},
                 stillpoint::ToString,
                 "expfam: the intrinsic measure (discrete: the tokens' key patterns; gaussian, "
                 "mixture: learned, the query as the field)")
           .AppliesWhen(ReadBy("expfam"))
           .Int("components", &O::components, 1, 1 << 16, "expfam, mixture measure: components")
           .AppliesWhen(ReadBy("expfam"))
           .Int("dim", &O::dim, 1, 1 << 16, "Token width d")
           .NotInConfig()
           .Int("heads", &O::heads, 1, 1024, "Attention heads (dim must be a multiple)")
           .NotInConfig()
           .Bool("projection_bias", &O::projection_bias,
                 "probabilistic: biases on the projections")
           .NotInConfig()
           .AppliesWhen(ReadBy("probabilistic"))
           .Bool("learn_precisions", &O::learn_precisions,
                 "probabilistic: learn the precisions alpha and beta_v")
           .NotInConfig()
           .AppliesWhen(ReadBy("probabilistic"))
           .Bool("causal", &O::causal, "Autoregressive masking of the attention")
           .NotInConfig();
  return *fields;
}

bool EnergyBlockOptions::IsValid(std::string* error) const {
  std::string problem = Fields().Check(*this);
  if (problem.empty() && dim % heads != 0) {
    problem = "dim (" + std::to_string(dim) + ") must be a multiple of heads (" +
              std::to_string(heads) + ")";
  }
  if (problem.empty() && !key_adaptation.IsValid(&problem)) problem = "key_adaptation: " + problem;
  if (!problem.empty() && error != nullptr) *error = "EnergyBlockOptions: " + problem;
  return problem.empty();
}

std::string EnergyBlockOptions::ToString() const { return Fields().Describe(*this) + "\n"; }

std::shared_ptr<EnergyBlock> CreateEnergyBlock(const EnergyBlockOptions& options, Rng& rng) {
  std::string error;
  SP_CHECK(options.IsValid(&error), "energy block '", options.layer, "': ", error);
  return EnergyBlockRegistry().Get(options.layer)(options, rng);
}

}  // namespace stillpoint
