// A float32 GEMM for the small, skinny products of this project's models.
//
// Why not OpenBLAS for these: on a [1024, 64] x [64, 64] projection or a
// per-head [256, 16] x [16, 256] score block, OpenBLAS spends a third of its
// time outside its inner kernel: it packs both operands on every call and
// zeroes C in a separate pass before accumulating into it (beta = 0). Here
// only op(B) is packed, into panels of one, two or four packets of columns
// (k x width, contiguous, zero-padded; see PanelShape), and a register-blocked
// micro-kernel computes a tile of C entirely in registers, reading op(A)
// in place (broadcast one entry at a time, which works as well for A as for
// A^T), and stores the tile once: no zeroing pass and no copy of A. A
// shallow B that is a single panel already (a head's [T, 16] keys, values
// or rows of a short sequence), or one of any depth whose rows are
// contiguous (a weight gradient's g of 64 columns), is read in place,
// without a copy either.
//
// The depth is cut into blocks of kDepthBlock so a B panel stays in L1; the
// first block stores its tile, later blocks add to it. Each C entry is the
// same sequence of fused multiply-adds whatever the thread count, so
// results are bitwise reproducible.

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "framework/kernels/gemm.h"

namespace stillpoint::internal {
namespace {

namespace ei = Eigen::internal;
using Packet = ei::packet_traits<float>::type;
constexpr int kLanes = ei::packet_traits<float>::size;
// Eight (or four) packets transposed in registers. (The packet type's vector
// attributes are dropped as a template argument; harmless, the block only
// holds them.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wignored-attributes"
using PacketBlock = ei::PacketBlock<Packet, kLanes>;
#pragma GCC diagnostic pop

// Three panel widths. A wide panel is two packets of columns and its tiles
// are 6 rows: 12 accumulators, which with AVX2 (6 x 16) and the two B
// packets and one broadcast fill 15 of the 16 registers. A narrow panel is
// one packet and its tiles are 12 rows (12 accumulators again): products
// with at most one packet of columns use it, where a wide panel would be
// half zero padding. That is a 16-wide head's P V, dQ, dK and dV when a
// packet holds 16 floats (AVX-512); with AVX2 only products of n <= 8.
// A quad panel is four packets, 64 columns, with 6-row tiles: 24
// accumulators, so only with AVX-512's 32 registers, and only where it
// pads n to no more columns than wide panels (n = 64, 128, 192: every
// projection and weight gradient of W1 and W2). Each tile then reads its
// rows of op(A) for 64 columns instead of 32, so op(A) is read half as
// often and there are half as many tiles. The multiply-adds of each C
// entry are the same, in the same order, so results are bitwise those of
// wide panels; the gain is in a training step, where op(A) is not already
// in cache (bench/RESULTS.md).
template <int kPackets>
struct PanelShape {
  static_assert(kPackets == 1 || kPackets == 2 || kPackets == 4);
  static constexpr int kWidth = kPackets * kLanes;
  static constexpr int kRows = kPackets == 1 ? 12 : 6;
};
constexpr int64_t kDepthBlock = 256;
// Packed B read by consecutive tiles: 16 KiB, half of a Zen/Skylake L1.
constexpr int64_t kGroupFloats = 4096;

bool UsesNarrowPanels(int64_t n) { return n <= kLanes; }

int64_t RoundUp(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// Four-packet panels: with 32 vector registers only (AVX-512), and only
// where they pad n to no more columns than two-packet panels do.
bool UsesQuadPanels(int64_t n) {
  return kLanes == 16 && n > 2 * kLanes && RoundUp(n, 4 * kLanes) == RoundUp(n, 2 * kLanes);
}

// Calls body(std::integral_constant<int, kPackets>) with the panel width
// of products with n columns.
template <typename Body>
decltype(auto) WithPanelsFor(int64_t n, Body&& body) {
  if (UsesNarrowPanels(n)) return body(std::integral_constant<int, 1>{});
  if (UsesQuadPanels(n)) return body(std::integral_constant<int, 4>{});
  return body(std::integral_constant<int, 2>{});
}

int64_t PanelWidthFor(int64_t n) {
  return UsesNarrowPanels(n) ? PanelShape<1>::kWidth
         : UsesQuadPanels(n) ? PanelShape<4>::kWidth
                             : PanelShape<2>::kWidth;
}

// Packs columns [col, col + kWidth) of scale op(B) for depths [k0, k0 +
// kc) as kc rows of kWidth floats; columns past n are zero. With
// column_sums (B not transposed) each packed row of B is also added to
// column_sums[col, col + width) in float64, as the row is read anyway.
template <int kPackets>
void PackPanel(bool trans_b,
               const float* b,
               int64_t ldb,
               int64_t n,
               int64_t col,
               int64_t k0,
               int64_t kc,
               float scale,
               float* out,
               double* column_sums = nullptr) {
  constexpr int kWidth = PanelShape<kPackets>::kWidth;
  const Packet scale_packet = ei::pset1<Packet>(scale);
  const int64_t width = std::min<int64_t>(kWidth, n - col);
  if (width < kWidth) std::fill(out, out + kc * kWidth, 0.0f);
  if (!trans_b && column_sums && width == kWidth) {
    // The sums stay in a local array across the rows (not a chain of
    // read-modify-writes of column_sums through memory). A loop of its own:
    // folded into the loop below, beside its partial-width branch, the
    // array is kept in memory and packing gets slower (bench/RESULTS.md).
    double sums[kWidth];
    for (int j = 0; j < kWidth; ++j) sums[j] = column_sums[col + j];
    for (int64_t kk = 0; kk < kc; ++kk) {
      const float* src = b + (k0 + kk) * ldb + col;
      float* dst = out + kk * kWidth;
      for (int q = 0; q < kPackets; ++q) {
        ei::pstore(dst + q * kLanes, ei::pmul(scale_packet, ei::ploadu<Packet>(src + q * kLanes)));
      }
#pragma GCC unroll 32
      for (int j = 0; j < kWidth; ++j) sums[j] += static_cast<double>(src[j]);
    }
    for (int j = 0; j < kWidth; ++j) column_sums[col + j] = sums[j];
    return;
  }
  if (!trans_b) {
    for (int64_t kk = 0; kk < kc; ++kk) {
      const float* src = b + (k0 + kk) * ldb + col;
      float* dst = out + kk * kWidth;
      if (width == kWidth) {
        for (int q = 0; q < kPackets; ++q) {
          ei::pstore(dst + q * kLanes,
                     ei::pmul(scale_packet, ei::ploadu<Packet>(src + q * kLanes)));
        }
      } else {
        for (int64_t j = 0; j < width; ++j) dst[j] = scale * src[j];
        if (column_sums) {
          for (int64_t j = 0; j < width; ++j) column_sums[col + j] += static_cast<double>(src[j]);
        }
      }
    }
    return;
  }
  // op(B) = B^T: column j of the panel is row col + j of B. Square blocks
  // of kLanes rows by kLanes depths are transposed in registers; the rest
  // (a partial panel, a depth tail) element by element.
  int64_t kk0 = 0;
  if (width == kWidth) {
    for (; kk0 + kLanes <= kc; kk0 += kLanes) {
      for (int q = 0; q < kPackets; ++q) {
        PacketBlock block;
        for (int l = 0; l < kLanes; ++l) {
          block.packet[l] = ei::ploadu<Packet>(b + (col + q * kLanes + l) * ldb + k0 + kk0);
        }
        ei::ptranspose(block);
        for (int l = 0; l < kLanes; ++l) {
          ei::pstore(out + (kk0 + l) * kWidth + q * kLanes,
                     ei::pmul(scale_packet, block.packet[l]));
        }
      }
    }
  }
  for (int64_t j = 0; j < width; ++j) {
    const float* src = b + (col + j) * ldb + k0;
    for (int64_t kk = kk0; kk < kc; ++kk) out[kk * kWidth + j] = scale * src[kk];
  }
}

// One depth of a tile: acc[r] += op(A)[r, kk] x the panel's row kk.
template <int kTileRows, int kPackets>
[[gnu::always_inline]] inline void TileStep(Packet (&acc)[kTileRows][kPackets],
                                            const float* a_k,
                                            int64_t a_row,
                                            const float* panel_k) {
  Packet b[kPackets];
#pragma GCC unroll 4
  for (int q = 0; q < kPackets; ++q) b[q] = ei::ploadu<Packet>(panel_k + q * kLanes);
#pragma GCC unroll 12
  for (int r = 0; r < kTileRows; ++r) {
    const Packet ar = ei::pset1<Packet>(a_k[r * a_row]);
#pragma GCC unroll 4
    for (int q = 0; q < kPackets; ++q) acc[r][q] = ei::pmadd(ar, b[q], acc[r][q]);
  }
}

// What a tile applies to its results x as it stores them. A softmax
// gradient (kSoftmaxGradient tiles): c_ij = p_ij (x_ij - d_i), for the
// tile's rows (p and d point at its first row and column); with d null,
// c_ij = p_ij x_ij, bitwise (x - 0 is x, and a product does not depend on
// the order of its factors). A bias (any tile; null for none): c_ij = x_ij
// + bias_j, after x is added to C when accumulating (bias points at the
// tile's first column).
struct TileEpilogue {
  const float* p = nullptr;
  int64_t ldp = 0;
  const float* d = nullptr;
  const float* bias = nullptr;
};

// C tile [rows, width) (rows <= kRows, width <= kWidth of the panel shape)
// = or += alpha op(A) rows x packed panel. op(A)[r, kk] is a[r * a_row + kk
// * a_depth]. With kFixedDepth > 0 the depth is that constant (kc must
// equal it) and the depth loop is unrolled whole: see TileFor. With
// kSoftmaxGradient the results become p (x - d) (see TileEpilogue;
// not with accumulate). With kUnitRowStep a_row must be 1 (op(A) = A^T, a
// weight gradient's x^T or attention's P^T and dS^T): the tile's entries of
// op(A) at one depth are then at constant offsets from one pointer,
// instead of kTileRows offsets that a 12-row tile cannot keep in
// registers next to its row pointers.
template <int kTileRows,
          int kPackets,
          int kFixedDepth = 0,
          bool kSoftmaxGradient = false,
          bool kUnitRowStep = false>
void Tile(int64_t kc,
          const float* a,
          int64_t a_row,
          int64_t a_depth,
          const float* panel,
          int64_t panel_stride,
          float alpha,
          bool accumulate,
          float* c,
          int64_t ldc,
          int64_t width,
          const TileEpilogue& epilogue) {
  constexpr int kWidth = PanelShape<kPackets>::kWidth;
  if constexpr (kUnitRowStep) a_row = 1;
  // Every loop over the tile's rows and packets is unrolled, so the
  // accumulators live in registers from the first multiply-add to the
  // store.
  Packet acc[kTileRows][kPackets];
#pragma GCC unroll 12
  for (int r = 0; r < kTileRows; ++r) {
    for (int q = 0; q < kPackets; ++q) acc[r][q] = ei::pset1<Packet>(0.0f);
  }
  if constexpr (kFixedDepth > 0) {
#pragma GCC unroll 16
    for (int kk = 0; kk < kFixedDepth; ++kk) {
      TileStep<kTileRows, kPackets>(acc, a + kk * a_depth, a_row, panel + kk * panel_stride);
    }
  } else {
    for (int64_t kk = 0; kk < kc; ++kk) {
      TileStep<kTileRows, kPackets>(acc, a + kk * a_depth, a_row, panel + kk * panel_stride);
    }
  }
  if (alpha != 1.0f) {
    // (A product by 1 is exact: skipping it changes no result.)
    const Packet scale = ei::pset1<Packet>(alpha);
#pragma GCC unroll 12
    for (int r = 0; r < kTileRows; ++r) {
      for (int q = 0; q < kPackets; ++q) acc[r][q] = ei::pmul(scale, acc[r][q]);
    }
  }
  if constexpr (kSoftmaxGradient) {
    if (width == kWidth) {
#pragma GCC unroll 12
      for (int r = 0; r < kTileRows; ++r) {
        const Packet d = ei::pset1<Packet>(epilogue.d ? epilogue.d[r] : 0.0f);
        const float* p_row = epilogue.p + r * epilogue.ldp;
        for (int q = 0; q < kPackets; ++q) {
          acc[r][q] = ei::pmul(ei::ploadu<Packet>(p_row + q * kLanes), ei::psub(acc[r][q], d));
        }
      }
    }
  }
  if (width == kWidth && accumulate) {
#pragma GCC unroll 12
    for (int r = 0; r < kTileRows; ++r) {
      for (int q = 0; q < kPackets; ++q) {
        acc[r][q] = ei::padd(acc[r][q], ei::ploadu<Packet>(c + r * ldc + q * kLanes));
      }
    }
  }
  if (width == kWidth && epilogue.bias != nullptr) {
    Packet bias[kPackets];
    for (int q = 0; q < kPackets; ++q) bias[q] = ei::ploadu<Packet>(epilogue.bias + q * kLanes);
#pragma GCC unroll 12
    for (int r = 0; r < kTileRows; ++r) {
      for (int q = 0; q < kPackets; ++q) acc[r][q] = ei::padd(acc[r][q], bias[q]);
    }
  }
  if (width == kWidth) {
#pragma GCC unroll 12
    for (int r = 0; r < kTileRows; ++r) {
      for (int q = 0; q < kPackets; ++q) ei::pstoreu(c + r * ldc + q * kLanes, acc[r][q]);
    }
    return;
  }
  // A partial panel (the last columns of C): through a small buffer.
#pragma GCC unroll 12
  for (int r = 0; r < kTileRows; ++r) {
    float* c_row = c + r * ldc;
    alignas(64) float tmp[kWidth];
    for (int q = 0; q < kPackets; ++q) ei::pstore(tmp + q * kLanes, acc[r][q]);
    if constexpr (kSoftmaxGradient) {
      const float* p_row = epilogue.p + r * epilogue.ldp;
      const float d = epilogue.d ? epilogue.d[r] : 0.0f;
      for (int64_t j = 0; j < width; ++j) tmp[j] = p_row[j] * (tmp[j] - d);
    }
    for (int64_t j = 0; j < width; ++j) c_row[j] = accumulate ? c_row[j] + tmp[j] : tmp[j];
    if (epilogue.bias != nullptr) {
      for (int64_t j = 0; j < width; ++j) c_row[j] += epilogue.bias[j];
    }
  }
}

using TileFn = void (*)(int64_t,
                        const float*,
                        int64_t,
                        int64_t,
                        const float*,
                        int64_t,
                        float,
                        bool,
                        float*,
                        int64_t,
                        int64_t,
                        const TileEpilogue&);
// Tiles of every row count (index: rows) for one panel width and depth: a
// run-time one (kDepth = 0) or, for depth 16 (a 16-wide head's Q K^T and dO
// V^T), the depth loop unrolled at compile time. Depth 32 is not unrolled
// as well: the unrolled tiles would crowd the instruction cache
// (bench/RESULTS.md).
// Rows of op(A) one float apart (kUnitRowStep) have tiles of their own for
// the run-time depth only: the depth-16 and softmax-gradient products read
// Q and dO, whose rows are a whole row stride apart.
template <int kPackets, int kDepth, bool kSoftmaxGradient, bool kUnitRowStep, int... kRowsLessOne>
constexpr std::array<TileFn, sizeof...(kRowsLessOne) + 1> MakeTiles(
    std::integer_sequence<int, kRowsLessOne...>) {
  return {nullptr, &Tile<kRowsLessOne + 1, kPackets, kDepth, kSoftmaxGradient, kUnitRowStep>...};
}
template <int kPackets, int kDepth, bool kSoftmaxGradient, bool kUnitRowStep = false>
constexpr auto kTilesOfDepth = MakeTiles<kPackets, kDepth, kSoftmaxGradient, kUnitRowStep>(
    std::make_integer_sequence<int, PanelShape<kPackets>::kRows>{});

template <int kPackets>
TileFn TileFor(int rows, int64_t kc, int64_t a_row, bool softmax_gradient) {
  if (a_row == 1 && kc != 16 && !softmax_gradient) {
    return kTilesOfDepth<kPackets, 0, false, true>[rows];
  }
  if (softmax_gradient) {
    return kc == 16 ? kTilesOfDepth<kPackets, 16, true>[rows]
                    : kTilesOfDepth<kPackets, 0, true>[rows];
  }
  return kc == 16 ? kTilesOfDepth<kPackets, 16, false>[rows]
                  : kTilesOfDepth<kPackets, 0, false>[rows];
}

// C[m, n] = 0: the product of depth 0.
void ZeroRows(int64_t m, int64_t n, float* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
}

// Per-thread packing buffer, aligned for packet loads.
float* PanelBuffer(int64_t floats) {
  thread_local std::vector<float, Eigen::aligned_allocator<float>> buffer;
  if (static_cast<int64_t>(buffer.size()) < floats) buffer.resize(floats);
  return buffer.data();
}

// Panels of kPackets packets that n columns take.
template <int kPackets>
int64_t PanelCount(int64_t n) {
  constexpr int kWidth = PanelShape<kPackets>::kWidth;
  return (n + kWidth - 1) / kWidth;
}

// Whether op(B) [k, n] is read in place instead of packed: a single whole
// panel (n = the panel width, not transposed) is already that many floats
// per depth, at row stride ldb, so packing would only copy it. Only for
// shallow B (the per-head operands of short sequences, where a pack costs
// about as much as the product): a deep one at a large row stride would
// spread over more L1 sets than its packed copy and be read again by every
// row tile (bench/RESULTS.md).
constexpr int64_t kMaxInPlaceDepth = 64;
bool ReadsBInPlace(bool trans_b, int64_t k, int64_t n) {
  return !trans_b && n == PanelWidthFor(n) && k <= kMaxInPlaceDepth;
}

// Whether op(B) is read in place as whole panels at any depth: B not
// transposed, its rows contiguous (ldb = n) and n a whole number of panels.
// Panel p is then the columns [p width, (p + 1) width) of each row, one row
// stride apart, and is read depth block by depth block: the same tiles on
// the same values as packing it, bitwise. That is the g of a weight
// gradient x^T g when the product is not cut into column blocks: W1's
// projections and second feed-forward layer (64 output features, one panel)
// and its first feed-forward layer (128, two). A panel so read spans ldb
// floats per depth instead of width, but a weight gradient's depth block
// (kDepthBlock rows of a 64-wide panel, 64 KiB) is read from L2 by each row
// tile either way, and B's column sums (a bias gradient) then take a pass
// of their own (AddColumnSums) instead of riding along with the pack; on
// balance a step is a little shorter (bench/RESULTS.md).
bool ReadsPanelsInPlace(bool trans_b, int64_t n, int64_t ldb) {
  return !trans_b && n % PanelWidthFor(n) == 0 && ldb == n;
}

// Asks for rows [0, rows) of width floats at row stride ld to be brought
// into the cache.
void PrefetchRows(const float* base, int64_t ld, int rows, int64_t width) {
  constexpr int64_t kLineFloats = 64 / sizeof(float);
  for (int r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < width; j += kLineFloats) __builtin_prefetch(base + r * ld + j, 0, 3);
  }
}

// C[m, n] = (or +=, with accumulate) alpha op(A) x packed for one depth
// block: kc rows of every panel of op(B), panel p at packed + p panel_step
// (p kc kWidth when packed, p kWidth when read in place), its rows
// panel_stride apart.
// op(A)[i, kk] is a[i * a_row + kk * a_depth]. With a gradient (rows of C,
// p [m, n] and d [m]; the whole depth in this block) the results x become
// p (x - d) as they are stored.
template <int kPackets>
void MultiplyDepthBlock(int64_t m,
                        int64_t n,
                        int64_t kc,
                        const float* a,
                        int64_t a_row,
                        int64_t a_depth,
                        const float* packed,
                        int64_t panel_step,
                        int64_t panel_stride,
                        float alpha,
                        bool accumulate,
                        float* c,
                        int64_t ldc,
                        const TileEpilogue* gradient = nullptr,
                        const float* bias = nullptr) {
  constexpr int kWidth = PanelShape<kPackets>::kWidth;
  constexpr int kRows = PanelShape<kPackets>::kRows;
  const int64_t panels = PanelCount<kPackets>(n);
  // Panels in groups that fit in L1 together, so each group is read from L1
  // by every row tile while those rows of A are hot too.
  const int64_t group = std::max<int64_t>(1, kGroupFloats / (kc * kWidth));
  for (int64_t p0 = 0; p0 < panels; p0 += group) {
    const int64_t p1 = std::min(panels, p0 + group);
    for (int64_t i = 0; i < m; i += kRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kRows, m - i));
      const TileFn tile = TileFor<kPackets>(rows, kc, a_row, gradient != nullptr);
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t col = p * kWidth;
        // The next row tile's p (a saved activation's derivative, long out
        // of L1 and L2 in a backward pass) is asked for ahead, so the
        // elementwise tiles (W1's second feed-forward layer's dx times
        // gelu') do not wait for it (bench/RESULTS.md).
        if (gradient && i + kRows < m) {
          const int next_rows = static_cast<int>(std::min<int64_t>(kRows, m - i - kRows));
          PrefetchRows(gradient->p + (i + kRows) * gradient->ldp + col, gradient->ldp, next_rows,
                       std::min<int64_t>(kWidth, n - col));
        }
        TileEpilogue tile_epilogue;
        if (gradient) {
          tile_epilogue = {gradient->p + i * gradient->ldp + col, gradient->ldp,
                           gradient->d ? gradient->d + i : nullptr};
        }
        if (bias) tile_epilogue.bias = bias + col;
        tile(kc, a + i * a_row, a_row, a_depth, packed + p * panel_step, panel_stride, alpha,
             accumulate, c + i * ldc + col, ldc, std::min<int64_t>(kWidth, n - col), tile_epilogue);
      }
    }
  }
}

