// Behaviour of the autodiff engine: accumulation, shared subexpressions,
// deep graphs, retain_graph, NoGrad, create_graph, determinism, errors and the
// per-thread grad mode.
#include "framework/autograd.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <string>
#include <thread>

#include "framework/ops.h"
#include "framework/parallel.h"
#include "framework/random.h"

namespace stillpoint::autograd_test {
namespace {

Var Leaf(std::initializer_list<double> values, bool requires_grad = true) {
  std::vector<double> v(values);
  return Var(Tensor::FromVector(Shape{static_cast<int64_t>(v.size())}, v, DType::kFloat64),
             requires_grad);
}

TEST(AutogradTest, GradientOfProductMatchesHandDerivative) {
  Var x = Leaf({1.5, -2.0, 0.25});
  Var y = Leaf({3.0, 0.5, -4.0});
  Var loss = sum(mul(x, y));
  backward(loss);
  for (int i = 0; i < 3; ++i) {
    EXPECT_DOUBLE_EQ(x.grad().value().at(i), y.value().at(i));
    EXPECT_DOUBLE_EQ(y.grad().value().at(i), x.value().at(i));
  }
}

TEST(AutogradTest, LeafGradientsAccumulateAcrossBackwardCalls) {
  Var x = Leaf({2.0});
  backward(sum(mul(x, x)));           // d/dx x^2 = 4
  backward(sum(mul_scalar(x, 3.0)));  // + 3
  EXPECT_DOUBLE_EQ(x.grad().item(), 7.0);
  x.zero_grad();
  EXPECT_FALSE(x.has_grad());
}

// A second gradient reaching a leaf (or node) whose first gradient nothing
// else holds is added into the first's storage: the same values, no new
// tensor.
TEST(AutogradTest, AGradientHeldByNothingElseIsAccumulatedInItsOwnStorage) {
  Var x = Leaf({2.0, -1.0, 0.5});
  backward(sum(mul(x, x)));  // 2 x
  const double* first = x.grad().value().data<double>();
  backward(sum(mul_scalar(x, 3.0)));  // + 3
  EXPECT_EQ(x.grad().value().data<double>(), first);
  for (int i = 0; i < 3; ++i) {
    EXPECT_DOUBLE_EQ(x.grad().value().at(i), 2.0 * x.value().at(i) + 3.0);
  }
}

// ... but never into a gradient someone still sees: a Var or a tensor the
// caller kept, or the grad_outputs passed in (which reach z by two paths
// here, the second adding to the first).
TEST(AutogradTest, AccumulationNeverChangesAGradientTheCallerStillHolds) {
  Var x = Leaf({2.0, -1.0, 0.5});
  backward(sum(mul(x, x)));
  const Var held = x.grad();
  backward(sum(mul_scalar(x, 3.0)));
  const Tensor held_value = x.grad().value();  // shares the storage
  backward(sum(mul_scalar(x, 5.0)));
  for (int i = 0; i < 3; ++i) {
    const double xi = x.value().at(i);
    EXPECT_DOUBLE_EQ(held.value().at(i), 2.0 * xi);
    EXPECT_DOUBLE_EQ(held_value.at(i), 2.0 * xi + 3.0);
    EXPECT_DOUBLE_EQ(x.grad().value().at(i), 2.0 * xi + 8.0);
  }

  Var z = Leaf({0.3, -0.7, 1.1});
  const Var seed = Leaf({1.0, 2.0, 4.0}, false);
  // The reshapes' gradient (swept first) is a view of seed's storage; the
  // exponential's is added to it.
  backward(add(exp(z), reshape(reshape(z, Shape{3, 1}), Shape{3})), seed);
  for (int i = 0; i < 3; ++i) {
    const double s = seed.value().at(i);
    EXPECT_DOUBLE_EQ(seed.value().at(i), i == 0 ? 1.0 : (i == 1 ? 2.0 : 4.0));
    EXPECT_NEAR(z.grad().value().at(i), s + s * std::exp(z.value().at(i)), 1e-12);
  }
}

TEST(AutogradTest, SharedSubexpressionGetsTheSumOfItsPaths) {
  Var x = Leaf({0.7});
  Var e = exp(x);                     // used three times
  Var loss = sum(add(mul(e, e), e));  // e^2 + e, d/dx = 2 e^2 + e
  backward(loss);
  const double ev = std::exp(0.7);
  EXPECT_NEAR(x.grad().item(), 2 * ev * ev + ev, 1e-12);
}

TEST(AutogradTest, DeepChainOfOneHundredThousandNodesDoesNotOverflowTheStack) {
  constexpr int kDepth = 100000;
  Var x = Leaf({1.0});
  Var y = x;
  for (int i = 0; i < kDepth; ++i) y = add_scalar(y, 1e-6);
  EXPECT_EQ(CountGraphNodes({y}), kDepth + 1);
  backward(sum(y));
  EXPECT_DOUBLE_EQ(x.grad().item(), 1.0);
  // Destroying the deep graph must not recurse either (y goes out of scope).
  y = Var();
  Var z = x;
  for (int i = 0; i < kDepth; ++i) z = mul_scalar(z, 1.0);
  z = Var();  // destroyed here without a backward
  SUCCEED();
}

TEST(AutogradTest, SecondBackwardThroughFreedGraphNamesTheOp) {
  Var x = Leaf({1.0, 2.0});
  Var loss = sum(tanh(x));
  backward(loss);
  try {
    backward(loss);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("already freed"), std::string::npos) << message;
    EXPECT_NE(message.find("retain_graph"), std::string::npos) << message;
  }
}

TEST(AutogradTest, RetainGraphAllowsASecondBackward) {
  Var x = Leaf({0.3, -0.1});
  Var loss = sum(tanh(x));
  backward(loss, Var(), {.retain_graph = true});
  backward(loss);
  for (int i = 0; i < 2; ++i) {
    const double t = std::tanh(x.value().at(i));
    EXPECT_NEAR(x.grad().value().at(i), 2 * (1 - t * t), 1e-12);
  }
}

TEST(AutogradTest, NoGradRecordsNothing) {
  Var x = Leaf({1.0, 2.0});
  Var y;
  {
    NoGrad no_grad;
    y = exp(mul(x, x));
  }
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(y.is_leaf());
  EXPECT_EQ(CountGraphNodes({y}), 0);
  EXPECT_TRUE(GradModeEnabled());
}

TEST(AutogradTest, DetachCutsTheGraph) {
  Var x = Leaf({2.0});
  Var d = mul(x, x).detach();
  Var loss = sum(mul(d, x));  // d is a constant 4: d/dx = 4
  backward(loss);
  EXPECT_DOUBLE_EQ(x.grad().item(), 4.0);
}

TEST(AutogradTest, GradReturnsGradientsWithoutTouchingLeafAccumulators) {
  Var x = Leaf({1.0, 3.0});
  Var y = Leaf({2.0, 5.0});
  Var loss = sum(mul(x, y));
  VarList g = grad({loss}, {x});
  ASSERT_TRUE(g[0].defined());
  EXPECT_DOUBLE_EQ(g[0].value().at(1), 5.0);
  EXPECT_FALSE(x.has_grad());
  EXPECT_FALSE(y.has_grad());
}

TEST(AutogradTest, GradOfAnUnusedInputIsUndefined) {
  Var x = Leaf({1.0});
  Var unused = Leaf({1.0});
  VarList g = grad({sum(exp(x))}, {x, unused});
  EXPECT_TRUE(g[0].defined());
  EXPECT_FALSE(g[1].defined());
}

TEST(AutogradTest, CreateGraphGivesHessianVectorProducts) {
  // f(x) = sum(x^3): grad = 3x^2, Hessian = diag(6x). H v = 6 x v.
  Var x = Leaf({1.0, -2.0, 0.5});
  Var f = sum(mul(mul(x, x), x));
  VarList g = grad({f}, {x}, {}, {.create_graph = true});
  ASSERT_TRUE(g[0].requires_grad());
  Var v = Leaf({0.3, 1.0, -2.0}, false);
  VarList hv = grad({sum(mul(g[0], v))}, {x});
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(hv[0].value().at(i), 6 * x.value().at(i) * v.value().at(i), 1e-12);
  }
}

