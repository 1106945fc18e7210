// Gradient-check demo: differentiates a small float64 network by reverse-mode
// autodiff, once and twice, and compares both against central finite
// differences.
//
//   f(x, W, b) = sum over rows of <softmax(tanh(x W^T + b)), c>
//
// x: [4, 3] (a batch of 4 inputs), W: [5, 3], b: [5], c: [5] a fixed score per
// class. The sum is weighted by c because a plain sum of a softmax row is 1
// whatever the input, which would make every gradient zero and the check
// vacuous.
//
// Exit status: 0 when both checks pass, 1 when either fails.
#include <iostream>

#include "framework/gradcheck.h"
#include "framework/ops.h"
#include "framework/random.h"
#include "framework/tensor.h"

namespace sp = stillpoint;

int main() {
  const sp::DType f64 = sp::DType::kFloat64;
  sp::Rng rng(42);
  const sp::Var x(sp::RandomNormal({4, 3}, 0.0, 1.0, f64, rng));
  const sp::Var w(sp::RandomNormal({5, 3}, 0.0, 0.5, f64, rng));
  const sp::Var b(sp::RandomNormal({5}, 0.0, 0.1, f64, rng));
  const sp::Var scores =
      sp::constant(sp::Tensor::FromVector({5}, {1.0, -2.0, 0.5, 3.0, -1.0}, f64));

  const sp::VarFunction f = [&](const sp::VarList& in) {
    const sp::Var hidden = sp::tanh(sp::add(sp::matmul(in[0], in[1], false, true), in[2]));
    const sp::Var probabilities = sp::softmax(hidden);  // [4, 5], rows sum to 1
    return sp::sum(sp::mul(probabilities, scores));
  };

  const sp::Var value = f({x, w, b});
  std::cout << "f(x, W, b) = " << value.item() << "\n\n";

  const sp::GradCheckResult first = sp::CheckGradients(f, {x, w, b});
  std::cout << "first order (gradient vs finite differences):\n  " << first << "\n\n";

  const sp::GradCheckResult second = sp::CheckSecondOrderGradients(f, {x, w, b});
  std::cout << "second order (Hessian-vector products vs finite differences of the gradient):\n  "
            << second << "\n\n";

  const bool ok = first && second;
  std::cout << (ok ? "OK: both gradient checks passed" : "FAILED: a gradient check failed")
            << std::endl;
  return ok ? 0 : 1;
}
