// Elementwise ops: constants, broadcasting binary ops, scalar and unary maps.
//
// VJPs are written with differentiable ops so that create_graph gives second
// derivatives. A binary op's VJP sums its gradient back to each input's
// shape with sum_to (the identity when the input was not broadcast). Where
// the differentiable form costs several passes (tanh, sigmoid, gelu, ...),
// the VJP takes a fused one-pass kernel when grad mode is off, which is
// exactly when the caller did not ask for create_graph.
#include <algorithm>
#include <cmath>

#include "framework/kernels/elementwise_kernels.h"
#include "framework/ops.h"
#include "framework/kernels/vector_math.h"

namespace stillpoint {
namespace {

using internal::MapBinary;
using internal::MapTernary;
using internal::MapUnary;

using internal::StableSigmoid;

// log(1 + exp(x)) without overflow: max(x, 0) + log1p(exp(-|x|)).
template <typename T>
T StableSoftplus(T x) {
  return std::max(x, T(0)) + std::log1p(std::exp(-std::abs(x)));
}

// A fresh tensor of x's shape and dtype holding kernel(x) for an array
// kernel of vector_math.h (kernel(const T* in, T* out, n) for float and
// double), split over threads in chunks.
template <typename Kernel>
Tensor MapVector(const Tensor& x, Kernel kernel) {
  Tensor out(x.shape(), x.dtype());
  DispatchDType(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* in = x.data<T>();
    T* dst = out.data<T>();
    internal::ParallelRange(0, x.numel(), internal::kMinChunk,
                            [&](int64_t lo, int64_t hi) { kernel(in + lo, dst + lo, hi - lo); });
  });
  return out;
}

// 1 where x > 0 (relu) as a constant of x's shape and dtype.
Var PositiveMask(const Var& x) {
  return constant(MapUnary(x.value(), [](auto v) { return v > 0 ? 1 : 0; }));
}

// a / s with a true division, so x / 3 rounds like the C++ expression.
Var DivScalar(const Var& x, double s) {
  Tensor out = MapUnary(x.value(), [s](auto v) {
    using T = decltype(v);
    return v / static_cast<T>(s);
  });
  return RecordOp("div_scalar", out, {x}, [s](const VarList& in, const Var& self, const Var& g) {
    return VarList{DivScalar(g, s)};
  });
}

}  // namespace

// ------------------------------------------------------------ constants

Var constant(const Tensor& value) { return Var(value, /*requires_grad=*/false); }

Var scalar_like(const Var& x, double value) { return constant(Tensor::Scalar(value, x.dtype())); }

Var zeros_like(const Var& x) { return constant(Tensor::Zeros(x.shape(), x.dtype())); }

Var ones_like(const Var& x) { return constant(Tensor::Ones(x.shape(), x.dtype())); }

Shape BroadcastShapes(const Shape& a, const Shape& b, const char* op) {
  const int rank = std::max(a.rank(), b.rank());
  std::vector<int64_t> dims(rank);
  for (int j = 1; j <= rank; ++j) {
    const int64_t da = j <= a.rank() ? a.dim(-j) : 1;
    const int64_t db = j <= b.rank() ? b.dim(-j) : 1;
    SP_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", a, " and ", b,
             " are not broadcastable");
    dims[rank - j] = da == 1 ? db : da;
  }
  return Shape(dims);
}

// ------------------------------------------ elementwise binary (broadcast)

Var add(const Var& a, const Var& b) {
  Tensor out = MapBinary(a.value(), b.value(), "add", [](auto u, auto v) { return u + v; });
  return RecordOp("add", out, {a, b}, [](const VarList& in, const Var& self, const Var& g) {
    return VarList{WantsInputGrad(in, 0) ? sum_to(g, in[0].shape()) : Var(),
                   WantsInputGrad(in, 1) ? sum_to(g, in[1].shape()) : Var()};
  });
}

Var sub(const Var& a, const Var& b) {
  Tensor out = MapBinary(a.value(), b.value(), "sub", [](auto u, auto v) { return u - v; });
  return RecordOp("sub", out, {a, b}, [](const VarList& in, const Var& self, const Var& g) {
    return VarList{WantsInputGrad(in, 0) ? sum_to(g, in[0].shape()) : Var(),
                   WantsInputGrad(in, 1) ? neg(sum_to(g, in[1].shape())) : Var()};
  });
}

