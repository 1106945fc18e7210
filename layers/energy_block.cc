#include "layers/energy_block.h"

#include <cmath>
#include <functional>
#include <limits>
#include <utility>

#include "framework/check.h"
#include "framework/ops.h"
#include "layers/energy_block_list.h"

namespace stillpoint {

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
#define SP_REGISTER_ENERGY_BLOCK(Name, name, doc) r->Register(name, Create##Name##Block, doc);
    SP_ENERGY_BLOCKS(SP_REGISTER_ENERGY_BLOCK)
#undef SP_REGISTER_ENERGY_BLOCK
    return r;
  }();
  return *registry;
}

const std::vector<std::string>& BuiltinEnergyBlockNames() {
  static const std::vector<std::string> names = {
#define SP_ENERGY_BLOCK_NAME(Name, name, doc) name,
      SP_ENERGY_BLOCKS(SP_ENERGY_BLOCK_NAME)
#undef SP_ENERGY_BLOCK_NAME
  };
  return names;
}

std::vector<std::string> AttentionKindNames() {
  std::vector<std::string> names = {"softmax"};
  for (const std::string& name : EnergyBlockRegistry().Names()) names.push_back(name);
  return names;
}

std::string BuiltinEnergyBlockList() {
  std::string out;
  for (const std::string& name : BuiltinEnergyBlockNames()) out += (out.empty() ? "" : ", ") + name;
  return out;
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
                    "energy kind: the energy attention block, by registered name (built-in: " +
                        BuiltinEnergyBlockList() + "), unless model.attention names one")
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
           .Double("value_contraction", &O::value_contraction, OptionBounds::Open(0.0, 1.0).OrZero(),
                   "Energy attention, probabilistic only (an error for a config without it): the "
                   "values are scaled to beta_v |mu_j|^2 < c so the EM map contracts by at most c "
                   "at every state (its Jacobian beta_v Cov_w(mu) is symmetric positive "
                   "semidefinite); 0: off (training can make the fixed point a saddle)")
           .AppliesWhen(ReadBy("probabilistic"))
           .Double("pattern_contraction", &O::pattern_contraction,
                   OptionBounds::Open(0.0, 1.0).OrZero(),
                   "Energy attention, hopfield only (an error for a config without it): the keys "
                   "are scaled to |beta| |k_j|^2 < c so the CCCP map contracts by at most c at "
                   "every state (its Jacobian beta K^T Cov_p K is symmetric); 0: off")
           .AppliesWhen(ReadBy("hopfield"))
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
