#include "layers/positions.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "framework/check.h"
#include "framework/ops.h"
#include "solvers/enum_names.h"

namespace stillpoint {
namespace {

struct GridPoint {
  int64_t row = 0, col = 0;
};

// Whether the layout's geometry is a grid: a 2-D scheme, or a task that
// says its tokens form one.
bool OnGrid(const AttentionLayout& layout) {
  return layout.TwoDimensional() || layout.grid_width > 0;
}

// The columns of the grid of `length` tokens (see positions.h).
int64_t GridWidth(const AttentionLayout& layout, int64_t length) {
  if (layout.grid_width > 0) {
    SP_CHECK(length % layout.grid_width == 0, "positions: ", length,
             " tokens do not fill whole rows of a grid ", layout.grid_width, " wide");
    return layout.grid_width;
  }
  const auto side = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(length))));
  SP_CHECK(side * side == length, "positions: ", ToString(layout.positions), " needs a grid: ",
           length, " tokens are not a square grid and the task gives no grid width");
  return side;
}

// Token t's place: (0, t) in a sequence, (t / W, t % W) on a grid.
std::vector<GridPoint> Places(const AttentionLayout& layout, int64_t length, bool grid) {
  std::vector<GridPoint> places(length);
  const int64_t width = grid ? GridWidth(layout, length) : length;
  for (int64_t t = 0; t < length; ++t) places[t] = {t / width, t % width};
  return places;
}

}  // namespace

#define SP_POSITION_SCHEME_NAME(value, name, doc) \
  case PositionScheme::value:                     \
    return name;
const char* ToString(PositionScheme scheme) {
  switch (scheme) { SP_POSITION_SCHEMES(SP_POSITION_SCHEME_NAME) }
  return "unknown";
}
#undef SP_POSITION_SCHEME_NAME

const std::vector<PositionScheme>& AllPositionSchemes() {
#define SP_POSITION_SCHEME_VALUE(value, name, doc) PositionScheme::value,
  static const std::vector<PositionScheme> all{SP_POSITION_SCHEMES(SP_POSITION_SCHEME_VALUE)};
#undef SP_POSITION_SCHEME_VALUE
  return all;
}

bool StringToPositionScheme(const std::string& text, PositionScheme* scheme) {
  return internal::ParseEnumByName(text, AllPositionSchemes(), scheme);
}

std::string PositionSchemesDoc() {
  std::string doc;
#define SP_POSITION_SCHEME_DOC(value, name, text) doc += std::string(name) + ": " + text + "; ";
  SP_POSITION_SCHEMES(SP_POSITION_SCHEME_DOC)
#undef SP_POSITION_SCHEME_DOC
  return doc.substr(0, doc.size() - 2);
}

#define SP_ATTENTION_MASK_NAME(value, name, doc) \
  case AttentionMaskKind::value:                 \
    return name;
const char* ToString(AttentionMaskKind mask) {
  switch (mask) { SP_ATTENTION_MASKS(SP_ATTENTION_MASK_NAME) }
  return "unknown";
}
#undef SP_ATTENTION_MASK_NAME

const std::vector<AttentionMaskKind>& AllAttentionMaskKinds() {
#define SP_ATTENTION_MASK_VALUE(value, name, doc) AttentionMaskKind::value,
  static const std::vector<AttentionMaskKind> all{SP_ATTENTION_MASKS(SP_ATTENTION_MASK_VALUE)};
#undef SP_ATTENTION_MASK_VALUE
  return all;
}

bool StringToAttentionMaskKind(const std::string& text, AttentionMaskKind* mask) {
  return internal::ParseEnumByName(text, AllAttentionMaskKinds(), mask);
}

std::string AttentionMasksDoc() {
  std::string doc;
#define SP_ATTENTION_MASK_DOC(value, name, text) doc += std::string(name) + ": " + text + "; ";
  SP_ATTENTION_MASKS(SP_ATTENTION_MASK_DOC)
#undef SP_ATTENTION_MASK_DOC
  return doc.substr(0, doc.size() - 2);
}

bool AttentionLayout::Rotary() const {
  return positions == PositionScheme::kRotary || positions == PositionScheme::kRotary2d;
}

bool AttentionLayout::Alibi() const {
  return positions == PositionScheme::kAlibi || positions == PositionScheme::kAlibi2d;
}

bool AttentionLayout::TwoDimensional() const {
  return positions == PositionScheme::kAlibi2d || positions == PositionScheme::kRotary2d;
}

