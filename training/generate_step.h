// Incremental decoding of a causal character model for generation
// (training/generate.h): each Push reads one more symbol at the next
// position and returns that position's logits, reusing what the earlier
// positions left behind (every cell's attention keys and values, KeyValueCache
// in layers/attention.h), so a symbol costs one position's work instead of a
// forward pass over the whole window.
//
//   explicit: the L cells in turn at the new position, one cache each;
//   tied (and an implicit model with a depth override): the one cell
//     unrolled, one cache per step;
//   implicit: the new position's own fixed point z_t = f(z*_<t, z_t; u_t),
//     solved alone by the model's forward solver (the keys and values of
//     the earlier positions come from their fixed points): for a causal
//     cell the joint fixed point of a window, restricted to its first t + 1
//     positions, is the fixed point of those positions, so solving one
//     position after another reaches the same states as one joint solve.
//     Each solve starts from the previous position's fixed point
//     (warm_start) or from zeros.
//
// Several symbols can be read at once (a prompt, or the symbols a slid
// window keeps): one pass over them as a chunk, each seeing the cache and
// the chunk's earlier symbols (for the implicit kind, one joint solve of the
// chunk's positions).
//
// The logits equal the last row of SequenceModel::Forward over the same
// symbols (positions 0..length()-1) up to rounding for the stacked kinds,
// and up to the solver's tolerance for the implicit one (tests/training/
// generate_step_test.cc). Learned positions are absolute, so a window cannot
// slide by one symbol without every state changing: Slide(keep) starts a new
// window from the last `keep` symbols, read again at positions 0..keep-1, as
// a forward pass over those symbols would read them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "layers/attention.h"
#include "layers/models.h"

namespace stillpoint {

class StepDecoder {
 public:
  // Whether `model` can be decoded this way: token ids, a causal cell with
  // an incremental step (DEQCell with softmax attention, positions learned
  // or none, no attention window), kind explicit, tied or implicit (the
  // energy kind's block is solved over every position at once). Else false
  // with the reason in *why.
  static bool Supports(const SequenceModel& model, std::string* why = nullptr);

  // Throws Error when !Supports(model). The model must outlive the decoder
  // and stay in evaluation mode while it is used.
  StepDecoder(const SequenceModel& model, bool warm_start);

  // Forgets every position.
  void Reset();
  // Reads `ids` (at least one) at positions length(), length() + 1, ...
  // (below model.max_length with learned positions) and returns the logits
  // of the last one over the vocabulary (V values).
  std::vector<double> Push(const std::vector<int64_t>& ids);
  std::vector<double> Push(int64_t id) { return Push(std::vector<int64_t>{id}); }
  // Starts a new window from the last `keep` symbols (1 <= keep <=
  // length()), read again at positions 0..keep-1 (an implicit model's solve
  // starts from their fixed points in the old window); returns the logits of
  // the last one.
  std::vector<double> Slide(int64_t keep);

  int64_t length() const { return static_cast<int64_t>(symbols_.size()); }
  const std::vector<int64_t>& symbols() const { return symbols_; }
  // Implicit models: forward iterations of the last Push's or Slide's
  // solve, and whether it met the solver's tolerance; 0 and true otherwise.
  int64_t last_iterations() const { return last_iterations_; }
  bool last_converged() const { return last_converged_; }

 private:
  // Reads ids after the cached positions; implicit: the solve starts from
  // `start` ([1, ids.size(), d]; undefined: zeros).
  std::vector<double> Read(const std::vector<int64_t>& ids, const Tensor& start);

  const SequenceModel& model_;
  bool warm_start_;
  bool solve_ = false;       // implicit: one fixed point per position
  bool first_step_ = false;  // input_injection first_step: z0 = u, no injection
  std::vector<const Cell*> layers_;  // the cell of every layer or unrolled step
  std::vector<KeyValueCache> caches_;  // one per entry of layers_
  std::vector<int64_t> symbols_;  // the window's symbols, position order
  Tensor states_;  // implicit: the window's fixed points [1, length(), d]
  int64_t last_iterations_ = 0;
  bool last_converged_ = true;
};

}  // namespace stillpoint
