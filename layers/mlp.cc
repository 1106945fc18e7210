#include "layers/mlp.h"

#include <sstream>

#include "framework/ops.h"

namespace stillpoint {

MLP::MLP(int64_t dim, int64_t hidden, Rng& rng, const LinearOptions& options) {
  fc1_ = RegisterModule("fc1", std::make_shared<Linear>(dim, hidden, rng, options));
  fc2_ = RegisterModule("fc2", std::make_shared<Linear>(hidden, dim, rng, options));
}

std::string MLP::Name() const {
  std::ostringstream out;
  out << "MLP(" << fc1_->in_features() << " -> " << fc1_->out_features() << " -> "
      << fc2_->out_features() << ", gelu)";
  return out.str();
}

Var MLP::Forward(const Var& x) const { return fc1_->ForwardGeluThen(*fc2_, x); }

}  // namespace stillpoint
