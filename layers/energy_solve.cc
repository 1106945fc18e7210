// The solve path of energy layers: SolveEnergyFixedPoint is the one
// fixed-point solve behind both EnergyLayer::Solve (kFixedPoint) and
// Implicit::Forward(ctx, z0); SolveEnergy adds the fixed-steps mode and its
// report.
#include <memory>
#include <utility>

#include "framework/ops.h"
#include "layers/energy_solve.h"

namespace stillpoint {
namespace {

std::vector<double> EnergiesOf(const BoundEnergy& energy, const Var& z) {
  NoGrad no_grad;
  return energy.SampleEnergies(Var(z.value())).value().ToVector();
}

// The states the solver evaluated since the last iteration callback, and the
// energies recorded from them (the iteration trace of SolveEnergyFixedPoint).
struct EnergyTraceRecorder {
  Tensor latest;            // [B, n]: the latest evaluated state of each sample
  std::vector<char> dirty;  // [B]: evaluated since the last callback
  std::vector<std::vector<double>> energies;

  void Record(const Tensor& z, const std::vector<int64_t>& ids) {
    const int64_t k = static_cast<int64_t>(ids.size());
    const Tensor rows = z.Reshape(Shape{k, latest.dim(1)});
    for (int64_t i = 0; i < k; ++i) {
      latest.SliceRows(ids[i], ids[i] + 1).CopyFrom(rows.SliceRows(i, i + 1));
      dirty[ids[i]] = 1;
    }
  }