bool AttentionLayout::NeedsBias() const {
  return Alibi() || mask == AttentionMaskKind::kLocal ||
         (mask == AttentionMaskKind::kCausal && window > 0);
}

std::string AttentionLayout::Check(int64_t heads, int64_t head_dim) const {
  std::ostringstream problem;
  if (mask == AttentionMaskKind::kLocal && window < 1) {
    problem << "attention_mask local needs attention_window >= 1, got " << window;
  } else if (mask == AttentionMaskKind::kNone && window != 0) {
    problem << "attention_window " << window << " needs attention_mask causal or local";
  } else if (window < 0) {
    problem << "attention_window must be >= 0, got " << window;
  } else if (positions == PositionScheme::kRotary && head_dim % 2 != 0) {
    problem << "positions rotary needs an even head width (dim / heads), got " << head_dim;
  } else if (positions == PositionScheme::kRotary2d && head_dim % 4 != 0) {
    problem << "positions rotary_2d needs a head width (dim / heads) that is a multiple of 4, got "
            << head_dim;
  } else if (heads < 1) {
    problem << "heads must be >= 1, got " << heads;
  }
  return problem.str();
}

std::string AttentionLayout::ToString() const {
  std::ostringstream out;
  out << "positions " << stillpoint::ToString(positions) << ", mask "
      << stillpoint::ToString(mask);
  if (window > 0) out << " (window " << window << ")";
  if (grid_width > 0) out << ", grid width " << grid_width;
  return out.str();
}

namespace {

// The bias of query i's score of key j: -inf where the mask hides the key,
// -slope d(i, j) for ALiBi (slope 0: none), 0 elsewhere.
double BiasEntry(const AttentionLayout& layout,
                 const std::vector<GridPoint>& places,
                 bool grid,
                 double slope,
                 int64_t i,
                 int64_t j) {
  const int64_t dr = std::llabs(places[i].row - places[j].row);
  const int64_t dc = std::llabs(places[i].col - places[j].col);
  bool hidden = false;
  switch (layout.mask) {
    case AttentionMaskKind::kNone:
      break;
    case AttentionMaskKind::kCausal:
      hidden = j > i || (layout.window > 0 && j < i - layout.window);
      break;
    case AttentionMaskKind::kLocal:
      hidden = (grid ? std::max(dr, dc) : std::llabs(i - j)) > layout.window;
      break;
  }
  if (hidden) return -INFINITY;
  // ALiBi's distance follows the scheme (1-D on a grid for alibi), the
  // local mask's the data's geometry.
  const bool alibi_grid = layout.positions == PositionScheme::kAlibi2d;
  return slope > 0.0 ? -slope * static_cast<double>(alibi_grid ? dr + dc : std::llabs(i - j))
                     : 0.0;
}

double AlibiSlope(const AttentionLayout& layout, int64_t heads, int64_t h) {
  return layout.Alibi()
             ? std::pow(2.0, -8.0 * static_cast<double>(h + 1) / static_cast<double>(heads))
             : 0.0;
}

}  // namespace

Tensor AttentionBias(const AttentionLayout& layout, int64_t heads, int64_t length, DType dtype) {
  if (!layout.NeedsBias() && layout.mask != AttentionMaskKind::kCausal) return Tensor();
  const int64_t bias_heads = layout.Alibi() ? heads : 1;
  const bool grid = OnGrid(layout);
  const std::vector<GridPoint> places = Places(layout, length, grid);
  std::vector<double> values(bias_heads * length * length, 0.0);
  for (int64_t h = 0; h < bias_heads; ++h) {
    const double slope = AlibiSlope(layout, heads, h);
    for (int64_t i = 0; i < length; ++i) {
      for (int64_t j = 0; j < length; ++j) {
        values[(h * length + i) * length + j] = BiasEntry(layout, places, grid, slope, i, j);
      }
    }
  }
  return Tensor::FromVector(Shape{1, bias_heads, length, length}, values, dtype);
}

