// Dropout: in training mode, zeroes each entry with probability p and scales
// the survivors by 1 / (1 - p), so the expected output equals the input. In
// evaluation mode (Module::Eval) and for p = 0 it is the identity.
//
// Frozen masks. Inside an implicit layer, the map z -> f(z) must be the same
// function at every solver iteration, or there is no fixed point to find.
// FreezeMask() makes the next Forward draw a mask and keeps it: every later
// Forward reuses it (a "variational" mask) until ReleaseMask(). The Implicit
// wrapper freezes the masks of its cell for each solve and keeps them until
// the next one, so the backward pass sees the same function as the forward.
//
// Samples. Solvers evaluate the map on the rows of the samples that are
// still iterating. Forward(x, sample_ids) says which sample each row of x
// belongs to (row r is sample sample_ids[r]); a frozen mask is indexed by
// sample, so a sample keeps its mask whichever rows are evaluated together.
// The frozen mask is drawn at the first Forward after FreezeMask() with
// max(sample_ids) + 1 rows, so that call should include every sample (as a
// solver's first evaluation does); a later id beyond it is an Error.
//
// Shapes: x [N, ...] -> same shape. Not a parameterised layer: no parameters.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "framework/autograd.h"
#include "framework/module.h"
#include "framework/option_fields.h"
#include "framework/random.h"
#include "framework/tensor.h"

namespace stillpoint {

struct DropoutOptions {
  // Probability of zeroing an entry, in [0, 1).
  double p = 0.1;
  // Seed of the layer's own random stream (masks are reproducible).
  uint64_t seed = 0;

  // The fields, declared once (framework/option_fields.h); not config keys.
  static const OptionFields<DropoutOptions>& Fields();
  // The fields' ranges: p in [0, 1).
  bool IsValid(std::string* error) const;
  std::string ToString() const;
};

class Dropout : public Module {
 public:
  explicit Dropout(const DropoutOptions& options = {});

  std::string Name() const override;

  // x [N, ...] -> x * mask. Row r of x is sample r.
  Var Forward(const Var& x);
  // x [k, ...] with k = sample_ids.size(): row r of x is sample sample_ids[r].
  Var Forward(const Var& x, const std::vector<int64_t>& sample_ids);

  // Keep the next drawn mask for every later Forward (see above). Calling it
  // while frozen keeps the current mask.
  void FreezeMask();
  // Drop the frozen mask; later Forwards draw fresh masks again.
  void ReleaseMask();
  bool mask_frozen() const { return frozen_; }
  // The frozen mask, [samples, ...] with entries 0 or 1 / (1 - p); empty
  // until the first Forward after FreezeMask().
  const Tensor& frozen_mask() const { return mask_; }

  double p() const { return p_; }
  // The layer's random stream, for checkpoints (Rng::SaveState's text), and
  // its restoration (false when the text does not parse): a run resumed from
  // a checkpoint draws the masks an uninterrupted run would.
  std::string SaveStreamState() const { return rng_.SaveState(); }
  bool LoadStreamState(const std::string& state) { return rng_.LoadState(state); }

 private:
  // A fresh [shape] mask of 0 and 1 / (1 - p) in dtype.
  Tensor DrawMask(const Shape& shape, DType dtype);

  double p_;
  Rng rng_;
  bool frozen_ = false;
  Tensor mask_;
};

// Freeze or release the masks of every Dropout in module's tree (module
// itself and its registered descendants).
void FreezeDropoutMasks(Module& module);
void ReleaseDropoutMasks(Module& module);

}  // namespace stillpoint
