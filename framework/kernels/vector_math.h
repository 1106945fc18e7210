// Vectorised transcendental kernels (exp, tanh, sigmoid, GELU) on flat
// arrays (not part of the public API; ops.h is).
//
// float32 runs Eigen's SIMD packet functions (with -march=native, AVX2 +
// FMA: 8 lanes, or AVX-512: 16), whose relative error against the exact
// value is below 3e-7 (tanh) and 1.2e-7 (exp), i.e. a few ulp, about as
// accurate as glibc's scalar tanhf/expf and much faster. float64 keeps
// libm, so double results (gradient checks, reference tests) are
// unchanged.
//
// Every element goes through the same packet code, including a tail shorter
// than a packet (it is copied into a padded block), so an element's result
// never depends on its position in the array or on how a ParallelFor split
// the range: results are bitwise identical for any thread count.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace stillpoint {
namespace internal {

// The float SIMD register type Eigen picked for this build (16 lanes with
// AVX-512, 8 with AVX2, 4 with SSE) and its primitives.
using FloatPacket = Eigen::internal::packet_traits<float>::type;
inline constexpr int64_t kVecBlock = Eigen::internal::packet_traits<float>::size;

// log2(e): e^x = 2^(x log2(e)). The base-2 softmaxes (fused attention,
// Hopfield retrieval) scale their scores by it in the product that makes
// them, so they can use Exp2FlushPacket.
inline constexpr double kLog2e = 1.4426950408889634;

// sqrt(2 / pi) and the cubic coefficient of the tanh form of GELU.
inline constexpr double kGeluScale = 0.7978845608028654;
inline constexpr double kGeluCubic = 0.044715;

// out[i] = fn(x[i]) packet by packet: fn maps a FloatPacket to a
// FloatPacket. Inputs of the tail are padded with 0 (fn(0) must be finite).
template <typename PacketFn>
void MapFloatPackets(const float* x, float* out, int64_t n, PacketFn fn) {
  namespace ei = Eigen::internal;
  int64_t i = 0;
  for (; i + kVecBlock <= n; i += kVecBlock) {
    ei::pstoreu(out + i, fn(ei::ploadu<FloatPacket>(x + i)));
  }
  if (i < n) {
    float in_tail[kVecBlock] = {};
    float out_tail[kVecBlock];
    std::copy(x + i, x + n, in_tail);
    ei::pstoreu(out_tail, fn(ei::ploadu<FloatPacket>(in_tail)));
    std::copy(out_tail, out_tail + (n - i), out + i);
  }
}

// out[i] = fn(a[i], b[i]) packet by packet (tail padded with 0).
template <typename PacketFn>
void MapFloatPackets2(const float* a, const float* b, float* out, int64_t n, PacketFn fn) {
  namespace ei = Eigen::internal;
  int64_t i = 0;
  for (; i + kVecBlock <= n; i += kVecBlock) {
    ei::pstoreu(out + i, fn(ei::ploadu<FloatPacket>(a + i), ei::ploadu<FloatPacket>(b + i)));
  }
  if (i < n) {
    float a_tail[kVecBlock] = {};
    float b_tail[kVecBlock] = {};
    float out_tail[kVecBlock];
    std::copy(a + i, a + n, a_tail);
    std::copy(b + i, b + n, b_tail);
    ei::pstoreu(out_tail, fn(ei::ploadu<FloatPacket>(a_tail), ei::ploadu<FloatPacket>(b_tail)));
    std::copy(out_tail, out_tail + (n - i), out + i);
  }
}

// ---- packet formulas (float) ----

inline FloatPacket PacketSet(float v) { return Eigen::internal::pset1<FloatPacket>(v); }

// Below this Eigen's float exp clamps its argument (and would return about
// 3e-39 for -inf); exp of anything smaller is a subnormal or 0, taken as 0,
// so masked (-inf) entries get exactly 0.
inline constexpr float kExpFloatLowest = -88.3762626647949f;

// exp(x); overflows to +inf like expf, and is exactly 0 for x < kExpFloatLowest.
inline FloatPacket ExpPacket(const FloatPacket& x) {
  namespace ei = Eigen::internal;
  return ei::pandnot(ei::pexp(x), ei::pcmp_lt(x, PacketSet(kExpFloatLowest)));
}

// ln of the smallest normal float.
inline constexpr float kExpFloatNormalLowest = -87.3365447505531f;

// exp(x) for x <= 88 with results below the smallest normal float flushed
// to exactly 0 (x < kExpFloatNormalLowest); NaN stays NaN. The same
// polynomial as ExpPacket, but 2^m is built directly in the exponent bits
// (m is in [-126, 127] after the clamp), which saves about a third of the
// instructions. For softmax, whose shifted scores are <= 0 and whose
// entries below 1e-38 of the largest cannot matter.
// m = round(x log2(e)) comes from one fused multiply-add with a shifter
// 1.5 2^23 + 127: the sum has unit spacing, so its low mantissa bits hold
// m + 127, which shifted into place are 2^m, and subtracting the shifter
// gives m exactly. That is two instructions per packet fewer than a floor,
// a float-to-int conversion and an integer add, with the
// same values on a sweep of [-87.3, 0]: the two roundings can differ only
// where x log2(e) is halfway between two integers, and both are exact.
inline FloatPacket ExpFlushPacket(const FloatPacket& x_in) {
  namespace ei = Eigen::internal;
  // (The packet types carry vector attributes that a template argument
  // drops; harmless here, as only the member typedef is used.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wignored-attributes"
  using IntPacket = ei::unpacket_traits<FloatPacket>::integer_packet;
#pragma GCC diagnostic pop
  const FloatPacket x =
      ei::pmin(ei::pmax(x_in, PacketSet(kExpFloatNormalLowest)), PacketSet(88.0f));
  const FloatPacket shifter = PacketSet(12582912.0f + 127.0f);
  const FloatPacket t = ei::pmadd(x, PacketSet(float(kLog2e)), shifter);
  const FloatPacket m = ei::psub(t, shifter);
  FloatPacket r = ei::pmadd(m, PacketSet(-0.693359375f), x);
  r = ei::pmadd(m, PacketSet(2.12194440e-4f), r);
  const FloatPacket r2 = ei::pmul(r, r);
  const FloatPacket r3 = ei::pmul(r2, r);
  FloatPacket y = ei::pmadd(PacketSet(1.9875691500E-4f), r, PacketSet(1.3981999507E-3f));
  FloatPacket y1 = ei::pmadd(PacketSet(4.1665795894E-2f), r, PacketSet(1.6666665459E-1f));
  const FloatPacket y2 = ei::padd(r, PacketSet(1.0f));
  y = ei::pmadd(y, r, PacketSet(8.3334519073E-3f));
  y1 = ei::pmadd(y1, r, PacketSet(5.0000001201E-1f));
  y = ei::pmadd(y, r3, y1);
  y = ei::pmadd(y, r2, y2);
  const FloatPacket two_m =
      ei::preinterpret<FloatPacket>(ei::plogical_shift_left<23>(ei::preinterpret<IntPacket>(t)));
  return ei::pandnot(ei::pmul(y, two_m), ei::pcmp_lt(x_in, PacketSet(kExpFloatNormalLowest)));
}

// log2 of the smallest normal float: 2^x for x below it is flushed to 0.
inline constexpr float kExp2FloatNormalLowest = -126.0f;

// 2^x for x <= 0, with results below the smallest normal float flushed to
// exactly 0 (x < -126, and -inf); NaN stays NaN. For x > 0 the result is
// unspecified. The softmax of the fused attention works in base 2 (its
// scores are scaled by log2(e) in the product that makes them), and 2^x is
// cheaper than e^x: the range reduction x = m + r, m = round(x), is exact
// in three additions (the shifter of ExpFlushPacket gives m and the
// exponent bits 2^m at once) instead of three fused multiply-adds with a
// two-part ln 2, and no clamp from above is needed. 2^r on [-1/2, 1/2] is
// a degree-6 polynomial, 1 + c1 r + ... + c6 r^6, whose coefficients were
// fitted to the relative error (2e-9 in exact arithmetic; 1.2e-7, about 1
// ulp, in float on a sweep of [-126, 0]); with c0 = 1, 2^0 is exactly 1.
// Isolated, on rows of 256: about a quarter less time than ExpFlushPacket.
inline FloatPacket Exp2FlushPacket(const FloatPacket& x_in) {
  namespace ei = Eigen::internal;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wignored-attributes"
  using IntPacket = ei::unpacket_traits<FloatPacket>::integer_packet;
#pragma GCC diagnostic pop
  // pmax returns its first argument when that is NaN.
  const FloatPacket x = ei::pmax(x_in, PacketSet(kExp2FloatNormalLowest));
  const FloatPacket shifter = PacketSet(12582912.0f + 127.0f);
  const FloatPacket t = ei::padd(x, shifter);
  const FloatPacket r = ei::psub(x, ei::psub(t, shifter));
  const FloatPacket r2 = ei::pmul(r, r);
  const FloatPacket r3 = ei::pmul(r2, r);
  const FloatPacket c12 = ei::pmadd(PacketSet(0.240226477f), r, PacketSet(0.693147182f));
  const FloatPacket c34 = ei::pmadd(PacketSet(0.00961843692f), r, PacketSet(0.0555033237f));
  const FloatPacket c56 = ei::pmadd(PacketSet(1.53533620e-4f), r, PacketSet(0.0013398875f));
  const FloatPacket low = ei::pmadd(c12, r, PacketSet(1.0f));  // 1 + c1 r + c2 r^2
  const FloatPacket high = ei::pmadd(c56, r2, c34);            // c3 + c4 r + c5 r^2 + c6 r^3
  const FloatPacket y = ei::pmadd(high, r3, low);
  const FloatPacket two_m =
      ei::preinterpret<FloatPacket>(ei::plogical_shift_left<23>(ei::preinterpret<IntPacket>(t)));
  return ei::pandnot(ei::pmul(y, two_m), ei::pcmp_lt(x_in, PacketSet(kExp2FloatNormalLowest)));
}

inline FloatPacket TanhPacket(const FloatPacket& x) { return Eigen::internal::ptanh(x); }

// 1 / (1 + exp(-x)) without overflow: e = exp(-|x|) lies in [0, 1].
inline FloatPacket SigmoidPacket(const FloatPacket& x) {
  namespace ei = Eigen::internal;
  const FloatPacket one = PacketSet(1.0f);
  const FloatPacket e = ExpPacket(ei::pnegate(ei::pabs(x)));
  const FloatPacket r = ei::pdiv(one, ei::padd(one, e));
  return ei::pselect(ei::pcmp_lt(x, ei::pzero(x)), ei::pmul(e, r), r);
}

// GELU's 0.5 (1 + tanh(u)), u = c (x + k x^3), written as sigmoid(2u) with
// e = exp(-2|u|) = 2^(-2|u| log2(e)) (Exp2FlushPacket, with log2(e) and the
// 2 folded into the polynomial's coefficients): s = 1 / (1 + e) for u >= 0,
// e / (1 + e) otherwise. Also
// returns s (1 - s) = e / (1 + e)^2 (= (1 - tanh(u)^2) / 4) and du/dx. This
// form has no cancellation where tanh saturates (1 - t^2 and 1 + t for
// large |u|), so it keeps a relative error of a few ulp there.
struct GeluParts {
  FloatPacket s;
  FloatPacket s_one_minus_s;
  FloatPacket du;
};

inline GeluParts GeluPartsOf(const FloatPacket& x) {
  namespace ei = Eigen::internal;
  const FloatPacket one = PacketSet(1.0f);
  const FloatPacket x2 = ei::pmul(x, x);
  const FloatPacket c = PacketSet(float(kGeluScale));
  // 2u log2(e) = (2 c log2(e)) x + (2 c k log2(e)) x^3.
  constexpr double kTwoLog2e = 2.0 * kLog2e;
  const FloatPacket two_u_log2 =
      ei::pmul(x, ei::pmadd(PacketSet(float(kTwoLog2e * kGeluScale * kGeluCubic)), x2,
                            PacketSet(float(kTwoLog2e * kGeluScale))));
  // Where e would be below 1e-38 (|x| > 10) it is taken as 0: s is then 1
  // or 0 to within far less than an ulp of gelu(x) ~ x or ~ 0.
  const FloatPacket e = Exp2FlushPacket(ei::pnegate(ei::pabs(two_u_log2)));
  const FloatPacket r = ei::pdiv(one, ei::padd(one, e));
  const FloatPacket er = ei::pmul(e, r);
  GeluParts parts;
  parts.s = ei::pselect(ei::pcmp_lt(two_u_log2, ei::pzero(x)), er, r);
  parts.s_one_minus_s = ei::pmul(er, r);
  parts.du = ei::pmadd(PacketSet(float(3 * kGeluScale * kGeluCubic)), x2, c);
  return parts;
}

// gelu(x) = x s.
inline FloatPacket GeluPacket(const FloatPacket& x) {
  return Eigen::internal::pmul(x, GeluPartsOf(x).s);
}

// d gelu / dx = 0.5 (1 + t) + 0.5 x (1 - t^2) du/dx = s + 2 x s (1 - s) du/dx.
inline FloatPacket GeluDerivativeFromParts(const FloatPacket& x, const GeluParts& p) {
  namespace ei = Eigen::internal;
  const FloatPacket two_x = ei::padd(x, x);
  return ei::pmadd(ei::pmul(two_x, p.s_one_minus_s), p.du, p.s);
}

inline FloatPacket GeluDerivativePacket(const FloatPacket& x) {
  return GeluDerivativeFromParts(x, GeluPartsOf(x));
}

// ---- scalar formulas (double, and the reference for tests) ----

template <typename T>
T StableSigmoid(T x) {
  if (x >= T(0)) return T(1) / (T(1) + std::exp(-x));
  const T e = std::exp(x);
  return e / (T(1) + e);
}

template <typename T>
T GeluValue(T x) {
  const T u = T(kGeluScale) * (x + T(kGeluCubic) * x * x * x);
  return T(0.5) * x * (T(1) + std::tanh(u));
}

template <typename T>
T GeluDerivative(T x) {
  const T t = std::tanh(T(kGeluScale) * (x + T(kGeluCubic) * x * x * x));
  const T du = T(kGeluScale) * (T(1) + T(3 * kGeluCubic) * x * x);
  return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * du;
}

// ---- array kernels: out may alias x (in place) ----

// The largest entry of x[0, n) (n >= 1); -inf entries are fine. With NaN
// entries the result is unspecified (callers' rows then turn NaN anyway).
inline float VecMax(const float* x, int64_t n) {
  namespace ei = Eigen::internal;
  int64_t i = 0;
  float m = -std::numeric_limits<float>::infinity();
  if (n >= kVecBlock) {
    FloatPacket acc = ei::ploadu<FloatPacket>(x);
    for (i = kVecBlock; i + kVecBlock <= n; i += kVecBlock) {
      acc = ei::pmax(acc, ei::ploadu<FloatPacket>(x + i));
    }
    m = ei::predux_max(acc);
  }
  for (; i < n; ++i) m = std::max(m, x[i]);
  return m;
}
inline double VecMax(const double* x, int64_t n) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

inline void VecExp(const float* x, float* out, int64_t n) { MapFloatPackets(x, out, n, ExpPacket); }
inline void VecExp(const double* x, double* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = std::exp(x[i]);
}

inline void VecTanh(const float* x, float* out, int64_t n) {
  MapFloatPackets(x, out, n, TanhPacket);
}
inline void VecTanh(const double* x, double* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = std::tanh(x[i]);
}

inline void VecSigmoid(const float* x, float* out, int64_t n) {
  MapFloatPackets(x, out, n, SigmoidPacket);
}
inline void VecSigmoid(const double* x, double* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = StableSigmoid(x[i]);
}

inline void VecGelu(const float* x, float* out, int64_t n) {
  MapFloatPackets(x, out, n, GeluPacket);
}
inline void VecGelu(const double* x, double* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = GeluValue(x[i]);
}

// out = g * gelu'(x).
inline void VecGeluBackward(const float* g, const float* x, float* out, int64_t n) {
  MapFloatPackets2(g, x, out, n, [](const FloatPacket& gp, const FloatPacket& xp) {
    return Eigen::internal::pmul(gp, GeluDerivativePacket(xp));
  });
}
inline void VecGeluBackward(const double* g, const double* x, double* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = g[i] * GeluDerivative(x[i]);
}

// out = gelu'(x).
inline void VecGeluDerivative(const float* x, float* out, int64_t n) {
  MapFloatPackets(x, out, n, GeluDerivativePacket);
}
inline void VecGeluDerivative(const double* x, double* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = GeluDerivative(x[i]);
}

// out = gelu(x) and derivative = gelu'(x) in one pass, sharing the exp and
// the division: bitwise the results of VecGelu and VecGeluDerivative (the
// tail is padded with 0 as in MapFloatPackets). out may be x (each input is
// read before its outputs are written), not derivative.
inline void VecGeluWithDerivative(const float* x, float* out, float* derivative, int64_t n) {
  namespace ei = Eigen::internal;
  auto both = [](const FloatPacket& xp, float* y, float* d) {
    const GeluParts parts = GeluPartsOf(xp);
    ei::pstoreu(y, ei::pmul(xp, parts.s));
    ei::pstoreu(d, GeluDerivativeFromParts(xp, parts));
  };
  int64_t i = 0;
  for (; i + kVecBlock <= n; i += kVecBlock) {
    both(ei::ploadu<FloatPacket>(x + i), out + i, derivative + i);
  }
  if (i < n) {
    float in_tail[kVecBlock] = {};
    float out_tail[kVecBlock];
    float derivative_tail[kVecBlock];
    std::copy(x + i, x + n, in_tail);
    both(ei::ploadu<FloatPacket>(in_tail), out_tail, derivative_tail);
    std::copy(out_tail, out_tail + (n - i), out + i);
    std::copy(derivative_tail, derivative_tail + (n - i), derivative + i);
  }
}
inline void VecGeluWithDerivative(const double* x, double* out, double* derivative, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];  // read before out[i] is written: out may be x
    out[i] = GeluValue(v);
    derivative[i] = GeluDerivative(v);
  }
}

