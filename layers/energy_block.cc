#include "layers/energy_block.h"

#include <utility>

#include "framework/check.h"
#include "framework/ops.h"
#include "layers/expfam_attention.h"
#include "layers/hopfield.h"
#include "layers/probabilistic_attention.h"

namespace stillpoint {
namespace {

void CheckInjection(const char* block, const Var& u, int64_t dim) {
  SP_CHECK(u.defined() && u.rank() == 3 && u.dim(2) == dim, block, ": the injection must be [B, T, ",
           dim, "], got ", u.defined() ? u.shape().ToString() : std::string("undefined"));
}

// The common part: owns the layer as the child "layer".
template <typename Layer>
class CatalogueBlock : public EnergyBlock {
 public:
  explicit CatalogueBlock(std::shared_ptr<Layer> layer)
      : typed_(layer), layer_(std::move(layer)) {
    RegisterModule("layer", layer_);
  }
  const std::shared_ptr<EnergyLayer>& layer() const override { return layer_; }

 protected:
  std::shared_ptr<Layer> typed_;

 private:
  std::shared_ptr<EnergyLayer> layer_;
};

class HopfieldBlock : public CatalogueBlock<HopfieldAttention> {
 public:
  HopfieldBlock(const EnergyBlockOptions& o, Rng& rng)
      : CatalogueBlock(std::make_shared<HopfieldAttention>(
            HopfieldOptions{.state_size = o.dim,
                            .heads = o.heads,
                            .head_dim = o.dim / o.heads,
                            .beta = o.beta,
                            .causal = o.causal,
                            .dtype = o.dtype},
            rng)),
        dim_(o.dim) {}
  std::string Name() const override { return "HopfieldBlock"; }

  EnergyBlockProblem Prepare(const Var& u) const override {
    CheckInjection("HopfieldBlock", u, dim_);
    HopfieldProblem hopfield = typed_->Prepare(u, u, u);
    EnergyBlockProblem problem{hopfield.context, hopfield.initial_state, u, {}};
    problem.extras.Set("values", hopfield.values);
    return problem;
  }
  Var Readout(const Var& xi, const EnergyBlockProblem& problem) const override {
    const HopfieldProblem hopfield{problem.context, problem.initial_state,
                                   problem.extras.Get("values")};
    return add(problem.injection, typed_->Readout(xi, hopfield));
  }

 private:
  int64_t dim_;
};

class ProbabilisticBlock : public CatalogueBlock<ProbabilisticAttention> {
 public:
  ProbabilisticBlock(const EnergyBlockOptions& o, Rng& rng)
      : CatalogueBlock(std::make_shared<ProbabilisticAttention>(
            [&] {
              ProbabilisticAttentionOptions options;
              options.dim = o.dim;
              options.heads = o.heads;
              options.query_precision = o.beta;
              options.value_precision = o.value_precision;
              options.causal = o.causal;
              options.dtype = o.dtype;
              return options;
            }(),
            rng)),
        dim_(o.dim) {}
  std::string Name() const override { return "ProbabilisticBlock"; }

  EnergyBlockProblem Prepare(const Var& u) const override {
    CheckInjection("ProbabilisticBlock", u, dim_);
    ProbabilisticProblem p = typed_->Prepare(u, u);
    return EnergyBlockProblem{p.context, p.initial_state, u, {}};
  }
  Var Readout(const Var& v, const EnergyBlockProblem& problem) const override {
    ProbabilisticProblem p;
    p.context = problem.context;
    p.initial_state = problem.initial_state;
    return add(problem.injection, typed_->Readout(v, p));
  }

