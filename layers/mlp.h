// MLP: the transformer feed-forward block, Linear -> GELU -> Linear:
//   y = GELU(x W1 + b1) W2 + b2      (GELU in its tanh form)
//
// Shapes: x [..., dim] -> y [..., dim]; W1 [dim, hidden], W2 [hidden, dim].
// Parameters: "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias".
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "framework/autograd.h"
#include "framework/module.h"
#include "framework/random.h"
#include "layers/linear.h"

namespace stillpoint {

class MLP : public Module {
 public:
  MLP(int64_t dim, int64_t hidden, Rng& rng, const LinearOptions& options = {});

  std::string Name() const override;

  // x [..., dim] -> [..., dim].
  Var Forward(const Var& x) const;

  const std::shared_ptr<Linear>& fc1() const { return fc1_; }
  const std::shared_ptr<Linear>& fc2() const { return fc2_; }

 private:
  std::shared_ptr<Linear> fc1_;
  std::shared_ptr<Linear> fc2_;
};

}  // namespace stillpoint