TEST(AutogradTest, GradientOfAGradientNorm) {
  // f = sum(tanh(w * x)); ||df/dx||^2 differentiated w.r.t. w.
  Var x = Leaf({0.2, -0.4}, false);
  Var w = Leaf({1.3});
  auto penalty = [&](const Var& weight) {
    Var xl(x.value(), true);
    Var f = sum(tanh(mul(weight, xl)));
    VarList g = grad({f}, {xl}, {}, {.create_graph = true});
    return sum(mul(g[0], g[0]));
  };
  Var p = penalty(w);
  backward(p);
  // d/dw sum_i (w (1 - tanh^2(w x_i)))^2 by central differences.
  const double h = 1e-6;
  auto value = [&](double wv) {
    double s = 0;
    for (int i = 0; i < 2; ++i) {
      const double t = std::tanh(wv * x.value().at(i));
      s += std::pow(wv * (1 - t * t), 2);
    }
    return s;
  };
  const double numeric = (value(1.3 + h) - value(1.3 - h)) / (2 * h);
  EXPECT_NEAR(w.grad().item(), numeric, 1e-7);
}

TEST(AutogradTest, BackwardOnNonScalarWithoutGradOutputNamesOpAndShape) {
  Var x(Tensor::Ones(Shape{2, 3}, DType::kFloat64), true);
  Var y = exp(x);
  try {
    backward(y);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("exp"), std::string::npos) << message;
    EXPECT_NE(message.find("[2, 3]"), std::string::npos) << message;
  }
}

