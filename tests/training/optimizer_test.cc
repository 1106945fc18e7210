#include "training/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "framework/ops.h"
#include "framework/parallel.h"
#include "training/schedule.h"

namespace stillpoint::optimizer_test {
namespace {

NamedVars OneParameter(double value, double gradient, const std::string& name = "w") {
  Var w(Tensor::FromVector(Shape{1}, {value}, DType::kFloat64), true);
  w.set_grad(Var(Tensor::FromVector(Shape{1}, {gradient}, DType::kFloat64)));
  return {{name, w}};
}

TEST(OptimizerTest, AdamWMatchesTheFormulaOverThreeSteps) {
  OptimizerOptions options;
  options.type = "adamw";
  options.learning_rate = 0.1;
  options.weight_decay = 0.01;
  NamedVars params = OneParameter(1.0, 0.5);
  auto optimizer = Optimizer::Create(options, params);
  double w = 1.0, m = 0, v = 0;
  const double grads[3] = {0.5, -0.25, 1.0};
  for (int t = 1; t <= 3; ++t) {
    params[0].second.set_grad(Var(Tensor::FromVector(Shape{1}, {grads[t - 1]}, DType::kFloat64)));
    optimizer->Step();
    const double g = grads[t - 1];
    w -= 0.1 * 0.01 * w;
    m = 0.9 * m + 0.1 * g;
    v = 0.999 * v + 0.001 * g * g;
    const double mhat = m / (1 - std::pow(0.9, t)), vhat = v / (1 - std::pow(0.999, t));
    w -= 0.1 * mhat / (std::sqrt(vhat) + 1e-8);
    EXPECT_NEAR(params[0].second.value().at(0), w, 1e-12) << "step " << t;
  }
}

TEST(OptimizerTest, SgdWithNesterovMomentumMatchesTheFormula) {
  OptimizerOptions options;
  options.type = "sgd";
  options.learning_rate = 0.5;
  options.momentum = 0.9;
  options.nesterov = true;
  options.weight_decay = 0;
  NamedVars params = OneParameter(2.0, 1.0);
  auto optimizer = Optimizer::Create(options, params);
  optimizer->Step();  // v = 1, d = 1 + 0.9 = 1.9
  EXPECT_NEAR(params[0].second.value().at(0), 2.0 - 0.5 * 1.9, 1e-12);
  optimizer->Step();  // v = 1.9, d = 1 + 0.9 * 1.9 = 2.71
  EXPECT_NEAR(params[0].second.value().at(0), 2.0 - 0.95 - 0.5 * 2.71, 1e-12);
}

TEST(OptimizerTest, BiasesAndGainsAreExcludedFromWeightDecay) {
  OptimizerOptions options;
  options.type = "sgd";
  options.learning_rate = 1.0;
  options.weight_decay = 0.5;
  NamedVars params = OneParameter(1.0, 0.0, "layer.weight");
  NamedVars bias = OneParameter(1.0, 0.0, "layer.bias");
  params.push_back(bias[0]);
  auto optimizer = Optimizer::Create(options, params);
  optimizer->Step();
  EXPECT_DOUBLE_EQ(params[0].second.value().at(0), 0.5);  // decayed
  EXPECT_DOUBLE_EQ(params[1].second.value().at(0), 1.0);  // excluded
}

TEST(OptimizerTest, ParametersWithoutGradientsAreLeftAlone) {
  OptimizerOptions options;
  NamedVars params = OneParameter(3.0, 1.0);
  params[0].second.zero_grad();
  auto optimizer = Optimizer::Create(options, params);
  optimizer->Step();
  EXPECT_DOUBLE_EQ(params[0].second.value().at(0), 3.0);
}

TEST(OptimizerTest, StateRoundTripContinuesIdentically) {
  OptimizerOptions options;
  options.learning_rate = 0.05;
  auto run = [&](bool reload) {
    NamedVars params = OneParameter(1.0, 0.3);
    auto optimizer = Optimizer::Create(options, params);
    optimizer->Step();
    if (reload) {
      NamedTensors state = optimizer->SaveState();
      for (auto& entry : state) entry.second = entry.second.Clone();
      auto fresh = Optimizer::Create(options, params);
      fresh->LoadState(state);
      optimizer = std::move(fresh);
    }
    optimizer->Step();
    return params[0].second.value().at(0);
  };
  EXPECT_EQ(run(false), run(true));
}

TEST(OptimizerTest, LoadStateRejectsMissingOrMisshapenEntries) {
  OptimizerOptions options;
  NamedVars params = OneParameter(1.0, 0.3);
  auto optimizer = Optimizer::Create(options, params);
  NamedTensors state = optimizer->SaveState();
  state[1].second = Tensor::Zeros(Shape{2}, DType::kFloat64);
  EXPECT_THROW(optimizer->LoadState(state), Error);
  state.erase(state.begin() + 1);
  EXPECT_THROW(optimizer->LoadState(state), Error);
}

TEST(OptimizerTest, InvalidOptionsAreRejectedWithAReason) {
  OptimizerOptions options;
  options.beta1 = 1.0;
  std::string error;
  EXPECT_FALSE(options.IsValid(&error));
  EXPECT_NE(error.find("beta1"), std::string::npos);
  EXPECT_THROW(Optimizer::Create(options, {}), Error);
  options = OptimizerOptions{};
  options.type = "lion";
  EXPECT_FALSE(options.IsValid(&error));
  EXPECT_NE(error.find("'lion' is not a registered optimizer"), std::string::npos) << error;
}

// A new optimizer is a subclass registered under its name; Create then
// builds it, and the registry lists it.
class SignDescent : public Optimizer {
 public:
  SignDescent(const OptimizerOptions& options, const NamedVars& parameters)
      : Optimizer(options, parameters) {}

