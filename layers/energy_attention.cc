#include "layers/energy_attention.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>
#include <utility>

#include "framework/check.h"
#include "framework/ops.h"
#include "solvers/solve_scope.h"

namespace stillpoint {
namespace {

// AttentionDiagnostics::collapsed (see there).
constexpr double kCollapsedMaxWeight = 0.9;
constexpr double kCollapseRise = 0.3;

// Row statistics of attention weights [B, H, N, S]: mean entropy (nats) and
// mean largest weight over the rows. Masked keys (weight 0) add nothing.
void RowStatistics(const Tensor& weights, double* entropy, double* max_weight) {
  const std::vector<double> w = weights.ToVector();
  const int64_t keys = weights.dim(-1);
  const int64_t rows = keys > 0 ? static_cast<int64_t>(w.size()) / keys : 0;
  double entropy_sum = 0.0, max_sum = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    double h = 0.0, largest = 0.0;
    for (int64_t j = 0; j < keys; ++j) {
      const double p = w[r * keys + j];
      if (p > 0.0) h -= p * std::log(p);
      largest = std::max(largest, p);
    }
    entropy_sum += h;
    max_sum += largest;
  }
  *entropy = rows > 0 ? entropy_sum / static_cast<double>(rows) : 0.0;
  *max_weight = rows > 0 ? max_sum / static_cast<double>(rows) : 0.0;
}

double Norm(const Tensor& x) {
  double s = 0.0;
  for (double v : x.ToVector()) s += v * v;
  return std::sqrt(s);
}

void Collect(const Module& module,
             const std::string& prefix,
             std::vector<std::pair<std::string, const EnergyAttention*>>* found) {
  if (const auto* attention = dynamic_cast<const EnergyAttention*>(&module)) {
    found->emplace_back(prefix, attention);
  }
  for (const auto& [name, child] : module.children()) {
    Collect(*child, prefix.empty() ? name : prefix + "." + name, found);
  }
}

// What is wrong with the inner solve's options ("" if nothing): the part of
// EnergyAttentionOptions::IsValid that is not the block's.
std::string InnerSolveProblem(const ImplicitOptions& solver) {
  std::string nested;
  if (!solver.IsValid(&nested)) return "inner solver options: " + nested;
  if (solver.backward.warm_start) {
    return "the inner adjoint cannot be warm-started (one call site serves every evaluation of "
           "the cell)";
  }
  return "";
}

}  // namespace

ImplicitOptions DefaultAttentionSolverOptions() {
  ImplicitOptions options;
  options.forward.type = ForwardSolverType::kAnderson;
  options.forward.max_iterations = 16;
  options.forward.relative_tolerance = 1e-4;
  options.backward.mode = BackwardMode::kIft;
  options.backward.solver = AdjointSolverType::kFixedPoint;
  options.backward.max_iterations = 16;
  options.backward.tolerance = 1e-5;
  return options;
}

EnergyAttention::EnergyAttention(const EnergyAttentionOptions& options, Rng& rng)
    : options_(options) {
  // The block's options are checked once, by CreateEnergyBlock, which builds
  // it; the rest of EnergyAttentionOptions::IsValid here.
  block_ = RegisterModule("block", CreateEnergyBlock(options.block, rng));
  const std::string problem = InnerSolveProblem(options.solver);
  SP_CHECK(problem.empty(), "EnergyAttention: EnergyAttentionOptions: ", problem);
  ImplicitOptions inner = options.solver;
  inner.nested_adjoint_warm_start = options.warm_start;
  inner.adjoint_observer = [counts = inner_counts_](const AdjointSummary& summary) {
    ++counts->adjoint_solves;
    counts->adjoint_vjps += summary.vjp_evaluations;
    if (summary.warm_started) ++counts->adjoint_warm_starts;
  };
  implicit_ = std::make_shared<Implicit>(block_->layer(), inner);
}

std::string EnergyAttention::Name() const {
  std::ostringstream out;
  out << "EnergyAttention(" << options_.block.layer << ", "
      << stillpoint::ToString(options_.solver.forward.type) << " <= "
      << options_.solver.forward.max_iterations << ")";
  return out.str();
}