 private:
  int64_t dim_;
};

class ExpFamBlock : public CatalogueBlock<ExpFamAttention> {
 public:
  ExpFamBlock(const EnergyBlockOptions& o, Rng& rng)
      : CatalogueBlock(std::make_shared<ExpFamAttention>(
            ExpFamAttentionOptions{.measure = ExpFamMeasure::kDiscrete,
                                   .dim = o.dim,
                                   .heads = o.heads,
                                   .beta = o.beta,
                                   .update = ExpFamUpdate::kCccp,
                                   .dtype = o.dtype},
            rng)),
        dim_(o.dim) {
    SP_CHECK(!o.causal, "ExpFamBlock: the expfam energy has no attention mask (causal is not "
                        "supported)");
  }
  std::string Name() const override { return "ExpFamBlock"; }

  EnergyBlockProblem Prepare(const Var& u) const override {
    CheckInjection("ExpFamBlock", u, dim_);
    return EnergyBlockProblem{typed_->Prepare(u), u, u, {}};
  }
  Var Readout(const Var& eta, const EnergyBlockProblem& problem) const override {
    return add(problem.injection, eta);
  }

 private:
  int64_t dim_;
};

class EnergyTransformerEnergyBlock : public CatalogueBlock<EnergyTransformerBlock> {
 public:
  EnergyTransformerEnergyBlock(const EnergyBlockOptions& o, Rng& rng)
      : CatalogueBlock(std::make_shared<EnergyTransformerBlock>(
            [&] {
              EnergyTransformerOptions options;
              options.dim = o.dim;
              options.heads = o.heads;
              options.head_dim = o.dim / o.heads;
              options.memories = o.memories;
              options.memory = o.memory;
              options.beta = o.beta;
              options.causal = o.causal;
              options.key_grad = o.key_grad;
              options.dynamics = o.dynamics;
              options.step = o.step;
              options.dtype = o.dtype;
              return options;
            }(),
            rng)),
        dim_(o.dim) {}
  std::string Name() const override { return "EnergyTransformerEnergyBlock"; }

  EnergyBlockProblem Prepare(const Var& u) const override {
    CheckInjection("EnergyTransformerEnergyBlock", u, dim_);
    EnergyContext context = typed_->Prepare(u);
    context.Set("input", u);  // the external current
    return EnergyBlockProblem{context, u, u, {}};
  }
  Var Readout(const Var& x, const EnergyBlockProblem&) const override { return x; }

 private:
  int64_t dim_;
};

template <typename Block>
EnergyBlockFactory Factory() {
  return [](const EnergyBlockOptions& options, Rng& rng) -> std::shared_ptr<EnergyBlock> {
    return std::make_shared<Block>(options, rng);
  };
}

}  // namespace

Registry<EnergyBlockFactory>& EnergyBlockRegistry() {
  // Created on first use and never destroyed (see registry.cc).
  static Registry<EnergyBlockFactory>* registry = [] {
    auto* r = new Registry<EnergyBlockFactory>("energy block");
    r->Register("hopfield", Factory<HopfieldBlock>(),
                "modern Hopfield attention: CCCP retrieval from xi_0 = u W_Q over the stored "
                "patterns u W_K; out = u + values read with the final association");
    r->Register("probabilistic", Factory<ProbabilisticBlock>(),
                "probabilistic (Gaussian-mixture) attention: EM over the values; out = u + "
                "values W_O");
    r->Register("expfam", Factory<ExpFamBlock>(),
                "exponential-family attention, discrete measure over u W_K: eta <- grad G(eta) "
                "from eta_0 = u; out = u + eta*");
    r->Register("energy_transformer", Factory<EnergyTransformerEnergyBlock>(),
                "Energy Transformer block: tokens from u, driven by u, to the stationary state");
    return r;
  }();
  return *registry;
}

std::shared_ptr<EnergyBlock> CreateEnergyBlock(const EnergyBlockOptions& options, Rng& rng) {
  SP_CHECK(options.dim > 0 && options.heads > 0 && options.dim % options.heads == 0,
           "energy block '", options.layer, "': dim (", options.dim,
           ") must be a positive multiple of heads (", options.heads, ")");
  return EnergyBlockRegistry().Get(options.layer)(options, rng);
}

}  // namespace stillpoint