Var mul(const Var& a, const Var& b) {
  Tensor out = MapBinary(a.value(), b.value(), "mul", [](auto u, auto v) { return u * v; });
  return RecordOp("mul", out, {a, b}, [](const VarList& in, const Var& self, const Var& g) {
    return VarList{WantsInputGrad(in, 0) ? sum_to(mul(g, in[1]), in[0].shape()) : Var(),
                   WantsInputGrad(in, 1) ? sum_to(mul(g, in[0]), in[1].shape()) : Var()};
  });
}

Var div(const Var& a, const Var& b) {
  Tensor out = MapBinary(a.value(), b.value(), "div", [](auto u, auto v) { return u / v; });
  return RecordOp("div", out, {a, b}, [](const VarList& in, const Var& self, const Var& g) {
    VarList grads(2);
    if (WantsInputGrad(in, 0)) grads[0] = sum_to(div(g, in[1]), in[0].shape());
    if (WantsInputGrad(in, 1)) {
      // d(a / b)/db = -(a / b) / b: reuse the output.
      Var local = GradModeEnabled() ? neg(div(self, in[1]))
                                    : constant(MapBinary(self.value(), in[1].value(), "div",
                                                         [](auto y, auto v) { return -y / v; }));
      grads[1] = sum_to(mul(g, local), in[1].shape());
    }
    return grads;
  });
}

Var maximum(const Var& a, const Var& b) {
  Tensor out = MapBinary(a.value(), b.value(), "maximum",
                         [](auto u, auto v) { return (u >= v || u != u) ? u : v; });
  return RecordOp("maximum", out, {a, b}, [](const VarList& in, const Var& self, const Var& g) {
    // Ties send the gradient to a.
    Tensor mask_a = MapBinary(in[0].value(), in[1].value(), "maximum",
                              [](auto u, auto v) { return u >= v ? 1 : 0; });
    VarList grads(2);
    if (WantsInputGrad(in, 0)) grads[0] = sum_to(mul(g, constant(mask_a)), in[0].shape());
    if (WantsInputGrad(in, 1)) {
      Tensor mask_b = MapUnary(mask_a, [](auto m) { return 1 - m; });
      grads[1] = sum_to(mul(g, constant(mask_b)), in[1].shape());
    }
    return grads;
  });
}

// ------------------------------------------------- scalar and unary ops

Var add_scalar(const Var& x, double s) {
  Tensor out = MapUnary(x.value(), [s](auto v) {
    using T = decltype(v);
    return v + static_cast<T>(s);
  });
  return RecordOp("add_scalar", out, {x},
                  [](const VarList& in, const Var& self, const Var& g) { return VarList{g}; });
}

Var mul_scalar(const Var& x, double s) {
  Tensor out = MapUnary(x.value(), [s](auto v) {
    using T = decltype(v);
    return v * static_cast<T>(s);
  });
  return RecordOp("mul_scalar", out, {x}, [s](const VarList& in, const Var& self, const Var& g) {
    return VarList{mul_scalar(g, s)};
  });
}

Var rdiv_scalar(double s, const Var& x) {
  Tensor out = MapUnary(x.value(), [s](auto v) {
    using T = decltype(v);
    return static_cast<T>(s) / v;
  });
  return RecordOp("rdiv_scalar", out, {x}, [](const VarList& in, const Var& self, const Var& g) {
    // d(s / x)/dx = -(s / x) / x.
    if (!GradModeEnabled()) {
      return VarList{constant(MapTernary(g.value(), self.value(), in[0].value(), "rdiv_scalar",
                                         [](auto gv, auto y, auto v) { return -gv * y / v; }))};
    }
    return VarList{neg(mul(g, div(self, in[0])))};
  });
}

Var neg(const Var& x) {
  Tensor out = MapUnary(x.value(), [](auto v) { return -v; });
  return RecordOp("neg", out, {x},
                  [](const VarList& in, const Var& self, const Var& g) { return VarList{neg(g)}; });
}

Var exp(const Var& x) {
  Tensor out =
      MapVector(x.value(), [](const auto* in, auto* y, int64_t n) { internal::VecExp(in, y, n); });
  return RecordOp("exp", out, {x}, [](const VarList& in, const Var& self, const Var& g) {
    return VarList{mul(g, self)};
  });
}

Var log(const Var& x) {
  Tensor out = MapUnary(x.value(), [](auto v) { return std::log(v); });
  return RecordOp("log", out, {x}, [](const VarList& in, const Var& self, const Var& g) {
    return VarList{div(g, in[0])};
  });
}

Var sqrt(const Var& x) {
  Tensor out = MapUnary(x.value(), [](auto v) { return std::sqrt(v); });
  return RecordOp("sqrt", out, {x}, [](const VarList& in, const Var& self, const Var& g) {
    // d sqrt(x)/dx = 0.5 / sqrt(x): reuse the output.
    if (!GradModeEnabled()) {
      return VarList{constant(MapBinary(g.value(), self.value(), "sqrt",
                                        [](auto gv, auto y) { return gv * 0.5f / y; }))};
    }
    return VarList{div(mul_scalar(g, 0.5), self)};
  });
}

