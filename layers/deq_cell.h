// DEQCell: the weight-tied, post-norm transformer cell of a DEQ transformer
// (bench/SPEC.md W1):
//
//   h = LN1(z + MHA(z) + u)
//   f = LN2(h + W2 GELU(W1 h + b1) + b2)
//
// MHA is the attention sublayer: explicit multi-head self-attention
// (attention.h) with `heads` heads of dim / heads when options.attention is
// "softmax" (the default), otherwise an energy attention (energy_attention.h)
// whose output is read at the fixed point of its energy; W1 [dim, hidden], W2 [hidden, dim]; GELU in its
// tanh form; both layer norms have a learned gain and bias. With
// options.dropout > 0, dropout is applied to the attention output and to
// the feed-forward output (before the residual additions); its masks follow
// the Dropout rules (frozen per solve inside Implicit).
//
// Shapes: z, u [k, T, dim] -> f [k, T, dim].
// Parameters (names match the reference implementation's):
//   wq, wk, wv, wo (.weight [dim, dim], .bias [dim]) for softmax attention,
//   or attention.block.* for an energy attention, ln1 (.gain, .bias [dim]),
//   fc1 (.weight [dim, hidden], .bias [hidden]), fc2 (.weight [hidden, dim],
//   .bias [dim]), ln2 (.gain, .bias [dim]), in this order.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "framework/autograd.h"
#include "framework/random.h"
#include "layers/attention.h"
#include "layers/cell.h"
#include "layers/dropout.h"
#include "layers/energy_attention.h"
#include "layers/layer_norm.h"
#include "layers/linear.h"

namespace stillpoint {

class DEQCell : public Cell {
 public:
  DEQCell(const CellOptions& options, Rng& rng);

  std::string Name() const override;

  // z, u [k, T, dim] -> [k, T, dim]. A z that is exactly zero and needs no
  // gradient goes to ForwardAtZero.
  Var Forward(const Var& z, const Var& u, const std::vector<int64_t>& sample_ids) const override;
  Var Forward(const Var& z, const Var& u) const { return Forward(z, u, {}); }
  // f(0; u) with the attention of the zero state as one row
  // (MultiHeadAttention::ForwardAtZero) and no z in the first residual sum.
  Var ForwardAtZero(const Var& u, const std::vector<int64_t>& sample_ids) const override;

  // Incremental decoding (Cell::ForwardStep): softmax attention that
  // MultiHeadAttention::SupportsStep, no dropout in training mode.
  bool SupportsStep(std::string* why) const override;
  Var ForwardStep(const Var& z, const Var& u, const KeyValueCache& past,
                  KeyValueCache* next) const override;

  const CellOptions& options() const { return options_; }
  // The softmax attention (null with an energy attention).
  const std::shared_ptr<MultiHeadAttention>& attention() const { return attention_; }
  // The energy attention (null with softmax attention).
  const std::shared_ptr<EnergyAttention>& energy_attention() const { return energy_attention_; }

 private:
  // The attention sublayer's output at z (without the residual).
  Var Attend(const Var& z, const std::vector<int64_t>& sample_ids) const;
  // Everything after the attention: dropout on `attended`, then
  // LN1(residual + attended + u) and the feed-forward block. residual: z, or
  // undefined at the zero state.
  Var AfterAttention(const Var& residual,
                     Var attended,
                     const Var& u,
                     const std::vector<int64_t>& sample_ids) const;

  CellOptions options_;
  // Not registered itself: its projections are registered as wq..wo, so the
  // parameter names are those of the reference cell.
  std::shared_ptr<MultiHeadAttention> attention_;
  // Registered as "attention".
  std::shared_ptr<EnergyAttention> energy_attention_;
  std::shared_ptr<LayerNorm> ln1_;
  std::shared_ptr<Linear> fc1_;
  std::shared_ptr<Linear> fc2_;
  std::shared_ptr<LayerNorm> ln2_;
  std::shared_ptr<Dropout> attention_dropout_;  // null when dropout == 0
  std::shared_ptr<Dropout> ffn_dropout_;
};

}  // namespace stillpoint
