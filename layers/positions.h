// How attention sees the order of the tokens: the position scheme and the
// attention mask, shared by softmax attention and every energy attention.
//
// Position schemes (model.positions), one line each in SP_POSITION_SCHEMES:
// the enum PositionScheme, its names (ToString, StringToPositionScheme,
// AllPositionSchemes; through them the YAML key, its did-you-mean and the
// config reference) and the documentation come from that list.
//
//   learned    u = E[x] + P[t]: a learned table of model.max_length rows
//              (the default; a sequence longer than the table is an error).
//   none       u = E[x]: no position at all (the attention mask alone
//              orders the tokens).
//   alibi      a bias -m_h |i - j| on the attention logits of head h
//              (Press et al., ALiBi), slopes m_h = 2^(-8 h / H), h = 1..H;
//              nothing is learned, so any length works.
//   rotary     queries and keys rotated by their position (Su et al.,
//              RoFormer): in each head the pairs (k, k + dh/2) turn by the
//              angle t * base^(-2k/dh), so q_i.k_j depends on i - j only;
//              needs an even head width.
//   alibi_2d   alibi with the grid distance |r_i - r_j| + |c_i - c_j| of a
//              row-major grid (AttentionLayout::grid_width columns).
//   rotary_2d  rotary with the first half of each head turned by the row and
//              the second half by the column; needs a head width that is a
//              multiple of 4.
//
// The 2-D schemes need a grid: grid_width > 0 (the task's
// DatasetInfo::grid_width, which the trainer hands the model), or, when it
// is 0, a square grid of sqrt(T) columns (T must then be a square).
//
// Attention masks (model.attention_mask, model.attention_window W), in
// SP_ATTENTION_MASKS:
//   none     every query sees every key.
//   causal   query i sees keys j <= i; with W > 0 only i - W <= j <= i.
//   local    query i sees keys with distance <= W (W >= 1): |i - j| in a
//            sequence, max(|r_i - r_j|, |c_i - c_j|) on a grid (a
//            (2W+1) x (2W+1) neighbourhood, the receptive field of a
//            convolution).
// A hidden key gets weight exactly 0 (its logit is -inf), in the softmax of
// every solver iteration of an energy attention too, so causality holds at
// the fixed point: an earlier token's output never depends on a later one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "framework/autograd.h"
#include "framework/ops_neighbour_attention.h"
#include "framework/tensor.h"