// out[i] = exp_packet(x[i] - shift) and the sum of out: the body of
// VecExpShifted and VecExp2Shifted. The sum runs in packet lanes (lane l
// adds the entries l, l + kVecBlock, ...), then adds the lanes and the tail
// in order: a fixed order for a given n, so the result does not depend on
// threads either.
template <typename ExpPacketFn>
[[gnu::always_inline]] inline float ShiftedExpAndSum(
    const float* x, float shift, float* out, int64_t n, ExpPacketFn exp_packet) {
  namespace ei = Eigen::internal;
  const FloatPacket shift_packet = PacketSet(shift);
  FloatPacket acc = ei::pzero(shift_packet);
  int64_t i = 0;
  for (; i + kVecBlock <= n; i += kVecBlock) {
    const FloatPacket e = exp_packet(ei::psub(ei::ploadu<FloatPacket>(x + i), shift_packet));
    ei::pstoreu(out + i, e);
    acc = ei::padd(acc, e);
  }
  float s = ei::predux(acc);
  if (i < n) {
    float* tail = out + i;
    const int64_t tail_size = n - i;
    MapFloatPackets(x + i, tail, tail_size,
                    [&](const FloatPacket& xp) { return exp_packet(ei::psub(xp, shift_packet)); });
    for (int64_t t = 0; t < tail_size; ++t) s += tail[t];
  }
  return s;
}