Var EnergyAttention::Forward(const Var& x, const std::vector<int64_t>& sample_ids) const {
  // Read before the inner solve opens its own scope.
  const uint64_t solve = options_.warm_start ? ForwardSolveScope::Current() : 0;
  const Tensor warm = solve != 0 ? WarmState(solve, sample_ids, x.dim(0)) : Tensor();
  // A warm-started solve needs no initial state (it can cost an attention).
  const EnergyBlockProblemPtr problem =
      warm.defined() ? block_->PrepareForWarmStart(x) : block_->Prepare(x);
  // The start carries no gradient either way (Implicit: z0 gets none).
  const Var state =
      implicit_->Forward(problem->energy, warm.defined() ? Var(warm) : problem->initial_state);
  ++inner_counts_->solves;
  inner_counts_->forward_iterations += implicit_->forward_summary().iterations;
  if (warm.defined()) ++inner_counts_->warm_starts;
  if (keep_inputs_) Keep(x.value(), state.value(), implicit_->forward_summary());
  if (solve != 0) {
    warm_solve_ = solve;
    warm_state_ = state.value().Clone();
    warm_ids_ = sample_ids;
    if (warm_ids_.empty()) {
      warm_ids_.resize(static_cast<size_t>(x.dim(0)));
      std::iota(warm_ids_.begin(), warm_ids_.end(), int64_t{0});
    }
  } else if (warm_state_.defined()) {
    warm_solve_ = 0;
    warm_state_ = Tensor();
    warm_ids_.clear();
  }
  return block_->Output(state, *problem);
}

Tensor EnergyAttention::WarmState(uint64_t solve,
                                  const std::vector<int64_t>& sample_ids,
                                  int64_t rows) const {
  // One outer solve evaluates the cell on rows of one batch, so the kept
  // state's trailing shape is the block's state shape for these rows too.
  if (solve != warm_solve_ || !warm_state_.defined()) return Tensor();
  if (sample_ids.empty() && rows == warm_state_.dim(0)) return warm_state_;
  std::vector<int64_t> dims = warm_state_.shape().dims();
  dims[0] = rows;
  const Shape state_shape(dims);
  // Both id lists increase (a solver drops converged samples, never adds
  // any), so one merge pass finds each current row among the kept ones.
  Tensor start(state_shape, warm_state_.dtype());
  size_t kept = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t id = sample_ids.empty() ? r : sample_ids[static_cast<size_t>(r)];
    while (kept < warm_ids_.size() && warm_ids_[kept] < id) ++kept;
    if (kept == warm_ids_.size() || warm_ids_[kept] != id) return Tensor();
    start.SliceRows(r, r + 1).CopyFrom(
        warm_state_.SliceRows(static_cast<int64_t>(kept), static_cast<int64_t>(kept) + 1));
  }
  return start;
}

void EnergyAttention::Keep(const Tensor& input,
                           const Tensor& state,
                           const SolverSummary& solve) const {
  // The last Forward so far becomes a candidate for the slowest.
  if (last_input_.defined() && last_key_ > slowest_key_) {
    slowest_key_ = last_key_;
    slowest_input_ = std::move(last_input_);
    slowest_state_ = std::move(last_state_);
  }
  last_key_ = {!solve.IsUsable(), solve.iterations};
  last_input_ = input.Clone();
  last_state_ = state.Clone();
}

void EnergyAttention::ForgetKeptInputs() const {
  last_input_ = last_state_ = slowest_input_ = slowest_state_ = Tensor();
  last_key_ = slowest_key_ = {false, -1};
}