namespace stillpoint {

// X(value, "name", "doc") per scheme. A new scheme goes at the end.
#define SP_POSITION_SCHEMES(X)                                                                   \
  X(kLearned, "learned",                                                                         \
    "a learned table of model.max_length positions added to the token embedding (lengths above " \
    "model.max_length are an error)")                                                            \
  X(kNone, "none", "no positions (the attention mask alone orders the tokens)")                  \
  X(kAlibi, "alibi",                                                                             \
    "ALiBi: the bias -m_h |i - j| on head h's attention logits, m_h = 2^(-8h/H); any length")    \
  X(kRotary, "rotary",                                                                           \
    "rotary: queries and keys rotated by their position, so logits depend on i - j; any "        \
    "length; even head width")                                                                   \
  X(kAlibi2d, "alibi_2d",                                                                        \
    "ALiBi on a grid: the bias -m_h (|dr| + |dc|) (the task's grid, or a square one)")           \
  X(kRotary2d, "rotary_2d",                                                                      \
    "rotary on a grid: half of each head turned by the row, half by the column; head width a "   \
    "multiple of 4")

#define SP_POSITION_SCHEME_ENUMERATOR(value, name, doc) value,
enum class PositionScheme { SP_POSITION_SCHEMES(SP_POSITION_SCHEME_ENUMERATOR) };
#undef SP_POSITION_SCHEME_ENUMERATOR

const char* ToString(PositionScheme scheme);
// Accepts the ToString spelling in any letter case; false otherwise.
bool StringToPositionScheme(const std::string& text, PositionScheme* scheme);
const std::vector<PositionScheme>& AllPositionSchemes();
// "name: doc" of every scheme, one per line (for the config reference).
std::string PositionSchemesDoc();

#define SP_ATTENTION_MASKS(X)                                                           \
  X(kNone, "none", "every query sees every key")                                        \
  X(kCausal, "causal",                                                                  \
    "query i sees keys j <= i (with model.attention_window W > 0: i - W <= j <= i)")    \
  X(kLocal, "local",                                                                    \
    "query i sees keys within distance model.attention_window (>= 1): |i - j|, or the " \
    "larger of the row and column distances on a grid")

#define SP_ATTENTION_MASK_ENUMERATOR(value, name, doc) value,
enum class AttentionMaskKind { SP_ATTENTION_MASKS(SP_ATTENTION_MASK_ENUMERATOR) };
#undef SP_ATTENTION_MASK_ENUMERATOR

const char* ToString(AttentionMaskKind mask);
bool StringToAttentionMaskKind(const std::string& text, AttentionMaskKind* mask);
const std::vector<AttentionMaskKind>& AllAttentionMaskKinds();
std::string AttentionMasksDoc();

struct AttentionLayout {
  AttentionMaskKind mask = AttentionMaskKind::kNone;
  // causal: 0 = unbounded, W > 0 = the last W keys and the query's own;
  // local: the distance W >= 1.
  int64_t window = 0;
  PositionScheme positions = PositionScheme::kLearned;
  // Rotary schemes: the base of the frequencies.
  double rotary_base = 10000.0;
  // Columns of the grid the tokens form, row-major (0: a sequence, or for
  // the 2-D schemes a square grid). Set at run time from the data.
  int64_t grid_width = 0;

  bool Rotary() const;
  bool Alibi() const;
  bool TwoDimensional() const;
  // Whether AttentionBias has anything to add (a mask other than plain
  // causal, or ALiBi).
  bool NeedsBias() const;
  // Empty when the layout can be used with `heads` heads of width head_dim;
  // otherwise what is wrong (rotary: even width; rotary_2d: multiple of 4;
  // local: window >= 1; window > 0 only with a mask).
  std::string Check(int64_t heads, int64_t head_dim) const;
  std::string ToString() const;
};

// The additive bias over the self-attention logits of `length` tokens:
// [1, heads or 1, length, length] of `dtype`, -inf where the mask hides a
// key, -m_h d(i, j) for ALiBi, 0 elsewhere. Undefined when the layout adds
// nothing (no mask, no ALiBi). Throws when a 2-D layout cannot place
// `length` tokens on its grid.
Tensor AttentionBias(const AttentionLayout& layout, int64_t heads, int64_t length, DType dtype);

// The keys each of `length` tokens sees under a local mask (layout.mask
// local), as neighbour_attention takes them (framework/ops.h): the same keys
// and ALiBi bias as AttentionBias's finite entries, (2 W + 1)^2 slots per
// query on a grid (fewer used at its edges), without the [length, length]
// table.
AttentionNeighbours LocalNeighbours(const AttentionLayout& layout,
                                    int64_t heads,
                                    int64_t length,
                                    DType dtype);

// Rotary position encoding of x, whose last axis is one head's width dh and
// whose axis `position_axis` is the token position (e.g. [B, H, T, dh] with
// axis 2, or [B, T, H, dh] with axis 1); other layouts are returned as they
// are. inverse: the transposed rotation (by -angle), for the gradient of
// an energy through rotated queries and keys. Differentiable (a linear map).
Var ApplyRotary(const Var& x, const AttentionLayout& layout, int position_axis,
                bool inverse = false);

// ApplyRotary of x [B, T, heads * dh] (heads side by side, as projections
// produce them).
Var ApplyRotaryMerged(const Var& x, const AttentionLayout& layout, int64_t heads,
                      bool inverse = false);

}  // namespace stillpoint