 protected:
  void UpdateSegment(Slot& slot, const Tensor& grad, int64_t begin, int64_t end) override {
    for (int64_t i = begin; i < end; ++i) {
      const double g = grad.at(i);
      slot.parameter.mutable_value().set(i, slot.parameter.value().at(i) -
                                                options_.learning_rate * ((g > 0) - (g < 0)));
    }
  }
};

TEST(OptimizerRegistryTest, ARegisteredOptimizerIsCreatedByName) {
  EXPECT_EQ(OptimizerRegistry().Names(), (std::vector<std::string>{"adam", "adamw", "sgd"}));
  OptimizerRegistry().Register(
      "test_sign_descent",
      [](const OptimizerOptions& o, const NamedVars& p) {
        return std::make_unique<SignDescent>(o, p);
      },
      "", /*replace=*/true);
  Var w(Tensor::FromVector(Shape{3}, {1.0, 2.0, 3.0}, DType::kFloat64), true);
  OptimizerOptions options;
  options.type = "test_sign_descent";
  options.learning_rate = 0.5;
  auto optimizer = Optimizer::Create(options, {{"w", w}});
  w.set_grad(Var(Tensor::FromVector(Shape{3}, {-2.0, 0.0, 4.0}, DType::kFloat64)));
  optimizer->Step();
  EXPECT_EQ(w.value().at(0), 1.5);
  EXPECT_EQ(w.value().at(1), 2.0);
  EXPECT_EQ(w.value().at(2), 2.5);
}

TEST(OptimizerTest, UpdateIsIdenticalWithOneAndTwoThreads) {
  auto run = [](int threads) {
    ScopedNumThreads scoped(threads);
    Tensor w = Tensor::Zeros(Shape{20000}, DType::kFloat32);
    Tensor g(Shape{20000}, DType::kFloat32);
    for (int64_t i = 0; i < g.numel(); ++i) g.set(i, std::sin(0.01 * i));
    Var param(w, true);
    param.set_grad(Var(g));
    auto optimizer = Optimizer::Create(OptimizerOptions{}, {{"w", param}});
    for (int k = 0; k < 3; ++k) optimizer->Step();
    return param.value().ToVector();
  };
  EXPECT_EQ(run(1), run(2));
}

// The AdamW update of one float32 element as optimizer.cc writes it (the
// same operations in the same order), run here one element at a time.
struct ScalarAdamW {
  OptimizerOptions options;
  void Step(int t, bool decay, float g, float& w, float& m, float& v) const {
    const double correction1 = 1.0 - std::pow(options.beta1, t);
    const double correction2 = 1.0 - std::pow(options.beta2, t);
    const float b1 = static_cast<float>(options.beta1), b2 = static_cast<float>(options.beta2);
    const float wd = decay ? static_cast<float>(options.weight_decay) : 0.0f;
    const float lr = static_cast<float>(options.learning_rate);
    const float step = static_cast<float>(options.learning_rate / correction1);
    const float inv_sqrt_c2 = static_cast<float>(1.0 / std::sqrt(correction2));
    const float eps = static_cast<float>(options.epsilon);
    w -= lr * wd * w;
    m = b1 * m + (1.0f - b1) * g;
    v = b2 * v + (1.0f - b2) * g * g;
    w -= step * m / (std::sqrt(v) * inv_sqrt_c2 + eps);
  }
};

// Parameters of very different sizes (the update splits their flat range
// across tasks) give exactly the per-element result, with 1 or 2 threads.
TEST(OptimizerTest, AdamWMatchesTheScalarUpdateBitwiseForAnySplit) {
  const std::vector<int64_t> sizes = {3, 64, 4101, 1, 9000, 700};
  // Every other parameter is a ".bias": no weight decay.
  const std::vector<std::string> names = {"a.weight", "a.bias",   "b.weight",
                                          "b.bias",   "c.weight", "c.bias"};
  auto gradient = [](std::size_t p, int64_t i, int t) {
    return static_cast<float>(std::sin(0.37 * i + p + 0.5 * t) * (1 + p));
  };
  OptimizerOptions options;
  options.learning_rate = 0.01;
  auto run = [&](int threads) {
    ScopedNumThreads scoped(threads);
    NamedVars params;
    for (std::size_t p = 0; p < sizes.size(); ++p) {
      Tensor w(Shape{sizes[p]}, DType::kFloat32);
      for (int64_t i = 0; i < sizes[p]; ++i) w.set(i, std::cos(0.1 * i + p));
      params.emplace_back(names[p], Var(w, true));
    }
    auto optimizer = Optimizer::Create(options, params);
    for (int t = 1; t <= 3; ++t) {
      for (std::size_t p = 0; p < sizes.size(); ++p) {
        Tensor g(Shape{sizes[p]}, DType::kFloat32);
        for (int64_t i = 0; i < sizes[p]; ++i) g.set(i, gradient(p, i, t));
        params[p].second.set_grad(Var(g));
      }
      optimizer->Step();
    }
    std::vector<std::vector<double>> values;
    for (const auto& [name, w] : params) values.push_back(w.value().ToVector());
    return values;
  };
  std::vector<std::vector<double>> expected;
  const ScalarAdamW reference{options};
  for (std::size_t p = 0; p < sizes.size(); ++p) {
    std::vector<double> values;
    for (int64_t i = 0; i < sizes[p]; ++i) {
      float w = static_cast<float>(std::cos(0.1 * i + p)), m = 0.0f, v = 0.0f;
      for (int t = 1; t <= 3; ++t) reference.Step(t, p % 2 == 0, gradient(p, i, t), w, m, v);
      values.push_back(w);
    }
    expected.push_back(values);
  }
  EXPECT_EQ(run(1), expected);
  EXPECT_EQ(run(2), expected);
}

TEST(ClipGradNormTest, ScalesToTheMaximumNormAndReportsTheOriginal) {
  Var a(Tensor::FromVector(Shape{2}, {0, 0}, DType::kFloat64), true);
  Var b(Tensor::FromVector(Shape{1}, {0}, DType::kFloat64), true);
  a.set_grad(Var(Tensor::FromVector(Shape{2}, {3, 0}, DType::kFloat64)));
  b.set_grad(Var(Tensor::FromVector(Shape{1}, {4}, DType::kFloat64)));
  const double norm = ClipGradNorm({a, b}, 1.0);
  EXPECT_DOUBLE_EQ(norm, 5.0);
  EXPECT_NEAR(GradNorm({a, b}), 1.0, 1e-12);
  EXPECT_NEAR(a.grad().value().at(0), 0.6, 1e-12);
}

TEST(ClipGradNormTest, SharedGradientTensorsAreScaledOnce) {
  Var a(Tensor::FromVector(Shape{1}, {0}, DType::kFloat64), true);
  Var b(Tensor::FromVector(Shape{1}, {0}, DType::kFloat64), true);
  Var shared(Tensor::FromVector(Shape{1}, {2}, DType::kFloat64));
  a.set_grad(shared);
  b.set_grad(shared);
  ClipGradNorm({a, b}, 1.0);  // norm sqrt(8): each becomes 2 / sqrt(8)
  EXPECT_NEAR(a.grad().value().at(0), 2 / std::sqrt(8.0), 1e-12);
  EXPECT_NEAR(b.grad().value().at(0), 2 / std::sqrt(8.0), 1e-12);
}

TEST(ScheduleTest, WarmupThenCosineDecay) {
  ScheduleOptions options;
  options.type = ScheduleType::kCosine;
  options.warmup_steps = 10;
  options.total_steps = 110;
  options.min_ratio = 0.1;
  EXPECT_NEAR(LearningRateAt(options, 1.0, 0), 0.1, 1e-12);
  EXPECT_NEAR(LearningRateAt(options, 1.0, 4), 0.5, 1e-12);
  EXPECT_NEAR(LearningRateAt(options, 1.0, 10), 1.0, 1e-12);
  EXPECT_NEAR(LearningRateAt(options, 1.0, 60), 0.55, 1e-12);
  EXPECT_NEAR(LearningRateAt(options, 1.0, 110), 0.1, 1e-12);
  EXPECT_NEAR(LearningRateAt(options, 1.0, 500), 0.1, 1e-12);
}

TEST(ScheduleTest, StepAndConstant) {
  ScheduleOptions options;
  options.type = ScheduleType::kStep;
  options.warmup_steps = 0;  // the step decay alone (the default warms up for 20 steps)
  options.step_size = 10;
  options.gamma = 0.5;
  EXPECT_DOUBLE_EQ(LearningRateAt(options, 2.0, 9), 2.0);
  EXPECT_DOUBLE_EQ(LearningRateAt(options, 2.0, 10), 1.0);
  EXPECT_DOUBLE_EQ(LearningRateAt(options, 2.0, 25), 0.5);
  options.type = ScheduleType::kConstant;
  EXPECT_DOUBLE_EQ(LearningRateAt(options, 2.0, 1000), 2.0);
  options.gamma = 0;
  std::string error;
  EXPECT_FALSE(options.IsValid(&error));
  EXPECT_NE(error.find("gamma"), std::string::npos);
}

}  // namespace
}  // namespace stillpoint::optimizer_test