// sums[j] += B[kk, j] for kk = 0, 1, ..., k - 1 in order, in float64: B's
// column sums where B is not packed. Blocks of kBlock columns keep their
// sums in a local array across the rows (in registers: 64 doubles are
// eight AVX-512 packets), as PackPanel does; one loop over all n columns
// per row stored and reloaded every sum each row (bench/RESULTS.md).
void AddColumnSums(const float* b, int64_t ldb, int64_t k, int64_t n, double* sums) {
  constexpr int64_t kBlock = 64;
  int64_t j0 = 0;
  for (; j0 + kBlock <= n; j0 += kBlock) {
    double block[kBlock];
    for (int64_t j = 0; j < kBlock; ++j) block[j] = sums[j0 + j];
    for (int64_t kk = 0; kk < k; ++kk) {
      const float* row = b + kk * ldb + j0;
#pragma GCC unroll 64
      for (int64_t j = 0; j < kBlock; ++j) block[j] += static_cast<double>(row[j]);
    }
    for (int64_t j = 0; j < kBlock; ++j) sums[j0 + j] = block[j];
  }
  for (int64_t kk = 0; kk < k; ++kk) {
    for (int64_t j = j0; j < n; ++j) sums[j] += static_cast<double>(b[kk * ldb + j]);
  }
}