// The same in double, through libm's exp_fn, in index order.
template <typename ExpFn>
double ShiftedExpAndSum(const double* x, double shift, double* out, int64_t n, ExpFn exp_fn) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    out[i] = exp_fn(x[i] - shift);
    s += out[i];
  }
  return s;
}

// out[i] = exp(x[i] - shift) for x[i] - shift <= 88 (ExpFlushPacket: 0
// where that is below 1e-38); returns the sum of out (see
// ShiftedExpAndSum). Not inlined: inlined into the fused attention's
// forward loop, GCC 12 kept part of the polynomial's state on the stack in
// every iteration (perf annotate: stores and reloads around the fused
// multiply-adds); compiled on its own the loop stays in registers, and the
// forward exponentials of W2 attention take about a fifth less time.
[[gnu::noinline]] inline float VecExpShifted(const float* x, float shift, float* out, int64_t n) {
  return ShiftedExpAndSum(x, shift, out, n, [](const FloatPacket& v) { return ExpFlushPacket(v); });
}
inline double VecExpShifted(const double* x, double shift, double* out, int64_t n) {
  return ShiftedExpAndSum(x, shift, out, n, [](double v) { return std::exp(v); });
}

// out[i] = 2^(x[i] - shift) for x[i] <= shift (Exp2FlushPacket: 0 where
// that is below 2^-126); returns the sum of out, added as VecExpShifted
// adds. Not inlined, for the reason given there.
[[gnu::noinline]] inline float VecExp2Shifted(const float* x, float shift, float* out, int64_t n) {
  return ShiftedExpAndSum(x, shift, out, n,
                          [](const FloatPacket& v) { return Exp2FlushPacket(v); });
}
inline double VecExp2Shifted(const double* x, double shift, double* out, int64_t n) {
  return ShiftedExpAndSum(x, shift, out, n, [](double v) { return std::exp2(v); });
}

