// SolveImplicit checks its inputs and hands them to the function of the
// backward mode (one per line of solvers/implicit_solve/mode_list.h, in
// solvers/implicit_solve/: unrolled.cc, phantom.cc, ift.cc for kIft and kJfb; what
// they share is in common.cc).
#include "solvers/implicit_solve.h"

#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "framework/check.h"
#include "solvers/implicit_solve/modes.h"

namespace stillpoint {

bool ImplicitOptions::IsValid(std::string* error) const {
  std::string inner;
  if (!forward.IsValid(&inner)) {
    if (error != nullptr) *error = "ImplicitOptions.forward: " + inner;
    return false;
  }
  if (!backward.IsValid(&inner)) {
    if (error != nullptr) *error = "ImplicitOptions.backward: " + inner;
    return false;
  }
  if (sampled_iterates < 0) {
    if (error != nullptr) {
      *error = "ImplicitOptions: sampled_iterates = " + std::to_string(sampled_iterates) +
               " must be >= 0";
    }
    return false;
  }
  return true;
}

ImplicitResult SolveImplicit(const CellFn& f,
                             const Tensor& z0,
                             const ImplicitOptions& options,
                             const CellEnergyFn& energy,
                             const VarList& explicit_inputs,
                             const std::shared_ptr<AdjointWarmStart>& warm_start) {
  std::string error;
  SP_CHECK(options.IsValid(&error), "SolveImplicit: ", error);
  SP_CHECK(!options.backward.warm_start || warm_start != nullptr,
           "SolveImplicit: backward.warm_start is set but the call site gave no "
           "AdjointWarmStart to keep its previous adjoint solution in");
  SP_CHECK(static_cast<bool>(f), "SolveImplicit: the cell is empty");
  SP_CHECK(z0.defined() && z0.rank() >= 1 && z0.dim(0) >= 1,
           "SolveImplicit: z0 must be [B, ...] with B >= 1, got ",
           z0.defined() ? z0.shape().ToString() : std::string("an empty tensor"));
  const BackwardOptions& backward = options.backward;
  const int64_t batch = z0.dim(0);
  std::vector<int64_t> all_ids(batch);
  std::iota(all_ids.begin(), all_ids.end(), 0);
  const implicit::ModeInputs in{f,
                                z0,
                                options,
                                energy,
                                explicit_inputs,
                                warm_start,
                                z0.shape(),
                                batch,
                                z0.numel() / batch,
                                std::move(all_ids),
                                GradModeEnabled()};
  // Reject a dense adjoint that cannot run before spending a forward solve.
  SP_CHECK(backward.mode != BackwardMode::kIft || backward.solver != AdjointSolverType::kDense ||
               in.n <= backward.dense_max_state_size,
           "SolveImplicit: the dense adjoint solver builds an n x n matrix per sample; the state "
           "size n = ",
           in.n, " exceeds backward.dense_max_state_size = ", backward.dense_max_state_size);

  // One case per line of solvers/implicit_solve/mode_list.h.
  switch (backward.mode) {
#define SP_SOLVE_BACKWARD_MODE(value, name, function, summary) \
  case BackwardMode::value:                                    \
    return implicit::function(in);
    SP_BACKWARD_MODES(SP_SOLVE_BACKWARD_MODE)
#undef SP_SOLVE_BACKWARD_MODE
  }
  SP_CHECK(false, "SolveImplicit: unknown backward mode ", static_cast<int>(backward.mode));
  return {};
}

}  // namespace stillpoint