  // Appends the energies of the dirty samples' latest states.
  void Flush(const BoundEnergy& energy, const Shape& shape) {
    std::vector<int64_t> ids;
    for (std::size_t b = 0; b < dirty.size(); ++b) {
      if (dirty[b]) ids.push_back(static_cast<int64_t>(b));
    }
    if (ids.empty()) return;
    NoGrad no_grad;
    std::vector<int64_t> dims = shape.dims();
    dims[0] = static_cast<int64_t>(ids.size());
    const Tensor rows = gather(Var(latest), 0, ids).value().Reshape(Shape(dims));
    const std::vector<double> values = EnergiesOf(*energy.Select(ids), Var(rows));
    for (std::size_t i = 0; i < ids.size(); ++i) {
      energies[ids[i]].push_back(values[i]);
      dirty[ids[i]] = 0;
    }
  }
};

void CheckInitialState(const EnergyLayerBase& layer, const Tensor& z0) {
  SP_CHECK(z0.defined() && z0.rank() >= 2, layer.Name(),
           ": the initial state must be [B, ...] with rank >= 2, got ",
           z0.defined() ? z0.shape().ToString() : std::string("undefined"));
}

}  // namespace

VarList ImplicitInputsOf(const BoundEnergy& energy) {
  VarList inputs = energy.ContextValues();
  for (const Var& p : energy.layer().parameters()) inputs.push_back(p);
  return inputs;
}

ImplicitResult SolveEnergyFixedPoint(const BoundEnergyPtr& energy,
                                     const Tensor& z0,
                                     const ImplicitOptions& options,
                                     const std::shared_ptr<AdjointWarmStart>& warm_start,
                                     std::vector<std::vector<double>>* iteration_trace) {
  CheckInitialState(energy->layer(), z0);
  const std::vector<int64_t> dims = z0.shape().dims();
  const Shape state_shape(std::vector<int64_t>(dims.begin() + 1, dims.end()));
  CellFn update = MakeUpdateCell(energy, state_shape);
  CellEnergyFn energies = [energy, state_shape](const Var& z, const std::vector<int64_t>& ids) {
    std::vector<int64_t> shape = {z.dim(0)};
    for (int64_t d : state_shape.dims()) shape.push_back(d);
    return energy->Select(ids)->SampleEnergies(reshape(z, Shape(shape)));
  };
  if (iteration_trace == nullptr) {
    return SolveImplicit(update, z0, options, energies, ImplicitInputsOf(*energy), warm_start);
  }

  // Record the states the solver evaluates (tape off: the solve itself, not
  // the recorded evaluation at z* or the JVPs) and turn them into energies
  // after every iteration.
  const int64_t batch = z0.dim(0);
  auto recorder = std::make_shared<EnergyTraceRecorder>();
  recorder->latest = z0.Reshape(Shape{batch, state_shape.numel()}).Clone();
  recorder->dirty.assign(batch, 0);
  recorder->energies.resize(batch);
  CellFn traced_update = [update, recorder](const Var& z, const std::vector<int64_t>& ids) {
    if (!GradModeEnabled()) recorder->Record(z.value(), ids);
    return update(z, ids);
  };
  CellEnergyFn traced_energy = [energies, recorder](const Var& z, const std::vector<int64_t>& ids) {
    recorder->Record(z.value(), ids);
    return energies(z, ids);
  };
  ImplicitOptions traced_options = options;
  const Shape shape = z0.shape();
  traced_options.forward.callbacks.push_back([recorder, energy, shape](const IterationSummary&) {
    recorder->Flush(*energy, shape);
    return CallbackReturnType::kContinue;
  });
  ImplicitResult result = SolveImplicit(traced_update, z0, traced_options, traced_energy,
                                        ImplicitInputsOf(*energy), warm_start);
  recorder->Flush(*energy, shape);  // evaluations after the last callback, if any
  const std::vector<double> final_energies = EnergiesOf(*energy, result.z_star);
  for (int64_t b = 0; b < batch; ++b) recorder->energies[b].push_back(final_energies[b]);
  *iteration_trace = std::move(recorder->energies);
  return result;
}

Var SolveEnergy(const BoundEnergyPtr& energy,
                const Var& z0,
                const EnergySolveOptions& options,
                EnergySolveReport* report,
                const std::shared_ptr<AdjointWarmStart>& warm_start) {
  const EnergyLayerBase& layer = energy->layer();
  CheckInitialState(layer, z0.defined() ? z0.value() : Tensor());
  EnergySolveReport local;
  EnergySolveReport& out = report != nullptr ? *report : local;
  out = EnergySolveReport();
  out.mode = options.mode;
  if (options.trace_energy) out.energies.push_back(EnergiesOf(*energy, z0));

  if (options.mode == EnergySolveMode::kFixedSteps) {
    SP_CHECK(options.steps >= 0, layer.Name(), ": steps must be >= 0, got ", options.steps);
    Var z = z0;
    for (int t = 0; t < options.steps; ++t) {
      z = energy->Update(z);
      if (options.trace_energy) out.energies.push_back(EnergiesOf(*energy, z));
    }
    out.steps = options.steps;
    return z;
  }

  out.implicit = SolveEnergyFixedPoint(energy, z0.value(), options.implicit, warm_start);
  if (options.trace_energy) out.energies.push_back(EnergiesOf(*energy, out.implicit.z_star));
  return out.implicit.z_star;
}

Var EnergyLayerBase::SolveBound(const BoundEnergyPtr& energy,
                                const Var& z0,
                                const EnergySolveOptions& options) const {
  if (options.mode != EnergySolveMode::kFixedPoint) {
    return SolveEnergy(energy, z0, options, last_solve_.get(), adjoint_warm_start_);
  }
  EnergySolveOptions tallied = options;
  tallied.implicit = TallyingAdjoints(options.implicit, solve_tally_);
  Var result = SolveEnergy(energy, z0, tallied, last_solve_.get(), adjoint_warm_start_);
  solve_tally_->forward.Add(last_solve_->implicit.forward.sample_termination);
  return result;
}

ImplicitTally EnergyLayerBase::TakeSolveTally() const {
  ImplicitTally taken = *solve_tally_;
  *solve_tally_ = ImplicitTally();
  return taken;
}

}  // namespace stillpoint
