// EnergyAttention: an energy block (energy_block.h) as the attention
// sublayer of a transformer cell: its output is the attention read out at
// the fixed point of the block's energy, found by an inner solve with its
// own solver options and differentiated by the implicit function theorem.
//
//   x [k, T, d] -> problem = block.Prepare(x)
//               -> v* = Implicit(block.layer()).Forward(problem->energy,
//                                                      problem->initial_state)
//                                                   (inner solve)
//               -> block.Output(v*, *problem)       [k, T, d]
//
// The result is the attention's contribution without the skip connection,
// like MultiHeadAttention's output, so a cell adds it to its residual stream
// in the same place. Inside an implicit model the inner solve nests in the
// outer one: while the outer solver iterates (tape off) each evaluation of
// the cell runs a whole inner solve; at the outer fixed point the recorded
// evaluation records one inner implicit node, and every vector-Jacobian
// product of the outer adjoint passes through it (an inner adjoint solve).
//
// Parameters: "block.*" (the block's norm, projections and precisions).
// The inner Implicit is not a child: its only parameters are the block's.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "framework/autograd.h"
#include "framework/module.h"
#include "framework/option_fields.h"
#include "framework/random.h"
#include "layers/energy_block.h"
#include "layers/implicit_layer.h"
#include "solvers/regularizers.h"

namespace stillpoint {

// The inner solve's defaults: Anderson, at most 16 iterations to a relative
// residual of 1e-4; the adjoint by fixed-point iteration, at most 16
// iterations to 1e-5. The block maps of the catalogue contract at their
// default operating points, so both converge well inside these budgets.
ImplicitOptions DefaultAttentionSolverOptions();

struct EnergyAttentionOptions {
  // The block (dim, heads, causal and dtype are the cell's).
  EnergyBlockOptions block;
  // The inner solve.
  ImplicitOptions solver = DefaultAttentionSolverOptions();
  // Warm starts inside an outer solve (model.attention_solver.warm_start):
  // - forward: the inner solve of each evaluation of an outer fixed-point
  //   solve starts from the inner solution of the previous evaluation of
  //   the same outer solve (same samples) instead of the block's initial
  //   state, which Prepare then need not compute
  //   (EnergyBlock::PrepareForWarmStart). This includes the evaluation the
  //   outer solve records at z*. The first evaluation of every outer solve
  //   and evaluations outside one (explicit and tied models, phantom and
  //   unrolled backward steps) start from the block's initial state.
  // - adjoint: every VJP of the outer adjoint solve passes through the
  //   inner implicit node and solves the inner adjoint once more; each of
  //   those solves starts from the previous one's solution of the same
  //   outer adjoint solve (ImplicitOptions::nested_adjoint_warm_start).
  // The inner solution, and so the gradient (the implicit function theorem
  // at it, whatever the start), is the same as without warm starts up to
  // the inner tolerances when the inner solves converge; an inner forward
  // solve stopped by its iteration budget can end elsewhere. Default on.
  bool warm_start = true;

  // The fields, declared once (framework/option_fields.h); not config keys.
  static const OptionFields<EnergyAttentionOptions>& Fields();
  // The block's options (EnergyBlockOptions::IsValid), the inner solve's
  // (ImplicitOptions::IsValid) and no warm start of the inner adjoint.
  bool IsValid(std::string* error) const;
  std::string ToString() const;
};

// What happened to the attention over one solve, averaged over samples,
// heads and queries (Diagnose).
struct AttentionDiagnostics {
  // Mean entropy (nats) and mean largest weight of the attention rows at
  // the first iterate (the block's initial state) and at the fixed point.
  double entropy_first = 0.0, entropy_fixed_point = 0.0;
  double max_weight_first = 0.0, max_weight_fixed_point = 0.0;
  // |v* - v0| / |v0| over the whole batch.
  double relative_move = 0.0;
  // Whether every sample's energy never rose along the solve (1e-6
  // relative slack for rounding).
  bool energy_monotone = true;
  // The inner solve's iterations and largest relative residual.
  int iterations = 0;
  double residual = 0.0;
  // The solve snapped the queries onto single keys: the mean largest weight
  // is above 0.9 at the fixed point and the solve raised it by more than
  // 0.3 over the first iterate. Sharp attention that the first iterate
  // already has (a learned routing, e.g. one key per query) is not a
  // collapse.
  bool collapsed = false;
  // The spectral radius of the Jacobian of the block's update map at the
  // solved state, largest over the samples (Arnoldi, as for the model's own
  // fixed point), and that sample's signed dominant eigenvalue: below 1
  // the inner solve's fixed-point iterations and adjoint contract there.
  double spectral_radius = std::numeric_limits<double>::quiet_NaN();
  double dominant_eigenvalue = std::numeric_limits<double>::quiet_NaN();
};

class EnergyAttention : public Module {
 public:
  // Throws stillpoint::Error when the options are not valid: the block's
  // with CreateEnergyBlock's message ("energy block '<layer>': ..."), the
  // inner solve's with "EnergyAttention: EnergyAttentionOptions: ...".
  EnergyAttention(const EnergyAttentionOptions& options, Rng& rng);