TEST(AutogradTest, GradOutputOfWrongShapeIsRejected) {
  Var x(Tensor::Ones(Shape{2, 3}, DType::kFloat64), true);
  Var y = exp(x);
  Var bad(Tensor::Ones(Shape{3, 2}, DType::kFloat64));
  EXPECT_THROW(grad({y}, {x}, {bad}), Error);
}

TEST(AutogradTest, NonFiniteValuesPropagateWithoutCrashing) {
  Var x = Leaf({-1.0, 0.0, 4.0});
  Var y = log(x);  // NaN, -inf, finite
  EXPECT_TRUE(std::isnan(y.value().at(0)));
  EXPECT_TRUE(std::isinf(y.value().at(1)));
  EXPECT_TRUE(HasNonFinite(y.value()));
  backward(sum(y));
  EXPECT_TRUE(HasNonFinite(x.grad().value()));
  EXPECT_DOUBLE_EQ(x.grad().value().at(2), 0.25);
}

TEST(AutogradTest, GradientsAreBitwiseIdenticalAcrossRunsWithTwoThreads) {
  ScopedNumThreads threads(2);
  auto run = [] {
    Rng rng(11);
    Var a(RandomNormal(Shape{8, 64, 64}, 0, 1, DType::kFloat32, rng), true);
    Var b(RandomNormal(Shape{8, 64, 64}, 0, 1, DType::kFloat32, rng), true);
    Var loss = sum(softmax(matmul(a, b, false, true)));
    backward(mean(mul(matmul(a, b), tanh(a))));
    return std::make_pair(a.grad().value().ToVector(), b.grad().value().ToVector());
  };
  const auto first = run();
  const auto second = run();
  EXPECT_EQ(first.first, second.first);
  EXPECT_EQ(first.second, second.second);
}

// Grad mode is per thread (a data-parallel step records on one thread while
// another runs a backward pass with the tape off), and ParallelFor's tasks
// run with the caller's mode.
TEST(GradModeTest, IsPerThreadAndParallelForTasksTakeTheCallers) {
  ScopedNumThreads threads(2);
  NoGrad no_grad;
  ASSERT_FALSE(GradModeEnabled());
  bool other_thread = false;
  std::thread([&] { other_thread = GradModeEnabled(); }).join();
  EXPECT_TRUE(other_thread);  // a new thread starts with the tape on

  // Enough chunks of enough work that both threads take some.
  for (bool mode : {false, true}) {
    GradModeGuard guard(mode);
    std::atomic<int> seen_on{0}, seen_off{0};
    ParallelFor(0, 64, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        (GradModeEnabled() ? seen_on : seen_off)++;
        volatile double sink = 0;
        for (int k = 0; k < 20000; ++k) sink = sink + std::sqrt(static_cast<double>(k));
      }
    });
    EXPECT_EQ(seen_on.load(), mode ? 64 : 0) << "caller's mode " << mode;
    EXPECT_EQ(seen_off.load(), mode ? 0 : 64) << "caller's mode " << mode;
  }
}

}  // namespace
}  // namespace stillpoint::autograd_test