Var EnergyAttention::SpectralRadiusPenalty(double target,
                                           const SpectralRadiusOptions& estimate) const {
  SP_CHECK(last_input_.defined() && last_state_.defined(), Name(),
           ": the spectral-radius penalty needs a kept input and solution (KeepInputs(true) "
           "before a Forward)");
  const auto at = [&](const Tensor& input, const Tensor& state) {
    // The context (what the update reads besides the state) recorded on the
    // block's parameters; the state and the input are constants.
    const EnergyBlockProblemPtr problem = block_->PrepareForWarmStart(Var(input));
    const CellFn update = MakeUpdateCellFor(problem->energy, state);
    const Tensor directions = EstimateSpectralRadius(update, state, estimate).directions;
    return stillpoint::SpectralRadiusPenalty(update, state, directions, target);
  };
  const Var last = at(last_input_, last_state_);
  if (!slowest_input_.defined() || !(slowest_key_ > last_key_)) return last;
  return add(last, at(slowest_input_, slowest_state_));
}

AttentionDiagnostics EnergyAttention::Diagnose(const Var& x) const {
  return DiagnoseEnergyBlock(*block_, options_.solver, x);
}

AttentionDiagnostics DiagnoseEnergyBlock(const EnergyBlock& block,
                                         const ImplicitOptions& solver,
                                         const Var& x) {
  NoGrad no_grad;
  const EnergyBlockProblemPtr prepared = block.Prepare(x);
  const EnergyBlockProblem& problem = *prepared;
  Implicit traced(block.layer(), solver, EnergyImplicitOptions{.trace_energy = true});
  const Var state = traced.Forward(problem.energy, problem.initial_state);

  AttentionDiagnostics d;
  const Var first = block.AttentionWeights(problem.initial_state, problem);
  const Var fixed = block.AttentionWeights(state, problem);
  if (first.defined() && fixed.defined()) {
    RowStatistics(first.value(), &d.entropy_first, &d.max_weight_first);
    RowStatistics(fixed.value(), &d.entropy_fixed_point, &d.max_weight_fixed_point);
  }
  const double start = Norm(problem.initial_state.value());
  d.relative_move = Norm(sub(state, problem.initial_state).value()) / std::max(start, 1e-30);
  for (const std::vector<double>& energies : traced.energy_trace()) {
    for (std::size_t t = 1; t < energies.size(); ++t) {
      const double slack = 1e-6 * std::max(1.0, std::abs(energies[t - 1]));
      if (energies[t] > energies[t - 1] + slack) d.energy_monotone = false;
    }
  }
  d.iterations = traced.forward_summary().iterations;
  d.residual = traced.forward_summary().MaxRelResidual();
  d.collapsed = d.max_weight_fixed_point > kCollapsedMaxWeight &&
                d.max_weight_fixed_point - d.max_weight_first > kCollapseRise;
  const SpectralRadiusResult radius =
      EstimateSpectralRadius(MakeUpdateCellFor(problem.energy, state.value()), state.value());
  d.spectral_radius = radius.max_radius;
  d.dominant_eigenvalue = radius.dominant_eigenvalue;
  return d;
}

std::vector<std::pair<std::string, const EnergyAttention*>> FindEnergyAttentions(
    const Module& module) {
  std::vector<std::pair<std::string, const EnergyAttention*>> found;
  Collect(module, "", &found);
  return found;
}

const OptionFields<EnergyAttentionOptions>& EnergyAttentionOptions::Fields() {
  using O = EnergyAttentionOptions;
  // solver is left out: ImplicitOptions declares no fields (IsValid checks
  // it with its own IsValid).
  static const auto* fields =
      &(new OptionFields<O>)
           ->Include("block.", &O::block, EnergyBlockOptions::Fields())
           .Bool("warm_start", &O::warm_start,
                 "Inside an outer solve's tape-off iterations, start each inner solve from the "
                 "previous evaluation's inner solution");
  return *fields;
}

bool EnergyAttentionOptions::IsValid(std::string* error) const {
  // The block's own IsValid covers its fields and their cross-field rules.
  std::string problem;
  std::string nested;
  if (!block.IsValid(&nested)) problem = "block: " + nested;
  if (problem.empty()) problem = InnerSolveProblem(solver);
  if (!problem.empty() && error != nullptr) *error = "EnergyAttentionOptions: " + problem;
  return problem.empty();
}

std::string EnergyAttentionOptions::ToString() const { return Fields().Describe(*this) + "\n"; }

}  // namespace stillpoint