// Packs depths [k0, k0 + kc) of every panel of scale op(B) [k, n] into out,
// panel p at out + p kc kWidth.
template <int kPackets>
void PackDepthBlock(bool trans_b,
                    const float* b,
                    int64_t ldb,
                    int64_t n,
                    int64_t k0,
                    int64_t kc,
                    float scale,
                    float* out,
                    double* column_sums = nullptr) {
  constexpr int kWidth = PanelShape<kPackets>::kWidth;
  const int64_t panels = PanelCount<kPackets>(n);
  for (int64_t p = 0; p < panels; ++p) {
    PackPanel<kPackets>(trans_b, b, ldb, n, p * kWidth, k0, kc, scale, out + p * kc * kWidth,
                        column_sums);
  }
}

// SmallGemmFloat, and with b_column_sums (B not transposed) B's column sums
// added to it as B is packed.
void MultiplyPackingB(bool trans_a,
                      bool trans_b,
                      int64_t m,
                      int64_t n,
                      int64_t k,
                      float alpha,
                      const float* a,
                      int64_t lda,
                      const float* b,
                      int64_t ldb,
                      float* c,
                      int64_t ldc,
                      double* b_column_sums) {
  if (m == 0 || n == 0) {
    if (b_column_sums) AddColumnSums(b, ldb, k, n, b_column_sums);
    return;
  }
  if (k == 0) {
    ZeroRows(m, n, c, ldc);
    return;
  }
  // op(A)[i, kk] = a[i * a_row + kk * a_depth].
  const int64_t a_row = trans_a ? 1 : lda;
  const int64_t a_depth = trans_a ? lda : 1;
  WithPanelsFor(n, [&](auto packets) {
    constexpr int kPackets = decltype(packets)::value;
    constexpr int kWidth = PanelShape<kPackets>::kWidth;
    if (ReadsBInPlace(trans_b, k, n) || ReadsPanelsInPlace(trans_b, n, ldb)) {
      if (b_column_sums) AddColumnSums(b, ldb, k, n, b_column_sums);
      for (int64_t k0 = 0; k0 < k; k0 += kDepthBlock) {
        const int64_t kc = std::min(kDepthBlock, k - k0);
        MultiplyDepthBlock<kPackets>(m, n, kc, a + k0 * a_depth, a_row, a_depth, b + k0 * ldb,
                                     kWidth, ldb, alpha, k0 > 0, c, ldc);
      }
      return;
    }
    float* packed = PanelBuffer(PanelCount<kPackets>(n) * std::min(k, kDepthBlock) * kWidth);
    // One depth block packed at a time, so it is still in L1 when the tiles
    // read it.
    for (int64_t k0 = 0; k0 < k; k0 += kDepthBlock) {
      const int64_t kc = std::min(kDepthBlock, k - k0);
      PackDepthBlock<kPackets>(trans_b, b, ldb, n, k0, kc, 1.0f, packed, b_column_sums);
      MultiplyDepthBlock<kPackets>(m, n, kc, a + k0 * a_depth, a_row, a_depth, packed, kc * kWidth,
                                   kWidth, alpha, k0 > 0, c, ldc);
    }
  });
}

}  // namespace

