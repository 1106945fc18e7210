// Reductions and the broadcast_to / sum_to pair: values against direct
// loops, gradient checks (first and second order), the first-maximum rule of
// max, adjointness, float32 accuracy, errors, NaN propagation and
// independence from the thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "framework/gradcheck.h"
#include "framework/ops.h"
#include "framework/parallel.h"
#include "framework/random.h"

namespace stillpoint::ops_reduce_test {
namespace {

Var Normal(const Shape& shape, uint64_t seed, DType dtype = DType::kFloat64) {
  Rng rng(seed);
  return Var(RandomNormal(shape, 0.0, 1.0, dtype, rng));
}

// Row-major coordinates of a flat index.
std::vector<int64_t> Coords(const Shape& shape, int64_t flat) {
  std::vector<int64_t> coords(shape.rank());
  for (int axis = shape.rank() - 1; axis >= 0; --axis) {
    coords[axis] = flat % shape.dim(axis);
    flat /= shape.dim(axis);
  }
  return coords;
}

int64_t Flat(const Shape& shape, const std::vector<int64_t>& coords) {
  int64_t flat = 0;
  for (int axis = 0; axis < shape.rank(); ++axis) flat = flat * shape.dim(axis) + coords[axis];
  return flat;
}

// The reference reduction over `axis` (kept, extent 1) by a direct loop.
std::vector<double> ReduceByLoop(const Tensor& x, int axis, bool take_max) {
  std::vector<int64_t> dims = x.shape().dims();
  dims[axis] = 1;
  const Shape kept(dims);
  std::vector<double> out(kept.numel(), take_max ? -INFINITY : 0.0);
  for (int64_t i = 0; i < x.numel(); ++i) {
    std::vector<int64_t> c = Coords(x.shape(), i);
    c[axis] = 0;
    double& slot = out[Flat(kept, c)];
    slot = take_max ? std::max(slot, x.at(i)) : slot + x.at(i);
  }
  return out;
}

const std::vector<Shape>& ReductionShapes() {
  static const std::vector<Shape> shapes = {Shape{5}, Shape{3, 4}, Shape{2, 3, 4},
                                            Shape{2, 3, 2, 3}};
  return shapes;
}

TEST(ReduceTest, SumAndMeanOfAllElements) {
  for (DType dtype : {DType::kFloat64, DType::kFloat32}) {
    Var x = Normal(Shape{2, 3, 5}, 1, dtype);
    double total = 0.0;
    for (int64_t i = 0; i < x.numel(); ++i) total += x.value().at(i);
    Var s = sum(x);
    Var m = mean(x);
    EXPECT_EQ(s.shape(), Shape{});
    EXPECT_EQ(s.dtype(), dtype);
    EXPECT_NEAR(s.item(), total, dtype == DType::kFloat64 ? 1e-13 : 1e-5);
    EXPECT_NEAR(m.item(), total / 30.0, dtype == DType::kFloat64 ? 1e-14 : 1e-6);
  }
  Var scalar(Tensor::Scalar(4.5, DType::kFloat64));
  EXPECT_EQ(sum(scalar).item(), 4.5);
  EXPECT_EQ(mean(scalar).item(), 4.5);
}

TEST(ReduceTest, AxisReductionsMatchDirectLoops) {
  for (const Shape& shape : ReductionShapes()) {
    Var x = Normal(shape, 2);
    for (int axis = 0; axis < shape.rank(); ++axis) {
      const std::vector<double> sums = ReduceByLoop(x.value(), axis, false);
      const std::vector<double> maxima = ReduceByLoop(x.value(), axis, true);
      for (bool keepdim : {false, true}) {
        Var s = sum(x, axis, keepdim);
        Var m = mean(x, axis, keepdim);
        Var mx = max(x, axis, keepdim);
        std::vector<int64_t> dims = shape.dims();
        if (keepdim) {
          dims[axis] = 1;
        } else {
          dims.erase(dims.begin() + axis);
        }
        ASSERT_EQ(s.shape(), Shape(dims)) << shape << " axis " << axis;
        ASSERT_EQ(m.shape(), Shape(dims));
        ASSERT_EQ(mx.shape(), Shape(dims));
        for (std::size_t i = 0; i < sums.size(); ++i) {
          EXPECT_NEAR(s.value().at(i), sums[i], 1e-13) << shape << " axis " << axis;
          EXPECT_NEAR(m.value().at(i), sums[i] / shape.dim(axis), 1e-14);
          EXPECT_EQ(mx.value().at(i), maxima[i]);
        }
      }
    }
  }
}

TEST(ReduceTest, NegativeAxesCountFromTheEnd) {
  Var x = Normal(Shape{2, 3, 4}, 3);
  EXPECT_EQ(MaxAbsDiff(sum(x, -1).value(), sum(x, 2).value()), 0.0);
  EXPECT_EQ(MaxAbsDiff(mean(x, -3, true).value(), mean(x, 0, true).value()), 0.0);
  EXPECT_EQ(MaxAbsDiff(max(x, -2).value(), max(x, 1).value()), 0.0);
}

TEST(ReduceTest, Float32ReductionsAccumulateAccurately) {
  // Float32 spacing at 1e8 is 8, so a float accumulator would drop every
  // added 1; the double accumulator keeps them (100001000 is a float32).
  std::vector<double> values(1001, 1.0);
  values[0] = 1e8;
  Var big_then_small(Tensor::FromVector(Shape{1001}, values, DType::kFloat32));
  EXPECT_EQ(sum(big_then_small).item(), 100001000.0);
  EXPECT_EQ(sum(big_then_small, 0).item(), 100001000.0);
  Var tenths(Tensor::Full(Shape{1000, 1000}, 0.1, DType::kFloat32));
  EXPECT_NEAR(sum(tenths).item(), 1e5, 1.0);
  EXPECT_NEAR(mean(tenths).item(), 0.1, 1e-7);
  Var column_sums = sum(tenths, 0);
  for (int64_t j = 0; j < 1000; j += 97) EXPECT_NEAR(column_sums.value().at(j), 100.0, 1e-4);
}

TEST(ReduceTest, MaxGradientGoesToTheFirstMaximalEntry) {
  Var x(Tensor::FromVector(Shape{2, 4}, {1.0, 3.0, 3.0, 0.0, 2.0, 2.0, 2.0, 2.0}, DType::kFloat64),
        true);
  Var g = grad({sum(max(x, 1))}, {x})[0];
  EXPECT_EQ(g.value().ToVector(), (std::vector<double>{0, 1, 0, 0, 1, 0, 0, 0}));
  Var gk = grad({sum(max(x, 0, true))}, {x})[0];
  EXPECT_EQ(gk.value().ToVector(), (std::vector<double>{0, 1, 1, 0, 1, 0, 0, 1}));
}

// ------------------------------------------------------ gradient checks

TEST(ReduceTest, ReductionGradientsMatchFiniteDifferences) {
  for (const Shape& shape : ReductionShapes()) {
    Var x = Normal(shape, 4);
    auto all = CheckGradients([](const VarList& in) { return sum(in[0]); }, {x});
    EXPECT_TRUE(all) << shape << ": " << all;
    auto avg = CheckGradients([](const VarList& in) { return mean(in[0]); }, {x});
    EXPECT_TRUE(avg) << shape << ": " << avg;
    for (int axis = -shape.rank(); axis < shape.rank(); ++axis) {
      for (bool keepdim : {false, true}) {
        auto s = CheckGradients([&](const VarList& in) { return sum(in[0], axis, keepdim); }, {x});
        EXPECT_TRUE(s) << "sum " << shape << " axis " << axis << ": " << s;
        auto m = CheckGradients([&](const VarList& in) { return mean(in[0], axis, keepdim); }, {x});
        EXPECT_TRUE(m) << "mean " << shape << " axis " << axis << ": " << m;
        // Random normal entries have no ties, so max is differentiable here.
        auto mx = CheckGradients([&](const VarList& in) { return max(in[0], axis, keepdim); }, {x});
        EXPECT_TRUE(mx) << "max " << shape << " axis " << axis << ": " << mx;
      }
    }
  }
}

TEST(ReduceTest, ReductionSecondOrderGradientsMatchFiniteDifferences) {
  Var x = Normal(Shape{2, 3, 2}, 5);
  // Nonlinear wrappers make the Hessians nonzero, so the reductions' VJPs
  // are differentiated on both sides.
  const std::vector<std::pair<std::string, VarFunction>> cases = {
      {"sum", [](const VarList& in) { return square(sum(tanh(in[0]))); }},
      {"mean", [](const VarList& in) { return exp(mean(square(in[0]))); }},
      {"sum_axis", [](const VarList& in) { return square(sum(tanh(in[0]), 1)); }},
      {"sum_axis_keepdim",
       [](const VarList& in) { return mul(sum(square(in[0]), -1, true), in[0]); }},
      {"mean_axis", [](const VarList& in) { return square(mean(sigmoid(in[0]), 0)); }},
      {"mean_axis_keepdim",
       [](const VarList& in) { return div(in[0], add_scalar(mean(square(in[0]), 2, true), 1)); }},
      {"max_axis", [](const VarList& in) { return square(max(tanh(in[0]), 1)); }},
      {"sum_to",
       [](const VarList& in) {
         return square(sum_to(tanh(in[0]), Shape{3, 1}));
       }},
      {"broadcast_to",
       [](const VarList& in) {
         return square(broadcast_to(tanh(in[0]), Shape{2, 2, 3, 2}));
       }},
  };
  for (const auto& [name, f] : cases) {
    auto r = CheckSecondOrderGradients(f, {x});
    EXPECT_TRUE(r) << name << ": " << r;
  }
}

// ------------------------------------------------- sum_to / broadcast_to

// (big shape, small shape) pairs: small broadcasts to big.
std::vector<std::pair<Shape, Shape>> BroadcastPairs() {
  return {
      {Shape{2, 3, 4}, Shape{3, 1}},    {Shape{2, 3, 4}, Shape{4}},
      {Shape{2, 3}, Shape{}},           {Shape{2, 3, 4}, Shape{2, 1, 4}},
      {Shape{2, 3, 4}, Shape{1, 3, 1}}, {Shape{2, 3, 2, 3}, Shape{3, 1, 3}},
      {Shape{5, 4}, Shape{1, 4}},       {Shape{2, 3}, Shape{2, 3}},
  };
}

TEST(ReduceTest, BroadcastToAndSumToMatchDirectLoops) {
  for (const auto& [big, small] : BroadcastPairs()) {
    Var x = Normal(small, 6);
    Var y = Normal(big, 7);
    Var bx = broadcast_to(x, big);
    Var sy = sum_to(y, small);
    ASSERT_EQ(bx.shape(), big);
    ASSERT_EQ(sy.shape(), small);
    std::vector<double> expected_sums(small.numel(), 0.0);
    for (int64_t i = 0; i < big.numel(); ++i) {
      std::vector<int64_t> c = Coords(big, i);
      std::vector<int64_t> sc(small.rank());
      for (int axis = 0; axis < small.rank(); ++axis) {
        sc[axis] = small.dim(axis) == 1 ? 0 : c[big.rank() - small.rank() + axis];
      }
      const int64_t j = Flat(small, sc);
      EXPECT_EQ(bx.value().at(i), x.value().at(j)) << big << " <- " << small;
      expected_sums[j] += y.value().at(i);
    }
    for (int64_t j = 0; j < small.numel(); ++j) {
      EXPECT_NEAR(sy.value().at(j), expected_sums[j], 1e-13) << big << " -> " << small;
    }
  }
}

TEST(ReduceTest, SumToDropsLeadingExtentOneAxes) {
  Var y = Normal(Shape{1, 1, 3, 4}, 8);
  Var s = sum_to(y, Shape{3, 4});
  EXPECT_EQ(s.shape(), (Shape{3, 4}));
  EXPECT_EQ(s.value().ToVector(), y.value().ToVector());
}

TEST(ReduceTest, SumToAndBroadcastToAreAdjoint) {
  for (const auto& [big, small] : BroadcastPairs()) {
    Var x = Normal(small, 9);
    Var y = Normal(big, 10);
    const double lhs = sum(mul(broadcast_to(x, big), y)).item();
    const double rhs = sum(mul(x, sum_to(y, small))).item();
    EXPECT_NEAR(lhs, rhs, 1e-12) << big << " / " << small;
  }
}

TEST(ReduceTest, SumToAndBroadcastToGradientsMatchFiniteDifferences) {
  for (const auto& [big, small] : BroadcastPairs()) {
    const Shape target_big = big;
    const Shape target_small = small;
    auto b = CheckGradients([&](const VarList& in) { return broadcast_to(in[0], target_big); },
                            {Normal(small, 11)});
    EXPECT_TRUE(b) << "broadcast_to " << small << " -> " << big << ": " << b;
    auto s = CheckGradients([&](const VarList& in) { return sum_to(in[0], target_small); },
                            {Normal(big, 12)});
    EXPECT_TRUE(s) << "sum_to " << big << " -> " << small << ": " << s;
  }
}

TEST(ReduceTest, SameShapeIsTheIdentity) {
  Var x(Normal(Shape{2, 3}, 13).value(), true);
  Var s = sum_to(x, Shape{2, 3});
  Var b = broadcast_to(x, Shape{2, 3});
  EXPECT_TRUE(s.value().SameStorage(x.value()));
  EXPECT_TRUE(b.value().SameStorage(x.value()));
}

// ---------------------------------------------------------------- errors

std::string ErrorMessage(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ReduceTest, MisuseNamesTheOpAndTheShapes) {
  Var x = Normal(Shape{2, 3}, 14);
  struct Case {
    std::string op;
    std::function<void()> call;
    std::vector<std::string> pieces;
  };
  const std::vector<Case> cases = {
      {"sum", [&] { sum(x, 2); }, {"axis 2", "[2, 3]"}},
      {"mean", [&] { mean(x, -3); }, {"axis -3", "[2, 3]"}},
      {"max", [&] { max(x, 5, true); }, {"axis 5", "[2, 3]"}},
      {"sum_to", [&] { sum_to(x, Shape{2}); }, {"[2, 3]", "[2]"}},
      {"sum_to",
       [&] {
         sum_to(x, Shape{4, 2, 3});
       },
       {"[2, 3]", "[4, 2, 3]"}},
      {"broadcast_to",
       [&] {
         broadcast_to(x, Shape{3, 3});
       },
       {"[2, 3]", "[3, 3]"}},
      {"broadcast_to", [&] { broadcast_to(x, Shape{3}); }, {"[2, 3]", "[3]"}},
  };
  for (const Case& c : cases) {
    const std::string message = ErrorMessage(c.call);
    ASSERT_FALSE(message.empty()) << c.op << " did not throw";
    EXPECT_EQ(message.rfind(c.op + ":", 0), 0u) << message;
    for (const std::string& piece : c.pieces) {
      EXPECT_NE(message.find(piece), std::string::npos) << message << " lacks " << piece;
    }
  }
  Var scalar(Tensor::Scalar(1.0, DType::kFloat64));
  EXPECT_THROW(sum(scalar, 0), Error);
}

// ------------------------------------------------------------- numerics

TEST(ReduceTest, NonFiniteValuesPropagate) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  Var x(Tensor::FromVector(Shape{2, 3}, {1.0, nan, 2.0, -inf, 0.0, inf}, DType::kFloat64));
  EXPECT_TRUE(std::isnan(sum(x).item()));
  Var rows = sum(x, 1);
  EXPECT_TRUE(std::isnan(rows.value().at(0)));
  EXPECT_TRUE(std::isnan(rows.value().at(1)));  // -inf + inf
  Var maxima = max(x, 1);
  EXPECT_TRUE(std::isnan(maxima.value().at(0)));
  EXPECT_EQ(maxima.value().at(1), inf);
  EXPECT_EQ(max(x, 0).value().at(0), 1.0);
  EXPECT_TRUE(std::isnan(max(x, 0).value().at(1)));
}

// Large reductions use fixed blocks, so the thread count cannot change them.
TEST(ReduceTest, ResultsAreIdenticalForOneAndTwoThreads) {
  Var long_row = Normal(Shape{3, 200003}, 15);  // blocked row sums
  Var tall = Normal(Shape{4096, 67}, 16);       // column sums (inner > 1)
  Var wide = Normal(Shape{37, 8, 1031}, 17);    // many medium rows
  Var flat = Normal(Shape{1 << 20}, 18, DType::kFloat32);
  auto run = [&](int threads) {
    ScopedNumThreads scoped(threads);
    return std::vector<Tensor>{sum(long_row, 1).value(),
                               sum(long_row).value(),
                               mean(tall, 0).value(),
                               sum(wide, -1, true).value(),
                               max(wide, 1).value(),
                               sum_to(wide, Shape{8, 1}).value(),
                               broadcast_to(sum(wide, 0, true), wide.shape()).value(),
                               sum(flat).value(),
                               max(tall, 0).value()};
  };
  const std::vector<Tensor> one = run(1);
  const std::vector<Tensor> two = run(2);
  ASSERT_EQ(one.size(), two.size());
  for (std::size_t k = 0; k < one.size(); ++k) {
    ASSERT_EQ(one[k].shape(), two[k].shape());
    EXPECT_EQ(MaxAbsDiff(one[k], two[k]), 0.0) << "result " << k;
  }
  // The blocked sum agrees with a plain sequential sum to rounding.
  double total = 0.0;
  for (int64_t i = 0; i < long_row.numel(); ++i) total += long_row.value().at(i);
  EXPECT_NEAR(one[1].item(), total, 1e-9);
}

// x read as [outer, n, inner] -> the sums over n, each accumulated in
// float64 in ascending order and rounded once to x's dtype: the order the
// column-sum kernel promises, so its results must match bitwise.
std::vector<double> ColumnSumsByLoop(const Tensor& x, int64_t outer, int64_t n, int64_t inner) {
  const std::vector<double> values = x.ToVector();
  std::vector<double> out(outer * inner);
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      double acc = 0.0;
      for (int64_t k = 0; k < n; ++k) acc += values[(o * n + k) * inner + i];
      out[o * inner + i] =
          x.dtype() == DType::kFloat32 ? static_cast<double>(static_cast<float>(acc)) : acc;
    }
  }
  return out;
}

