// Cell: the interface of a layer map f(z; u) that models stack, unroll or
// solve to a fixed point z* = f(z*; u).
//
// Shapes: z (the state) and u (the injection) are [k, ...] with the same
// leading extent k: row r of both belongs to sample sample_ids[r] (an empty
// sample_ids means 0..k-1). The result has z's shape. For the transformer
// cells, z and u are [k, T, dim].
//
// Why sample ids: a fixed-point solver evaluates f on the samples that have
// not converged yet. A cell whose behaviour is per sample (a frozen dropout
// mask) uses the ids to stay the same function of each sample's state
// whichever rows are evaluated together. Most cells ignore them.
//
// CellOptions holds the hyperparameters common to transformer cells, so the
// registry (registry.h) can build any registered cell from one description;
// a cell with knobs of its own reads them from `extra` by name.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "framework/autograd.h"
#include "framework/module.h"
#include "framework/ops.h"
#include "framework/option_fields.h"
#include "framework/tensor.h"
#include "layers/energy_block.h"
#include "layers/positions.h"
#include "solvers/implicit_solve.h"

namespace stillpoint {

struct KeyValueCache;  // layers/attention.h

struct CellOptions {
  // Width of the state (the model dimension d).
  int64_t dim = 64;
  // Attention heads; dim must be a multiple.
  int64_t heads = 4;
  // Hidden width of the feed-forward block.
  int64_t hidden = 128;
  // Epsilon of the cell's layer norms.
  double ln_eps = 1e-5;
  // Autoregressive attention masking.
  bool causal = false;
  // The model's positions and attention mask (positions.h) for the cell's
  // attention, softmax or energy; null: none. Not a field (the model's
  // model.positions, model.attention_mask and model.attention_window).
  std::shared_ptr<const AttentionLayout> layout = nullptr;
  // Dropout probability inside the cell (0 = none). Inside an implicit layer
  // the masks are frozen per solve (see dropout.h).
  double dropout = 0.0;
  // Seed of the cell's dropout stream.
  uint64_t dropout_seed = 0;
  DType dtype = DType::kFloat32;
  // The attention sublayer: "softmax" (multi-head scaled dot-product
  // attention) or the name of an energy block (EnergyBlockRegistry(): the
  // built-ins of energy_block_list.h, or a user's), whose
  // output is read at the fixed point of its energy (energy_attention.h).
  std::string attention = "softmax";
  // The energy block's options when attention is not softmax (dim, heads,
  // causal and dtype are set from this struct).
  EnergyBlockOptions energy;
  // The inner solve of an energy attention; nullopt: its defaults
  // (DefaultAttentionSolverOptions in energy_attention.h).
  std::optional<ImplicitOptions> attention_solver;
  // Warm start of that inner solve across the iterations of an outer solve
  // (EnergyAttentionOptions::warm_start; model.attention_solver.warm_start).
  bool attention_warm_start = true;
  // Cell-specific numeric options, by name (unknown names are an Error in
  // the cell that reads them).
  std::map<std::string, double> extra = {};

  // The model.* keys of the cell (framework/option_fields.h; ModelOptions
  // includes them): attention, heads, hidden, dropout, ln_eps. dim and
  // causal are settings for code only.
  static const OptionFields<CellOptions>& Fields();
  // The fields' ranges (whether dim must be a multiple of heads is the
  // attention's to say; an energy attention's block and solver options are
  // checked where the attention is built).
  bool IsValid(std::string* error) const;
  std::string ToString() const;
};

class Cell : public Module {
 public:
  // f(z; u) for the samples sample_ids (see above). z, u: [k, ...] -> z's shape.
  virtual Var Forward(const Var& z, const Var& u, const std::vector<int64_t>& sample_ids) const = 0;
  // f(0; u): the map at the zero state, where every stacked or unrolled
  // model starts. Equal to Forward(zeros_like(u), u, sample_ids) up to
  // rounding, values and gradients alike. A cell that can evaluate it for
  // less overrides it (DEQCell: attention over a zero state is one row).
  virtual Var ForwardAtZero(const Var& u, const std::vector<int64_t>& sample_ids) const {
    return Forward(zeros_like(u), u, sample_ids);
  }

  // Incremental decoding of a causal cell (text generation): f at n >= 1
  // new positions, z and u [B, n, dim], given `past`, what the cell keeps of
  // the earlier positions' states (for a transformer cell, its attention's
  // keys and values); the same values, up to rounding, as the last n rows
  // of Forward over all positions. With `next`, *next becomes past plus the
  // new positions (it may be &past). A cell that cannot (the default, or a
  // non-causal one) says why in SupportsStep and throws here.
  virtual bool SupportsStep(std::string* why) const {
    if (why != nullptr) *why = "the cell has no incremental step";
    return false;
  }
  virtual Var ForwardStep(const Var& z, const Var& u, const KeyValueCache& past,
                          KeyValueCache* next) const;
};

}  // namespace stillpoint