void SmallGemmFloat(bool trans_a,
                    bool trans_b,
                    int64_t m,
                    int64_t n,
                    int64_t k,
                    float alpha,
                    const float* a,
                    int64_t lda,
                    const float* b,
                    int64_t ldb,
                    float* c,
                    int64_t ldc) {
  MultiplyPackingB(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, c, ldc, nullptr);
}

void SmallGemmFloat(bool trans_a,
                    int64_t m,
                    int64_t n,
                    int64_t k,
                    float alpha,
                    const float* a,
                    int64_t lda,
                    const float* b,
                    int64_t ldb,
                    float* c,
                    int64_t ldc,
                    double* b_column_sums) {
  MultiplyPackingB(trans_a, false, m, n, k, alpha, a, lda, b, ldb, c, ldc, b_column_sums);
}

float* PackedFloatB::Panels(std::size_t floats) {
  constexpr std::size_t kAlignFloats = 64 / sizeof(float);
  if (storage_.size() < floats + kAlignFloats) {
    storage_.resize(floats + kAlignFloats);
    void* start = storage_.data();
    std::size_t space = storage_.size() * sizeof(float);
    panels_ = static_cast<float*>(std::align(64, floats * sizeof(float), start, space));
  }
  return panels_;
}

void PackedFloatB::Pack(
    bool trans_b, int64_t k, int64_t n, const float* b, int64_t ldb, float scale) {
  k_ = k;
  n_ = n;
  if (scale == 1.0f && ReadsBInPlace(trans_b, k, n)) {
    in_place_ = b;
    in_place_ldb_ = ldb;
    return;
  }
  in_place_ = nullptr;
  WithPanelsFor(n, [&](auto packets) {
    constexpr int kPackets = decltype(packets)::value;
    constexpr int kWidth = PanelShape<kPackets>::kWidth;
    const int64_t panels = PanelCount<kPackets>(n);
    float* storage = Panels(static_cast<std::size_t>(panels * k * kWidth));
    // Depth blocks one after another, each laid out as SmallGemmFloat packs
    // it, so both run the same multiply-adds in the same order.
    for (int64_t k0 = 0; k0 < k; k0 += kDepthBlock) {
      const int64_t kc = std::min(kDepthBlock, k - k0);
      PackDepthBlock<kPackets>(trans_b, b, ldb, n, k0, kc, scale, storage + k0 * panels * kWidth);
    }
  });
}