// out[i] = 2^(x[i] - shift) * scale: per element bitwise what
// VecExp2Shifted followed by a multiplication by scale gives, in one pass (a
// softmax row recomputed from its recorded max and 1 / sum).
inline void VecExp2ShiftedScaled(const float* x, float shift, float scale, float* out, int64_t n) {
  namespace ei = Eigen::internal;
  const FloatPacket shift_packet = PacketSet(shift);
  const FloatPacket scale_packet = PacketSet(scale);
  MapFloatPackets(x, out, n, [&](const FloatPacket& xp) {
    return ei::pmul(Exp2FlushPacket(ei::psub(xp, shift_packet)), scale_packet);
  });
}
inline void VecExp2ShiftedScaled(
    const double* x, double shift, double scale, double* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = std::exp2(x[i] - shift) * scale;
}

// sum_i term_i for i in [0, n), float, in an order fixed by n alone (so
// results do not depend on threads): four packet accumulators over blocks
// of four packets, the first one over the remaining whole packets, their
// lanes added, then the tail in index order. accumulate(acc, i) returns acc
// plus the terms of elements [i, i + kVecBlock); term(i) is element i's.
// Always inlined: GCC 12 kept it out of line, and a layer norm's row of 64
// then made two calls for its two reductions (bench/RESULTS.md).
template <typename Accumulate, typename Term>
[[gnu::always_inline]] inline float SumInPacketLanes(int64_t n, Accumulate accumulate, Term term) {
  namespace ei = Eigen::internal;
  FloatPacket acc[4] = {PacketSet(0.0f), PacketSet(0.0f), PacketSet(0.0f), PacketSet(0.0f)};
  int64_t i = 0;
  for (; i + 4 * kVecBlock <= n; i += 4 * kVecBlock) {
    for (int j = 0; j < 4; ++j) acc[j] = accumulate(acc[j], i + j * kVecBlock);
  }
  for (; i + kVecBlock <= n; i += kVecBlock) acc[0] = accumulate(acc[0], i);
  float s = ei::predux(ei::padd(ei::padd(acc[0], acc[1]), ei::padd(acc[2], acc[3])));
  for (; i < n; ++i) s += term(i);
  return s;
}