Var rsqrt(const Var& x) {
  Tensor out = MapUnary(x.value(), [](auto v) {
    using T = decltype(v);
    return T(1) / std::sqrt(v);
  });
  return RecordOp("rsqrt", out, {x}, [](const VarList& in, const Var& self, const Var& g) {
    // d x^(-1/2)/dx = -0.5 x^(-3/2) = -0.5 y^3.
    if (!GradModeEnabled()) {
      return VarList{constant(MapBinary(g.value(), self.value(), "rsqrt",
                                        [](auto gv, auto y) { return -0.5f * gv * y * y * y; }))};
    }
    return VarList{mul(g, mul_scalar(mul(self, square(self)), -0.5))};
  });
}

Var square(const Var& x) {
  Tensor out = MapUnary(x.value(), [](auto v) { return v * v; });
  return RecordOp("square", out, {x}, [](const VarList& in, const Var& self, const Var& g) {
    if (!GradModeEnabled()) {
      return VarList{constant(MapBinary(g.value(), in[0].value(), "square",
                                        [](auto gv, auto v) { return 2.0f * gv * v; }))};
    }
    return VarList{mul(g, mul_scalar(in[0], 2.0))};
  });
}

Var pow(const Var& x, double exponent) {
  Tensor out;
  if (exponent == 2.0) {
    out = MapUnary(x.value(), [](auto v) { return v * v; });
  } else {
    out = MapUnary(x.value(), [exponent](auto v) {
      using T = decltype(v);
      return std::pow(v, static_cast<T>(exponent));
    });
  }
  return RecordOp("pow", out, {x}, [exponent](const VarList& in, const Var& self, const Var& g) {
    // d x^p/dx = p x^(p-1); p = 0 has a zero derivative everywhere.
    if (exponent == 0.0) return VarList{zeros_like(in[0])};
    if (exponent == 1.0) return VarList{g};
    if (!GradModeEnabled()) {
      return VarList{
          constant(MapBinary(g.value(), in[0].value(), "pow", [exponent](auto gv, auto v) {
            using T = decltype(v);
            return gv * static_cast<T>(exponent) * std::pow(v, static_cast<T>(exponent - 1.0));
          }))};
    }
    return VarList{mul(g, mul_scalar(pow(in[0], exponent - 1.0), exponent))};
  });
}

Var abs(const Var& x) {
  Tensor out = MapUnary(x.value(), [](auto v) { return std::abs(v); });
  return RecordOp("abs", out, {x}, [](const VarList& in, const Var& self, const Var& g) {
    // sign(x) with sign(0) = 0, held constant (its derivative is 0 a.e.).
    Var sign =
        constant(MapUnary(in[0].value(), [](auto v) { return v > 0 ? 1 : (v < 0 ? -1 : 0); }));
    return VarList{mul(g, sign)};
  });
}

Var tanh(const Var& x) {
  Tensor out =
      MapVector(x.value(), [](const auto* in, auto* y, int64_t n) { internal::VecTanh(in, y, n); });
  return RecordOp("tanh", out, {x}, [](const VarList& in, const Var& self, const Var& g) {
    // d tanh/dx = 1 - tanh^2: reuse the output.
    if (!GradModeEnabled()) {
      return VarList{constant(MapBinary(g.value(), self.value(), "tanh",
                                        [](auto gv, auto y) { return gv * (1 - y * y); }))};
    }
    return VarList{mul(g, add_scalar(neg(square(self)), 1.0))};
  });
}

Var sigmoid(const Var& x) {
  Tensor out = MapVector(
      x.value(), [](const auto* in, auto* y, int64_t n) { internal::VecSigmoid(in, y, n); });
  return RecordOp("sigmoid", out, {x}, [](const VarList& in, const Var& self, const Var& g) {
    // d sigmoid/dx = s (1 - s): reuse the output.
    if (!GradModeEnabled()) {
      return VarList{constant(MapBinary(g.value(), self.value(), "sigmoid",
                                        [](auto gv, auto s) { return gv * s * (1 - s); }))};
    }
    return VarList{mul(g, mul(self, add_scalar(neg(self), 1.0)))};
  });
}