void PackedFloatB::Multiply(bool trans_a,
                            int64_t m,
                            float alpha,
                            const float* a,
                            int64_t lda,
                            float* c,
                            int64_t ldc,
                            bool accumulate,
                            const float* bias) const {
  if (m == 0 || n_ == 0) return;
  if (k_ == 0) {
    if (!accumulate) ZeroRows(m, n_, c, ldc);
    if (bias) {
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n_; ++j) c[i * ldc + j] += bias[j];
      }
    }
    return;
  }
  const int64_t a_row = trans_a ? 1 : lda;
  const int64_t a_depth = trans_a ? lda : 1;
  WithPanelsFor(n_, [&](auto packets) {
    constexpr int kPackets = decltype(packets)::value;
    constexpr int kWidth = PanelShape<kPackets>::kWidth;
    if (in_place_) {
      MultiplyDepthBlock<kPackets>(m, n_, k_, a, a_row, a_depth, in_place_, kWidth, in_place_ldb_,
                                   alpha, accumulate, c, ldc, nullptr, bias);
      return;
    }
    const int64_t panels = PanelCount<kPackets>(n_);
    for (int64_t k0 = 0; k0 < k_; k0 += kDepthBlock) {
      const int64_t kc = std::min(kDepthBlock, k_ - k0);
      // The bias goes on with the last depth block: (the product) + bias.
      MultiplyDepthBlock<kPackets>(
          m, n_, kc, a + k0 * a_depth, a_row, a_depth, panels_ + k0 * panels * kWidth, kc * kWidth,
          kWidth, alpha, accumulate || k0 > 0, c, ldc, nullptr, k0 + kc == k_ ? bias : nullptr);
    }
  });
}