AttentionNeighbours LocalNeighbours(const AttentionLayout& layout,
                                    int64_t heads,
                                    int64_t length,
                                    DType dtype) {
  SP_CHECK(layout.mask == AttentionMaskKind::kLocal && layout.window >= 1,
           "LocalNeighbours: needs attention_mask local with a window >= 1, got ",
           layout.ToString());
  const bool grid = OnGrid(layout);
  const std::vector<GridPoint> places = Places(layout, length, grid);
  // The keys within the window, in increasing order (as the dense scores
  // hold them): up to (2 W + 1)^2 on a grid, 2 W + 1 on a sequence.
  const int64_t side = 2 * layout.window + 1;
  const int64_t per_query = std::min<int64_t>(length, grid ? side * side : side);
  const int64_t bias_heads = layout.Alibi() ? heads : 0;
  AttentionNeighbours neighbours;
  neighbours.per_query = per_query;
  neighbours.keys.assign(length * per_query, -1);
  std::vector<double> bias(bias_heads * length * per_query, 0.0);
  for (int64_t i = 0; i < length; ++i) {
    int64_t n = 0;
    for (int64_t j = 0; j < length; ++j) {
      if (std::isinf(BiasEntry(layout, places, grid, 0.0, i, j))) continue;
      SP_CHECK(n < per_query, "LocalNeighbours: query ", i, " sees more than ", per_query,
               " keys");
      neighbours.keys[i * per_query + n] = j;
      for (int64_t h = 0; h < bias_heads; ++h) {
        bias[(h * length + i) * per_query + n] =
            BiasEntry(layout, places, grid, AlibiSlope(layout, heads, h), i, j);
      }
      ++n;
    }
  }
  if (bias_heads > 0) {
    neighbours.bias = Tensor::FromVector(Shape{bias_heads, length, per_query}, bias, dtype);
  }
  return neighbours;
}

Var ApplyRotary(const Var& x, const AttentionLayout& layout, int position_axis, bool inverse) {
  if (!layout.Rotary()) return x;
  const int rank = static_cast<int>(x.rank());
  SP_CHECK(position_axis >= 0 && position_axis < rank - 1, "ApplyRotary: position axis ",
           position_axis, " of ", x.shape(), " must come before the last (head width) axis");
  const int64_t length = x.dim(position_axis);
  const int64_t width = x.dim(rank - 1);
  const bool two_d = layout.positions == PositionScheme::kRotary2d;
  SP_CHECK(width % (two_d ? 4 : 2) == 0, "ApplyRotary: ", ToString(layout.positions),
           " needs a head width that is a multiple of ", two_d ? 4 : 2, ", got ", width);
  const std::vector<GridPoint> places = Places(layout, length, two_d);
  // Segments of the head width, each turned by one coordinate: the whole
  // width by t (1-D), or the halves by the row and by the column (2-D).
  const int segments = two_d ? 2 : 1;
  const int64_t segment = width / segments, half = segment / 2;
  std::vector<double> cosines(length * width), sines(length * width);
  for (int64_t t = 0; t < length; ++t) {
    for (int s = 0; s < segments; ++s) {
      const double position =
          static_cast<double>(two_d ? (s == 0 ? places[t].row : places[t].col) : t);
      for (int64_t k = 0; k < half; ++k) {
        const double frequency = std::pow(layout.rotary_base, -2.0 * static_cast<double>(k) /
                                                                  static_cast<double>(segment));
        const double angle = position * frequency * (inverse ? -1.0 : 1.0);
        const int64_t a = t * width + s * segment + k, b = a + half;
        cosines[a] = cosines[b] = std::cos(angle);
        // out_a = x_a cos - x_b sin, out_b = x_b cos + x_a sin.
        sines[a] = -std::sin(angle);
        sines[b] = std::sin(angle);
      }
    }
  }
  std::vector<int64_t> dims(rank, 1);
  dims[position_axis] = length;
  dims[rank - 1] = width;
  const Var c = constant(Tensor::FromVector(Shape(dims), cosines, x.dtype()));
  const Var sn = constant(Tensor::FromVector(Shape(dims), sines, x.dtype()));
  // The partner of every entry: (x_b, x_a) per pair, segment by segment.
  VarList swapped;
  for (int s = 0; s < segments; ++s) {
    swapped.push_back(slice(x, rank - 1, s * segment + half, (s + 1) * segment));
    swapped.push_back(slice(x, rank - 1, s * segment, s * segment + half));
  }
  return add(mul(x, c), mul(concat(swapped, rank - 1), sn));
}

Var ApplyRotaryMerged(const Var& x, const AttentionLayout& layout, int64_t heads, bool inverse) {
  if (!layout.Rotary()) return x;
  SP_CHECK(x.rank() == 3 && x.dim(2) % heads == 0, "ApplyRotaryMerged: ", x.shape(),
           " must be [B, T, heads * dh] with heads ", heads);
  const Var split = reshape(x, Shape{x.dim(0), x.dim(1), heads, x.dim(2) / heads});
  return reshape(ApplyRotary(split, layout, 1, inverse), x.shape());
}

}  // namespace stillpoint
