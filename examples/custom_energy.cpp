// An energy attention layer written as its energy only: solved, gradient-checked and trained.
#include <iostream>
#include "framework/gradcheck.h"
#include "framework/ops.h"
#include "layers/implicit_layer.h"
#include "training/optimizer.h"
namespace sp = stillpoint;
// What the energy reads besides the state: keys K [B, S, d], one set per sample.
struct LseContext {
  sp::Var keys;
  static const sp::ContextFields<LseContext>& Fields() {
    static const auto fields =
        sp::ContextFields<LseContext>("LseContext").PerSample("keys", &LseContext::keys);
    return fields;
  }
};
// E(z) = |z|^2 / 2 - lse(beta K z) / beta per sample, beta learnable; z [B, d].
struct LseEnergy : sp::EnergyLayer<LseContext> {
  LseEnergy() { set_gradient_step(1.0); }  // z - 1 grad E = K^T softmax(beta K z): the CCCP step
  sp::Var beta = RegisterParameter("beta", sp::Tensor::Full({1}, 2.0, sp::DType::kFloat64));
  sp::Var Energy(const sp::Var& z, const LseContext& ctx) const override {
    sp::Var scores = sp::sum(ctx.keys * sp::reshape(z, {z.dim(0), 1, z.dim(1)}), 2);
    return sp::sum(sp::square(z), 1) * 0.5 - sp::logsumexp(scores * beta) / beta;
  }
};
int main() {  // exit 1 unless the implicit gradient checks out and training lowers the loss
  sp::Rng rng(0);
  sp::Var keys(sp::RandomNormal({4, 5, 3}, 0.0, 0.5, sp::DType::kFloat64, rng), true);
  auto layer = std::make_shared<LseEnergy>();
  sp::Implicit solved(layer, {.forward = {.relative_tolerance = 1e-12},
                              .backward = {.tolerance = 1e-12}});
  auto solve = [&](const sp::VarList& in) {  // in = {keys}; the state starts at z0 = 0
    return solved.Forward(LseContext{.keys = in[0]},
                          sp::Var(sp::Tensor::Zeros({4, 3}, sp::DType::kFloat64)));
  };
  auto check = sp::CheckGradients(solve, {keys}, {.step = 1e-5, .relative_tolerance = 1e-5});
  auto opt = sp::Optimizer::Create({.learning_rate = .05}, {{"beta", layer->beta}, {"keys", keys}});
  auto loss = [&] { return sp::mean(sp::square(solve({keys}) - 0.3)); };  // pull z* towards 0.3
  const double first = loss().item();
  for (int step = 0; step < 30; ++step) {
    opt->ZeroGrad();
    sp::backward(loss());
    opt->Step();
  }
  std::cout << check << "\nloss " << first << " -> " << loss().item() << "\n";
  return check && loss().item() < first ? 0 : 1;
}