Var relu(const Var& x) {
  Tensor out = MapUnary(x.value(), [](auto v) {
    using T = decltype(v);
    // Written so NaN propagates (std::max(v, 0) would drop it).
    return v < T(0) ? T(0) : v;
  });
  return RecordOp("relu", out, {x}, [](const VarList& in, const Var& self, const Var& g) {
    return VarList{mul(g, PositiveMask(in[0]))};
  });
}

namespace {

// gelu(x) and, in `derivative`, gelu'(x), computed together in one pass.
Tensor GeluWithDerivative(const Tensor& x, Tensor* derivative) {
  Tensor out(x.shape(), x.dtype());
  *derivative = Tensor(x.shape(), x.dtype());
  DispatchDType(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* in = x.data<T>();
    T* y = out.data<T>();
    T* d = derivative->data<T>();
    internal::ParallelRange(0, x.numel(), internal::kMinChunk, [&](int64_t lo, int64_t hi) {
      internal::VecGeluWithDerivative(in + lo, y + lo, d + lo, hi - lo);
    });
  });
  return out;
}

}  // namespace

Var gelu(const Var& x) {
  // When recording, gelu'(x) is computed with the value (it shares the exp
  // and the division, so it costs far less than a second pass) and kept
  // until the graph is released: every backward is then one multiply. The
  // values are those of VecGeluBackward, bitwise.
  const bool recording = GradModeEnabled() && x.requires_grad();
  Tensor derivative;
  Tensor out = recording ? GeluWithDerivative(x.value(), &derivative)
                         : MapVector(x.value(), [](const auto* in, auto* y, int64_t n) {
                             internal::VecGelu(in, y, n);
                           });
  return RecordOp("gelu", out, {x}, [derivative](const VarList& in, const Var& self, const Var& g) {
    if (!GradModeEnabled()) {
      return VarList{constant(internal::GeluGradient(g.value(), derivative, "gelu"))};
    }
    // The same derivative as GeluDerivative, in differentiable ops of x.
    const Var& v = in[0];
    Var v2 = square(v);
    Var t = tanh(
        mul_scalar(add(v, mul_scalar(mul(v, v2), internal::kGeluCubic)), internal::kGeluScale));
    Var du = mul_scalar(add_scalar(mul_scalar(v2, 3.0 * internal::kGeluCubic), 1.0),
                        internal::kGeluScale);
    Var first = mul_scalar(add_scalar(t, 1.0), 0.5);
    Var second = mul(mul_scalar(v, 0.5), mul(add_scalar(neg(square(t)), 1.0), du));
    return VarList{mul(g, add(first, second))};
  });
}

namespace internal {

Tensor GeluGradient(const Tensor& g, const Tensor& derivative, const char* op) {
  SP_CHECK(g.shape() == derivative.shape() && g.dtype() == derivative.dtype(), op, ": gradient ",
           g.shape(), " for input ", derivative.shape());
  Tensor dx(g.shape(), g.dtype());
  DispatchDType(g.dtype(), [&](auto zero) {
    using T = decltype(zero);
    BinaryLoop(g.data<T>(), derivative.data<T>(), dx.data<T>(), g.numel(),
               [](T a, T b) { return a * b; });
  });
  return dx;
}

}  // namespace internal

Var softplus(const Var& x) {
  Tensor out = MapUnary(x.value(), [](auto v) { return StableSoftplus(v); });
  return RecordOp("softplus", out, {x}, [](const VarList& in, const Var& self, const Var& g) {
    // d softplus/dx = sigmoid(x).
    if (!GradModeEnabled()) {
      return VarList{constant(MapBinary(g.value(), in[0].value(), "softplus",
                                        [](auto gv, auto v) { return gv * StableSigmoid(v); }))};
    }
    return VarList{mul(g, sigmoid(in[0]))};
  });
}

// ------------------------------------------------------------ operators

Var operator+(const Var& a, const Var& b) { return add(a, b); }
Var operator-(const Var& a, const Var& b) { return sub(a, b); }
Var operator*(const Var& a, const Var& b) { return mul(a, b); }
Var operator/(const Var& a, const Var& b) { return div(a, b); }
Var operator-(const Var& x) { return neg(x); }
Var operator+(const Var& a, double s) { return add_scalar(a, s); }
Var operator+(double s, const Var& a) { return add_scalar(a, s); }
Var operator-(const Var& a, double s) { return add_scalar(a, -s); }
Var operator-(double s, const Var& a) { return add_scalar(neg(a), s); }
Var operator*(const Var& a, double s) { return mul_scalar(a, s); }
Var operator*(double s, const Var& a) { return mul_scalar(a, s); }
Var operator/(const Var& a, double s) { return DivScalar(a, s); }
Var operator/(double s, const Var& a) { return rdiv_scalar(s, a); }

}  // namespace stillpoint
