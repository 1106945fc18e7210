// Uses the installed headers and library: y = sum(x * x + 3 x) has gradient
// 2 x + 3. Exits non-zero if the gradient is wrong.
#include <cmath>
#include <iostream>

#include "framework/autograd.h"
#include "framework/ops.h"
#include "framework/tensor.h"

int main() {
  namespace sp = stillpoint;
  const sp::Tensor values =
      sp::Tensor::FromVector({2, 2}, {0.5, -1.0, 2.0, 0.0}, sp::DType::kFloat64);
  sp::Var x(values, /*requires_grad=*/true);
  sp::Var y = sp::sum(sp::add(sp::mul(x, x), sp::mul_scalar(x, 3.0)));
  sp::backward(y);

  int wrong = 0;
  for (int64_t i = 0; i < values.numel(); ++i) {
    const double expected = 2.0 * values.at(i) + 3.0;
    if (std::abs(x.grad().value().at(i) - expected) > 1e-12) ++wrong;
  }
  std::cout << "consumer: y = " << y.item() << ", gradient " << (wrong ? "WRONG" : "correct")
            << std::endl;
  return wrong == 0 ? 0 : 1;
}
