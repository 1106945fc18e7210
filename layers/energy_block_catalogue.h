// What the built-in energy blocks (energy_block_list.h) share: the checked,
// normalised input, the default inverse temperature, and CatalogueBlock, the
// base that owns the block's energy layer ("layer") and its input norm
// ("norm"). Internal to the layers library: each block's file includes it.
#pragma once

#include <cmath>
#include <memory>
#include <string>
#include <utility>

#include "framework/check.h"
#include "layers/energy_block.h"
#include "layers/layer_norm.h"
#include "layers/positions.h"

namespace stillpoint {

inline void CheckInjection(const std::string& block, const Var& u, int64_t dim) {
  SP_CHECK(u.defined() && u.rank() == 3 && u.dim(2) == dim, block,
           ": the injection must be [B, T, ", dim, "], got ",
           u.defined() ? u.shape().ToString() : std::string("undefined"));
}

// 1/sqrt(dh) when beta is 0 (the options' default), else beta.
inline double ResolvedBeta(const EnergyBlockOptions& o) {
  return o.beta > 0.0 ? o.beta : 1.0 / std::sqrt(static_cast<double>(o.dim / o.heads));
}

// The common part: owns the layer as the child "layer" (EnergyBlockOf) and
// the input norm as "norm" (normalize_input).
template <typename Layer, typename Extras = NoExtras>
class CatalogueBlock : public EnergyBlockOf<Layer, Extras> {
 public:
  using typename EnergyBlockOf<Layer, Extras>::Problem;

  CatalogueBlock(const char* name, const EnergyBlockOptions& o, std::shared_ptr<Layer> layer)
      : EnergyBlockOf<Layer, Extras>(std::move(layer)),
        name_(name),
        dim_(o.dim),
        heads_(o.heads),
        causal_(o.causal),
        dtype_(o.dtype),
        layout_(o.layout) {
    if (layout_) {
      const std::string problem = layout_->Check(o.heads, o.dim / o.heads);
      SP_CHECK(problem.empty(), name, ": ", problem);
    }
    if (o.normalize_input) {
      norm_ = this->RegisterModule(
          "norm", std::make_shared<LayerNorm>(o.dim, LayerNormOptions{.dtype = o.dtype}));
    }
  }
  std::string Name() const override { return name_; }

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
  Var Rotate(const Var& heads) const { return layout_ ? ApplyRotary(heads, *layout_, 2) : heads; }
  bool Rotary() const { return layout_ && layout_->Rotary(); }

  const char* name_;
  int64_t dim_;
  int64_t heads_;
  bool causal_;
  DType dtype_;
  std::shared_ptr<const AttentionLayout> layout_;

 private:
  std::shared_ptr<LayerNorm> norm_;
};

}  // namespace stillpoint