// Column sums (inner > 1: bias gradients, sum_to of [B, T, D] to [D]) for
// widths that are not multiples of the kernel's column blocks, few and many
// rows, one and two threads.
TEST(ReduceTest, ColumnSumsMatchASequentialFloat64LoopBitwise) {
  struct Case {
    int64_t outer, n, inner;
  };
  const std::vector<Case> cases = {{1, 1, 3},     {1, 2, 7},     {1, 5, 13},    {2, 17, 31},
                                   {1, 6, 100},   {1, 1024, 64}, {3, 1000, 33}, {1, 3000, 45},
                                   {2, 4099, 67}, {1, 700, 129}};
  uint64_t seed = 30;
  for (const Case& c : cases) {
    for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
      // Shifted away from 0 so the float64 sums round differently from float ones.
      const Var x = add_scalar(Normal(Shape{c.outer, c.n, c.inner}, ++seed, dtype), 0.37);
      const std::vector<double> expected = ColumnSumsByLoop(x.value(), c.outer, c.n, c.inner);
      for (int threads : {1, 2}) {
        ScopedNumThreads scoped(threads);
        const std::vector<double> by_axis = sum(x, 1).value().ToVector();
        EXPECT_EQ(by_axis, expected) << "[" << c.outer << ", " << c.n << ", " << c.inner << "] "
                                     << ToString(dtype) << ", " << threads << " threads";
        if (c.outer == 1) {
          const std::vector<double> by_sum_to = sum_to(x, Shape{c.inner}).value().ToVector();
          EXPECT_EQ(by_sum_to, expected) << "sum_to [" << c.n << ", " << c.inner << "] "
                                         << ToString(dtype) << ", " << threads << " threads";
        }
      }
    }
  }
}

TEST(ReduceTest, ReductionGradientsAreIdenticalForOneAndTwoThreads) {
  Var x(Normal(Shape{64, 4099}, 19).value(), true);
  auto run = [&](int threads) {
    ScopedNumThreads scoped(threads);
    Var y = add(max(x, 0, true), mean(x, 1, true));
    return grad({sum(mul(y, y))}, {x})[0].value();
  };
  EXPECT_EQ(MaxAbsDiff(run(1), run(2)), 0.0);
}

}  // namespace
}  // namespace stillpoint::ops_reduce_test