// sum_i x[i]; double: in index order.
inline float VecSum(const float* x, int64_t n) {
  namespace ei = Eigen::internal;
  return SumInPacketLanes(
      n,
      [x](const FloatPacket& acc, int64_t i) {
        return ei::padd(acc, ei::ploadu<FloatPacket>(x + i));
      },
      [x](int64_t i) { return x[i]; });
}
inline double VecSum(const double* x, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += x[i];
  return s;
}

// sum_i (x[i] - mean)^2, in the same orders as VecSum.
inline float VecSumSquaredDeviation(const float* x, float mean, int64_t n) {
  namespace ei = Eigen::internal;
  const FloatPacket mp = PacketSet(mean);
  return SumInPacketLanes(
      n,
      [x, mp](const FloatPacket& acc, int64_t i) {
        const FloatPacket d = ei::psub(ei::ploadu<FloatPacket>(x + i), mp);
        return ei::pmadd(d, d, acc);
      },
      [x, mean](int64_t i) { return (x[i] - mean) * (x[i] - mean); });
}
inline double VecSumSquaredDeviation(const double* x, double mean, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += (x[i] - mean) * (x[i] - mean);
  return s;
}

// sum_i x[i] y[i], in the same orders as VecSum.
inline float VecDot(const float* x, const float* y, int64_t n) {
  namespace ei = Eigen::internal;
  return SumInPacketLanes(
      n,
      [x, y](const FloatPacket& acc, int64_t i) {
        return ei::pmadd(ei::ploadu<FloatPacket>(x + i), ei::ploadu<FloatPacket>(y + i), acc);
      },
      [x, y](int64_t i) { return x[i] * y[i]; });
}
inline double VecDot(const double* x, const double* y, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += x[i] * y[i];
  return s;
}

}  // namespace internal
}  // namespace stillpoint
