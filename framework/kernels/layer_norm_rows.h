// Layer-norm rows of float held in SIMD registers: rows of a whole number of
// packets, at most kMaxRowPackets (a model width of 64 is 4 packets with
// AVX-512, 8 with AVX2, 16 with SSE). ops_nn.cc uses these for such rows
// and its generic loops for every other row.
//
// Why: the generic row code makes one pass over memory per step (sum,
// squared deviations, output; in the backward xhat, g gain, two reductions,
// dx, the gain and bias partials) and each reduction waits on the one
// before it. With the row in registers a row is loaded once and stored
// once, and the gain and bias partials of a block of rows stay in registers
// across its rows.
//
// Every value is bitwise what the generic code in ops_nn.cc computes: the
// reductions are the same SumInPacketLanes calls in the same order, and the
// element-wise expressions the same operations (where the compiler fuses a
// product and a sum of the generic loops into one multiply-add, these use
// pmadd, which does the same when the target has FMA and is a product then
// a sum otherwise, like the generic loops then).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "framework/kernels/vector_math.h"

namespace stillpoint::internal {

inline constexpr int kMaxRowPackets = 8;

// Calls body(std::integral_constant<int, packets>) when a row of n floats is
// 1..kMaxRowPackets whole packets, and returns whether it did.
template <typename Body, int... kPacketsLessOne>
bool WithRowPacketsOf(int64_t packets, Body& body, std::integer_sequence<int, kPacketsLessOne...>) {
  return ((packets == kPacketsLessOne + 1 &&
           (body(std::integral_constant<int, kPacketsLessOne + 1>{}), true)) ||
          ...);
}
template <typename Body>
bool WithRowPackets(int64_t n, Body&& body) {
  return n % kVecBlock == 0 &&
         WithRowPacketsOf(n / kVecBlock, body, std::make_integer_sequence<int, kMaxRowPackets>{});
}

// Rows [row_begin, row_end) of kPackets packets each: x = the sum of the
// parts' rows (((p0 + p1) + p2) + ..., the order of chained add()), kept in
// sum_rows when it is not null, then y = (x - mean) rstd gain + bias (gain
// and bias optional) and stats = {mean, rstd} per row. The gain and bias
// packets are loaded once for all the rows, not once per row
// (bench/RESULTS.md).
template <int kPackets>
void NormalizeRowsInRegisters(const std::vector<const float*>& parts,
                              int64_t row_begin,
                              int64_t row_end,
                              const float* gain,
                              const float* bias,
                              float eps,
                              float* y,
                              float* sum_rows,
                              float* stats) {
  namespace ei = Eigen::internal;
  constexpr int64_t n = kPackets * kVecBlock;
  const float inv_n = 1.0f / static_cast<float>(n);
  FloatPacket gain_packets[kPackets], bias_packets[kPackets];
  for (int j = 0; j < kPackets; ++j) {
    gain_packets[j] = gain ? ei::ploadu<FloatPacket>(gain + j * kVecBlock) : PacketSet(1.0f);
    bias_packets[j] = bias ? ei::ploadu<FloatPacket>(bias + j * kVecBlock) : PacketSet(0.0f);
  }
  for (int64_t r = row_begin; r < row_end; ++r) {
    const int64_t offset = r * n;
    FloatPacket x[kPackets];
    for (int j = 0; j < kPackets; ++j)
      x[j] = ei::ploadu<FloatPacket>(parts[0] + offset + j * kVecBlock);
    for (std::size_t k = 1; k < parts.size(); ++k) {
      for (int j = 0; j < kPackets; ++j) {
        x[j] = ei::padd(x[j], ei::ploadu<FloatPacket>(parts[k] + offset + j * kVecBlock));
      }
    }
    if (sum_rows != nullptr) {
      for (int j = 0; j < kPackets; ++j) ei::pstoreu(sum_rows + offset + j * kVecBlock, x[j]);
    }
    const float mean =
        SumInPacketLanes(
            n, [&](const FloatPacket& acc, int64_t i) { return ei::padd(acc, x[i / kVecBlock]); },
            [](int64_t) { return 0.0f; }) *
        inv_n;
    const FloatPacket mean_packet = PacketSet(mean);
    FloatPacket centered[kPackets];
    for (int j = 0; j < kPackets; ++j) centered[j] = ei::psub(x[j], mean_packet);
    const float var = SumInPacketLanes(
                          n,
                          [&](const FloatPacket& acc, int64_t i) {
                            const FloatPacket& d = centered[i / kVecBlock];
                            return ei::pmadd(d, d, acc);
                          },
                          [](int64_t) { return 0.0f; }) *
                      inv_n;
    const float rstd = 1.0f / std::sqrt(var + eps);
    const FloatPacket rstd_packet = PacketSet(rstd);
    for (int j = 0; j < kPackets; ++j) {
      FloatPacket out = ei::pmul(centered[j], rstd_packet);
      if (gain != nullptr && bias != nullptr) {
        out = ei::pmadd(out, gain_packets[j], bias_packets[j]);
      } else if (gain != nullptr) {
        out = ei::pmul(out, gain_packets[j]);
      } else if (bias != nullptr) {
        out = ei::padd(out, bias_packets[j]);
      }
      ei::pstoreu(y + offset + j * kVecBlock, out);
    }
    stats[2 * r] = mean;
    stats[2 * r + 1] = rstd;
  }
}

// The backward of rows [row_begin, row_end) of kPackets packets: dx from x,
// the output gradient g and each row's stats {mean, rstd} (all rows of the
// same stride n), and, when gain_partial / bias_partial are not null, the
// rows' sums of g xhat and of g added to them (each a row of n), row by
// row in order.
template <int kPackets>
void LayerNormBackwardRowsInRegisters(int64_t row_begin,
                                      int64_t row_end,
                                      const float* x,
                                      const float* g,
                                      const float* stats,
                                      const float* gain,
                                      float* dx,
                                      float* gain_partial,
                                      float* bias_partial) {
  namespace ei = Eigen::internal;
  constexpr int64_t n = kPackets * kVecBlock;
  const float inv_n = 1.0f / static_cast<float>(n);
  FloatPacket gain_sum[kPackets], bias_sum[kPackets];
  for (int j = 0; j < kPackets; ++j) {
    gain_sum[j] =
        gain_partial ? ei::ploadu<FloatPacket>(gain_partial + j * kVecBlock) : PacketSet(0.0f);
    bias_sum[j] =
        bias_partial ? ei::ploadu<FloatPacket>(bias_partial + j * kVecBlock) : PacketSet(0.0f);
  }
  for (int64_t r = row_begin; r < row_end; ++r) {
    const float* x_row = x + r * n;
    const float* g_row = g + r * n;
    const FloatPacket mean = PacketSet(stats[2 * r]);
    const float rstd = stats[2 * r + 1];
    const FloatPacket rstd_packet = PacketSet(rstd);
    FloatPacket g_packets[kPackets], xhat[kPackets], dxhat[kPackets];
    for (int j = 0; j < kPackets; ++j) {
      g_packets[j] = ei::ploadu<FloatPacket>(g_row + j * kVecBlock);
      xhat[j] =
          ei::pmul(ei::psub(ei::ploadu<FloatPacket>(x_row + j * kVecBlock), mean), rstd_packet);
      // Without a gain, dxhat is the row of g itself.
      dxhat[j] = gain ? ei::pmul(g_packets[j], ei::ploadu<FloatPacket>(gain + j * kVecBlock))
                      : g_packets[j];
    }
    const float mean_d =
        SumInPacketLanes(
            n,
            [&](const FloatPacket& acc, int64_t i) { return ei::padd(acc, dxhat[i / kVecBlock]); },
            [](int64_t) { return 0.0f; }) *
        inv_n;
    const float mean_dx = SumInPacketLanes(
                              n,
                              [&](const FloatPacket& acc, int64_t i) {
                                return ei::pmadd(dxhat[i / kVecBlock], xhat[i / kVecBlock], acc);
                              },
                              [](int64_t) { return 0.0f; }) *
                          inv_n;
    const FloatPacket mean_d_packet = PacketSet(mean_d);
    const FloatPacket mean_dx_packet = PacketSet(mean_dx);
    float* dx_row = dx + r * n;
    for (int j = 0; j < kPackets; ++j) {
      // rstd (dxhat - mean_d - xhat mean_dx)
      const FloatPacket inner =
          ei::pmadd(ei::pnegate(xhat[j]), mean_dx_packet, ei::psub(dxhat[j], mean_d_packet));
      ei::pstoreu(dx_row + j * kVecBlock, ei::pmul(rstd_packet, inner));
      if (gain_partial) gain_sum[j] = ei::pmadd(g_packets[j], xhat[j], gain_sum[j]);
      if (bias_partial) bias_sum[j] = ei::padd(bias_sum[j], g_packets[j]);
    }
  }
  for (int j = 0; j < kPackets; ++j) {
    if (gain_partial) ei::pstoreu(gain_partial + j * kVecBlock, gain_sum[j]);
    if (bias_partial) ei::pstoreu(bias_partial + j * kVecBlock, bias_sum[j]);
  }
}

}  // namespace stillpoint::internal
