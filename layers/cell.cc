#include "layers/cell.h"

namespace stillpoint {

Var Cell::ForwardStep(const Var&, const Var&, const KeyValueCache&, KeyValueCache*) const {
  std::string why;
  SupportsStep(&why);
  throw Error("Cell: no incremental step: " + why);
}

const OptionFields<CellOptions>& CellOptions::Fields() {
  using O = CellOptions;
  static const auto* fields =
      &(new OptionFields<O>)
           ->String("attention", &O::attention,
                    "The cell's attention sublayer: softmax, or a registered energy attention "
                    "(built-in: " + BuiltinEnergyBlockList() + ") read at the "
                    "fixed point of its energy, solved by model.attention_solver.* (nested in the "
                    "outer solve of an implicit model); energy kind: the block (instead of "
                    "model.energy.layer)")
           .Int("heads", &O::heads, 1, 1024,
                "Attention heads of the cell or of the energy block (dim must be a multiple)")
           .Int("hidden", &O::hidden, 1, 1 << 20,
                "Hidden width of the feed-forward block (the cell's, or the energy model's FFN)")
           .Double("dropout", &O::dropout, 0.0, 0.99,
                   "Dropout inside the cell (masks frozen per solve)")
           .Double("ln_eps", &O::ln_eps, 0.0, 1.0, "Epsilon of the layer norms")
           .Int("dim", &O::dim, 1, 1 << 16, "Width of the state (the model dimension d)")
           .NotInConfig()
           .Bool("causal", &O::causal, "Autoregressive attention masking")
           .NotInConfig()
           .Bool("attention_solver.warm_start", &O::attention_warm_start,
                 "Energy attention in an implicit model: each inner solve of an outer solve "
                 "starts from the previous evaluation's inner solution instead of the block's "
                 "initial state (the first evaluation of an outer solve, and evaluations outside "
                 "one, start as without it), and each inner adjoint solve of an outer adjoint "
                 "solve from the previous one's solution (a start that misses the tolerance and "
                 "was worse than the start without it is solved again from that one). The inner "
                 "solution and the gradient "
                 "are unchanged up to the inner tolerances when the inner solves converge")
           .NotInConfig();
  return *fields;
}

bool CellOptions::IsValid(std::string* error) const {
  const std::string problem = Fields().Check(*this);
  if (!problem.empty() && error != nullptr) *error = "CellOptions: " + problem;
  return problem.empty();
}

std::string CellOptions::ToString() const { return Fields().Describe(*this) + "\n"; }

}  // namespace stillpoint
