// A float32 GEMM for the small, skinny products of this project's models.
//
// Why not OpenBLAS for these: on a [1024, 64] x [64, 64] projection or a
// per-head [256, 16] x [16, 256] score block, OpenBLAS spends a third of its
// time outside its inner kernel: it packs both operands on every call and
// zeroes C in a separate pass before accumulating into it (beta = 0). Here
// only op(B) is packed, into panels of kPanel columns (k x kPanel,
// contiguous, zero-padded), and a register-blocked micro-kernel computes a
// kRows x kPanel tile of C entirely in registers, reading op(A) in place
// (broadcast one entry at a time, which works as well for A as for A^T), and
// stores the tile once: no zeroing pass and no copy of A. A shallow B that
// is a single panel already (a head's [T, 16] keys, values or rows of a
// short sequence) is read in place, without a copy either.
//
// The depth is cut into blocks of kDepthBlock so a B panel stays in L1; the
// first block stores its tile, later blocks add to it. Each C entry is the
// same sequence of fused multiply-adds whatever the thread count, so
// results are bitwise reproducible.

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "framework/gemm.h"

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

// A tile is kRows x (2 packets): 12 accumulators with AVX2 (6 x 16), which
// with the two B packets and one broadcast fills 15 of the 16 registers.
constexpr int kRows = 6;
constexpr int kPanel = 2 * kLanes;
constexpr int64_t kDepthBlock = 256;
// Packed B read by consecutive tiles: 16 KiB, half of a Zen/Skylake L1.
constexpr int64_t kGroupFloats = 4096;

// Packs columns [col, col + kPanel) of scale op(B) for depths [k0, k0 +
// kc) as kc rows of kPanel floats; columns past n are zero.
void PackPanel(bool trans_b,
               const float* b,
               int64_t ldb,
               int64_t n,
               int64_t col,
               int64_t k0,
               int64_t kc,
               float scale,
               float* out) {
  const Packet scale_packet = ei::pset1<Packet>(scale);
  const int64_t width = std::min<int64_t>(kPanel, n - col);
  if (width < kPanel) std::fill(out, out + kc * kPanel, 0.0f);
  if (!trans_b) {
    for (int64_t kk = 0; kk < kc; ++kk) {
      const float* src = b + (k0 + kk) * ldb + col;
      float* dst = out + kk * kPanel;
      if (width == kPanel) {
        ei::pstore(dst, ei::pmul(scale_packet, ei::ploadu<Packet>(src)));
        ei::pstore(dst + kLanes, ei::pmul(scale_packet, ei::ploadu<Packet>(src + kLanes)));
      } else {
        for (int64_t j = 0; j < width; ++j) dst[j] = scale * src[j];
      }
    }
    return;
  }
  // op(B) = B^T: column j of the panel is row col + j of B. Square blocks
  // of kLanes rows by kLanes depths are transposed in registers; the rest
  // (a partial panel, a depth tail) element by element.
  int64_t kk0 = 0;
  if (width == kPanel) {
    for (; kk0 + kLanes <= kc; kk0 += kLanes) {
      for (int half = 0; half < 2; ++half) {
        PacketBlock block;
        for (int l = 0; l < kLanes; ++l) {
          block.packet[l] = ei::ploadu<Packet>(b + (col + half * kLanes + l) * ldb + k0 + kk0);
        }
        ei::ptranspose(block);
        for (int l = 0; l < kLanes; ++l) {
          ei::pstore(out + (kk0 + l) * kPanel + half * kLanes,
                     ei::pmul(scale_packet, block.packet[l]));
        }
      }
    }
  }
  for (int64_t j = 0; j < width; ++j) {
    const float* src = b + (col + j) * ldb + k0;
    for (int64_t kk = kk0; kk < kc; ++kk) out[kk * kPanel + j] = scale * src[kk];
  }
}

