// The built-in energy blocks, one line each. Everything that names them is
// made from this list, so an energy attention is its own file plus one line
// here:
//   - the names model.energy.layer and model.attention accept, with
//     did-you-mean, in the registry (EnergyBlockRegistry(),
//     layers/energy_block.cc), and through it the schema, docs/config.md,
//     the CLI's help and completion, `stillpoint bench`'s choices and the
//     Python module's energy_blocks();
//   - the text "built-in: ..." of the keys' docs (BuiltinEnergyBlockList()).
//
// SP_ENERGY_BLOCKS(X) calls X(Name, "name", "doc") per block:
//   Name    the block is built by `std::shared_ptr<EnergyBlock>
//           CreateNameBlock(const EnergyBlockOptions&, Rng&)`, defined in
//           its own file layers/energy_block_<name>.cc (see
//           energy_block_hopfield.cc; layers/energy_block_catalogue.h has
//           the base the built-ins share)
//   "name"  its spelling in model.energy.layer and model.attention
//   "doc"   one line for the registry's listing
//
// A new block goes at the end. tests/layers/family_lists_test.cc fails when
// another file copies the names by hand.
#pragma once

#include <memory>

#include "framework/random.h"
#include "layers/energy_block.h"

#define SP_ENERGY_BLOCKS(X)                                                                    \
  X(Hopfield, "hopfield",                                                                      \
    "modern Hopfield attention with the query as an external field: CCCP xi <- q + K^T "       \
    "softmax(beta K xi) from xi_0 = q; out = values read with the final association")          \
  X(Probabilistic, "probabilistic",                                                            \
    "probabilistic (Gaussian-mixture) attention: EM over the values; out = values W_O")        \
  X(ExpFam, "expfam",                                                                          \
    "exponential-family attention, discrete measure over x W_K (each head's patterns at norm " \
    "sqrt(0.5 / beta): a contraction) with the query x W_Q as a field: eta <- q + grad "       \
    "G(eta); out = grad G(eta*) W_O")                                                          \
  X(EnergyTransformer, "energy_transformer",                                                   \
    "Energy Transformer block: tokens from x, driven by x, to the stationary state; out = x* " \
    "- x")

namespace stillpoint {

#define SP_DECLARE_ENERGY_BLOCK(Name, name, doc) \
  std::shared_ptr<EnergyBlock> Create##Name##Block(const EnergyBlockOptions& options, Rng& rng);
SP_ENERGY_BLOCKS(SP_DECLARE_ENERGY_BLOCK)
#undef SP_DECLARE_ENERGY_BLOCK

}  // namespace stillpoint