void PackedFloatB::MultiplySoftmaxGradient(bool trans_a,
                                           int64_t m,
                                           const float* a,
                                           int64_t lda,
                                           const float* p,
                                           int64_t ldp,
                                           const float* d,
                                           float* c,
                                           int64_t ldc) const {
  if (m == 0 || n_ == 0) return;
  if (k_ == 0 || k_ > kDepthBlock) {
    // Not in one depth block: the product, then the map over C.
    Multiply(trans_a, m, 1.0f, a, lda, c, ldc);
    for (int64_t i = 0; i < m; ++i) {
      const float d_i = d ? d[i] : 0.0f;
      for (int64_t j = 0; j < n_; ++j) c[i * ldc + j] = p[i * ldp + j] * (c[i * ldc + j] - d_i);
    }
    return;
  }
  const int64_t a_row = trans_a ? 1 : lda;
  const int64_t a_depth = trans_a ? lda : 1;
  const TileEpilogue gradient{p, ldp, d};
  WithPanelsFor(n_, [&](auto packets) {
    constexpr int kPackets = decltype(packets)::value;
    constexpr int kWidth = PanelShape<kPackets>::kWidth;
    MultiplyDepthBlock<kPackets>(m, n_, k_, a, a_row, a_depth, in_place_ ? in_place_ : panels_,
                                 in_place_ ? kWidth : k_ * kWidth,
                                 in_place_ ? in_place_ldb_ : kWidth, 1.0f, false, c, ldc,
                                 &gradient);
  });
}

void PackedFloatB::MultiplyElementwise(bool trans_a,
                                       int64_t m,
                                       const float* a,
                                       int64_t lda,
                                       const float* p,
                                       int64_t ldp,
                                       float* c,
                                       int64_t ldc) const {
  // The softmax gradient's tiles with d = 0 (see TileEpilogue).
  MultiplySoftmaxGradient(trans_a, m, a, lda, p, ldp, nullptr, c, ldc);
}

}  // namespace stillpoint::internal