// One depth of a tile: acc[r] += op(A)[r, kk] x the panel's row kk.
template <int kTileRows>
[[gnu::always_inline]] inline void TileStep(Packet (&acc)[kTileRows][2],
                                            const float* a_k,
                                            int64_t a_row,
                                            const float* panel_k) {
  const Packet b0 = ei::ploadu<Packet>(panel_k);
  const Packet b1 = ei::ploadu<Packet>(panel_k + kLanes);
#pragma GCC unroll 8
  for (int r = 0; r < kTileRows; ++r) {
    const Packet ar = ei::pset1<Packet>(a_k[r * a_row]);
    acc[r][0] = ei::pmadd(ar, b0, acc[r][0]);
    acc[r][1] = ei::pmadd(ar, b1, acc[r][1]);
  }
}

// A softmax gradient applied to a tile's results x before they are stored:
// c_ij = p_ij (x_ij - d_i), for the tile's rows (p and d point at its first
// row and column).
struct SoftmaxGradientRows {
  const float* p = nullptr;
  int64_t ldp = 0;
  const float* d = nullptr;
};

// C tile [rows, width) (rows <= kRows, width <= kPanel) = or += alpha op(A)
// rows x packed panel. op(A)[r, kk] is a[r * a_row + kk * a_depth]. With
// kFixedDepth > 0 the depth is that constant (kc must equal it) and the
// depth loop is unrolled whole: see TileFor. With kSoftmaxGradient the
// results become p (x - d) (see SoftmaxGradientRows; not with accumulate).
template <int kTileRows, int kFixedDepth = 0, bool kSoftmaxGradient = false>
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
          const SoftmaxGradientRows& gradient) {
  // Every loop over the tile's rows is unrolled, so the accumulators live
  // in registers from the first multiply-add to the store.
  Packet acc[kTileRows][2];
#pragma GCC unroll 8
  for (int r = 0; r < kTileRows; ++r) {
    acc[r][0] = ei::pset1<Packet>(0.0f);
    acc[r][1] = ei::pset1<Packet>(0.0f);
  }
  if constexpr (kFixedDepth > 0) {
#pragma GCC unroll 16
    for (int kk = 0; kk < kFixedDepth; ++kk) {
      TileStep<kTileRows>(acc, a + kk * a_depth, a_row, panel + kk * panel_stride);
    }
  } else {
    for (int64_t kk = 0; kk < kc; ++kk) {
      TileStep<kTileRows>(acc, a + kk * a_depth, a_row, panel + kk * panel_stride);
    }
  }
  if (alpha != 1.0f) {
    // (A product by 1 is exact: skipping it changes no result.)
    const Packet scale = ei::pset1<Packet>(alpha);
#pragma GCC unroll 8
    for (int r = 0; r < kTileRows; ++r) {
      acc[r][0] = ei::pmul(scale, acc[r][0]);
      acc[r][1] = ei::pmul(scale, acc[r][1]);
    }
  }
  if constexpr (kSoftmaxGradient) {
    if (width == kPanel) {
#pragma GCC unroll 8
      for (int r = 0; r < kTileRows; ++r) {
        const Packet d = ei::pset1<Packet>(gradient.d[r]);
        const float* p_row = gradient.p + r * gradient.ldp;
        acc[r][0] = ei::pmul(ei::ploadu<Packet>(p_row), ei::psub(acc[r][0], d));
        acc[r][1] = ei::pmul(ei::ploadu<Packet>(p_row + kLanes), ei::psub(acc[r][1], d));
      }
    }
  }
  if (width == kPanel && !accumulate) {
#pragma GCC unroll 8
    for (int r = 0; r < kTileRows; ++r) {
      ei::pstoreu(c + r * ldc, acc[r][0]);
      ei::pstoreu(c + r * ldc + kLanes, acc[r][1]);
    }
    return;
  }
  if (width == kPanel) {
#pragma GCC unroll 8
    for (int r = 0; r < kTileRows; ++r) {
      float* c_row = c + r * ldc;
      ei::pstoreu(c_row, ei::padd(acc[r][0], ei::ploadu<Packet>(c_row)));
      ei::pstoreu(c_row + kLanes, ei::padd(acc[r][1], ei::ploadu<Packet>(c_row + kLanes)));
    }
    return;
  }
  // A partial panel (the last columns of C): through a small buffer.
#pragma GCC unroll 8
  for (int r = 0; r < kTileRows; ++r) {
    float* c_row = c + r * ldc;
    alignas(64) float tmp[kPanel];
    ei::pstore(tmp, acc[r][0]);
    ei::pstore(tmp + kLanes, acc[r][1]);
    if constexpr (kSoftmaxGradient) {
      const float* p_row = gradient.p + r * gradient.ldp;
      for (int64_t j = 0; j < width; ++j) tmp[j] = p_row[j] * (tmp[j] - gradient.d[r]);
    }
    for (int64_t j = 0; j < width; ++j) c_row[j] = accumulate ? c_row[j] + tmp[j] : tmp[j];
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
                        const SoftmaxGradientRows&);
// Tiles of every row count for one depth: a run-time one (kDepth = 0) or,
// for depth 16 (a 16-wide head's Q K^T and dO V^T), the depth loop
// unrolled at compile time. Fused attention forward + backward, one thread,
// best of 40 batches in 4 interleaved runs: T = 256 (W2) 8.36 -> 8.17 ms,
// T = 32 (W1) 537 -> 530 us. Unrolling depth 32 as well (the other products
// at T = 32) measured slower at T = 32 (549 us): the unrolled tiles then
// crowd the instruction cache.
template <int kDepth, bool kSoftmaxGradient = false>
constexpr TileFn kTilesOfDepth[kRows + 1] = {nullptr,
                                             &Tile<1, kDepth, kSoftmaxGradient>,
                                             &Tile<2, kDepth, kSoftmaxGradient>,
                                             &Tile<3, kDepth, kSoftmaxGradient>,
                                             &Tile<4, kDepth, kSoftmaxGradient>,
                                             &Tile<5, kDepth, kSoftmaxGradient>,
                                             &Tile<6, kDepth, kSoftmaxGradient>};

TileFn TileFor(int rows, int64_t kc, bool softmax_gradient) {
  if (softmax_gradient) {
    return kc == 16 ? kTilesOfDepth<16, true>[rows] : kTilesOfDepth<0, true>[rows];
  }
  return kc == 16 ? kTilesOfDepth<16>[rows] : kTilesOfDepth<0>[rows];
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

int64_t PanelCount(int64_t n) { return (n + kPanel - 1) / kPanel; }

// Whether op(B) [k, n] is read in place instead of packed: a single whole
// panel (n = kPanel, not transposed) is already kPanel floats per depth, at
// row stride ldb, so packing would only copy it. Only for shallow B (the
// per-head operands of short sequences, where a pack costs about as much as
// the product): a deep one at a large row stride would spread over more L1
// sets than its packed copy and be read again by every row tile. (W1
// explicit, one thread, 6 interleaved runs: median step 28.9 -> 27.2 ms; on
// two threads the difference was within the machine's noise.)
constexpr int64_t kMaxInPlaceDepth = 64;
bool ReadsBInPlace(bool trans_b, int64_t k, int64_t n) {
  return !trans_b && n == kPanel && k <= kMaxInPlaceDepth;
}

// C[m, n] = (or +=, with accumulate) alpha op(A) x packed for one depth
// block: kc rows of every panel of op(B), panel p at packed + p kc kPanel.
// op(A)[i, kk] is a[i * a_row + kk * a_depth]. With a gradient (rows of C,
// p [m, n] and d [m]; the whole depth in this block) the results x become
// p (x - d) as they are stored.
void MultiplyDepthBlock(int64_t m,
                        int64_t n,
                        int64_t kc,
                        const float* a,
                        int64_t a_row,
                        int64_t a_depth,
                        const float* packed,
                        int64_t panel_stride,
                        float alpha,
                        bool accumulate,
                        float* c,
                        int64_t ldc,
                        const SoftmaxGradientRows* gradient = nullptr) {
  const int64_t panels = PanelCount(n);
  // Panels in groups that fit in L1 together, so each group is read from L1
  // by every row tile while those rows of A are hot too.
  const int64_t group = std::max<int64_t>(1, kGroupFloats / (kc * kPanel));
  for (int64_t p0 = 0; p0 < panels; p0 += group) {
    const int64_t p1 = std::min(panels, p0 + group);
    for (int64_t i = 0; i < m; i += kRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kRows, m - i));
      const TileFn tile = TileFor(rows, kc, gradient != nullptr);
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t col = p * kPanel;
        SoftmaxGradientRows tile_gradient;
        if (gradient) {
          tile_gradient = {gradient->p + i * gradient->ldp + col, gradient->ldp, gradient->d + i};
        }
        tile(kc, a + i * a_row, a_row, a_depth, packed + p * kc * kPanel, panel_stride, alpha,
             accumulate, c + i * ldc + col, ldc, std::min<int64_t>(kPanel, n - col), tile_gradient);
      }
    }
  }
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
  if (m == 0 || n == 0) return;
  if (k == 0) {
    ZeroRows(m, n, c, ldc);
    return;
  }
  // op(A)[i, kk] = a[i * a_row + kk * a_depth].
  const int64_t a_row = trans_a ? 1 : lda;
  const int64_t a_depth = trans_a ? lda : 1;
  if (ReadsBInPlace(trans_b, k, n)) {
    MultiplyDepthBlock(m, n, k, a, a_row, a_depth, b, ldb, alpha, false, c, ldc);
    return;
  }
  const int64_t panels = PanelCount(n);
  float* packed = PanelBuffer(panels * std::min(k, kDepthBlock) * kPanel);
  // One depth block packed at a time, so it is still in L1 when the tiles
  // read it.
  for (int64_t k0 = 0; k0 < k; k0 += kDepthBlock) {
    const int64_t kc = std::min(kDepthBlock, k - k0);
    for (int64_t p = 0; p < panels; ++p) {
      PackPanel(trans_b, b, ldb, n, p * kPanel, k0, kc, 1.0f, packed + p * kc * kPanel);
    }
    MultiplyDepthBlock(m, n, kc, a + k0 * a_depth, a_row, a_depth, packed, kPanel, alpha, k0 > 0, c,
                       ldc);
  }
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
  const int64_t panels = PanelCount(n);
  float* storage = Panels(static_cast<std::size_t>(panels * k * kPanel));
  // Depth blocks one after another, each laid out as SmallGemmFloat packs
  // it, so both run the same multiply-adds in the same order.
  for (int64_t k0 = 0; k0 < k; k0 += kDepthBlock) {
    const int64_t kc = std::min(kDepthBlock, k - k0);
    float* block = storage + k0 * panels * kPanel;
    for (int64_t p = 0; p < panels; ++p) {
      PackPanel(trans_b, b, ldb, n, p * kPanel, k0, kc, scale, block + p * kc * kPanel);
    }
  }
}