  std::string Name() const override;

  // x [k, T, d] -> [k, T, d] (see above). Row r of x belongs to sample
  // sample_ids[r] of the outer solve (empty: 0..k-1; Cell's convention),
  // which tells the warm start which inner solutions to start from.
  Var Forward(const Var& x, const std::vector<int64_t>& sample_ids = {}) const;

  // The diagnostics of the attention at x, off the tape (one extra solve
  // with the energy traced).
  AttentionDiagnostics Diagnose(const Var& x) const;

  // While on, every Forward keeps a copy of its input, so that diagnostics
  // can be taken where the model last evaluated the attention (in an
  // implicit model: the outer solve's last iterate). Off by default.
  // It keeps the inner solution of that Forward too (last_state), and the
  // input and solution of the slowest Forward since ForgetKeptInputs (a
  // solve with an unconverged sample counts as slower than any that
  // converged, then the most iterations): in an implicit model that is
  // often the first evaluation of the outer solve, at the zero state, far
  // from the inputs the last evaluation sees.
  void KeepInputs(bool keep) const { keep_inputs_ = keep; }
  void ForgetKeptInputs() const;
  // The last input kept and its inner solution (undefined before one was).
  const Tensor& last_input() const { return last_input_; }
  const Tensor& last_state() const { return last_state_; }

  // The spectral-radius penalty of the block's update map at the kept
  // solutions (KeepInputs): at the last one, plus at the slowest one when
  // that was another Forward. At each, the mean over samples of max(0,
  // rho_b - target)^2, rho_b the spectral radius of the map's Jacobian at
  // sample b's inner solution, along the dominant directions that
  // `estimate` finds with those held fixed (solvers/regularizers.h,
  // SpectralRadiusPenalty). Differentiable w.r.t. the block's parameters;
  // the kept inputs are constants. Below 1 the inner fixed-point iterations
  // and adjoint contract. Throws when no input was kept.
  Var SpectralRadiusPenalty(double target, const SpectralRadiusOptions& estimate) const;

  // What the inner solves of this attention did since construction (or the
  // last ResetInnerCounts): forward solves, their iterations, and how many
  // of them were warm-started; adjoint solves (one per backward pass
  // through an inner node, and in an implicit model one per VJP of the outer
  // adjoint), their VJPs, and how many of them were warm-started.
  struct InnerCounts {
    int64_t solves = 0;
    int64_t forward_iterations = 0;
    int64_t warm_starts = 0;
    int64_t adjoint_solves = 0;
    int64_t adjoint_vjps = 0;
    int64_t adjoint_warm_starts = 0;
  };
  const InnerCounts& inner_counts() const { return *inner_counts_; }
  void ResetInnerCounts() const { *inner_counts_ = {}; }

  const EnergyBlock& block() const { return *block_; }
  // The inner solve (its options can be changed between calls).
  Implicit& implicit() const { return *implicit_; }
  const EnergyAttentionOptions& options() const { return options_; }

 private:
  EnergyAttentionOptions options_;
  std::shared_ptr<EnergyBlock> block_;
  // Not a child (see above). Its summaries describe the last Forward.
  std::shared_ptr<Implicit> implicit_;
  // The inner start of an evaluation inside outer solve `solve` for `rows`
  // rows with ids sample_ids (see Forward): the kept solution's rows, or
  // undefined when none was kept for that solve or a row is missing.
  Tensor WarmState(uint64_t solve, const std::vector<int64_t>& sample_ids, int64_t rows) const;

  // Warm start (EnergyAttentionOptions::warm_start): the last inner
  // solution, the outer solve it belongs to (ForwardSolveScope id) and its
  // rows' sample ids. Runtime state, not part of the layer's function.
  mutable uint64_t warm_solve_ = 0;
  mutable Tensor warm_state_;
  mutable std::vector<int64_t> warm_ids_;
  // Diagnostic state, not part of the layer's function.
  // Shared with the inner solve's adjoint observer, which the graph keeps.
  std::shared_ptr<InnerCounts> inner_counts_ = std::make_shared<InnerCounts>();
  mutable bool keep_inputs_ = false;
  mutable Tensor last_input_, last_state_;
  // How slow a kept Forward was: (an unconverged sample, iterations).
  // slowest_*: the slowest kept Forward before the last one.
  mutable std::pair<bool, int> last_key_{false, -1}, slowest_key_{false, -1};
  mutable Tensor slowest_input_, slowest_state_;
  void Keep(const Tensor& input, const Tensor& state, const SolverSummary& solve) const;
};

// The diagnostics of any energy block at input x [B, T, d], its energy
// solved with `solver` (what EnergyAttention::Diagnose does; also used for
// the block of the energy model kind).
AttentionDiagnostics DiagnoseEnergyBlock(const EnergyBlock& block,
                                         const ImplicitOptions& solver,
                                         const Var& x);

// Every EnergyAttention inside module (depth first), with its dotted name.
std::vector<std::pair<std::string, const EnergyAttention*>> FindEnergyAttentions(
    const Module& module);

}  // namespace stillpoint