void PackedFloatB::Multiply(bool trans_a,
                            int64_t m,
                            float alpha,
                            const float* a,
                            int64_t lda,
                            float* c,
                            int64_t ldc,
                            bool accumulate) const {
  if (m == 0 || n_ == 0) return;
  if (k_ == 0) {
    if (accumulate) return;
    ZeroRows(m, n_, c, ldc);
    return;
  }
  const int64_t a_row = trans_a ? 1 : lda;
  const int64_t a_depth = trans_a ? lda : 1;
  if (in_place_) {
    MultiplyDepthBlock(m, n_, k_, a, a_row, a_depth, in_place_, in_place_ldb_, alpha, accumulate, c,
                       ldc);
    return;
  }
  const int64_t panels = PanelCount(n_);
  for (int64_t k0 = 0; k0 < k_; k0 += kDepthBlock) {
    const int64_t kc = std::min(kDepthBlock, k_ - k0);
    MultiplyDepthBlock(m, n_, kc, a + k0 * a_depth, a_row, a_depth, panels_ + k0 * panels * kPanel,
                       kPanel, alpha, accumulate || k0 > 0, c, ldc);
  }
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
      for (int64_t j = 0; j < n_; ++j) c[i * ldc + j] = p[i * ldp + j] * (c[i * ldc + j] - d[i]);
    }
    return;
  }
  const int64_t a_row = trans_a ? 1 : lda;
  const int64_t a_depth = trans_a ? lda : 1;
  const SoftmaxGradientRows gradient{p, ldp, d};
  MultiplyDepthBlock(m, n_, k_, a, a_row, a_depth, in_place_ ? in_place_ : panels_,
                     in_place_ ? in_place_ldb_ : kPanel, 1.0f, false, c, ldc, &gradient);
}

}  // namespace stillpoint::internal
