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

std::vector<double> EnergiesOf(const EnergyLayer& layer, const Var& z, const EnergyContext& ctx) {
  NoGrad no_grad;
  return layer.SampleEnergies(Var(z.value()), ctx).value().ToVector();
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
  void Flush(const EnergyLayer& layer, const EnergyContext& ctx, const Shape& shape) {
    std::vector<int64_t> ids;
    for (std::size_t b = 0; b < dirty.size(); ++b) {
      if (dirty[b]) ids.push_back(static_cast<int64_t>(b));
    }
    if (ids.empty()) return;
    NoGrad no_grad;
    std::vector<int64_t> dims = shape.dims();
    dims[0] = static_cast<int64_t>(ids.size());
    const Tensor rows = gather(Var(latest), 0, ids).value().Reshape(Shape(dims));
    const std::vector<double> values = EnergiesOf(layer, Var(rows), ctx.Select(ids));
    for (std::size_t i = 0; i < ids.size(); ++i) {
      energies[ids[i]].push_back(values[i]);
      dirty[ids[i]] = 0;
    }
  }
};

}  // namespace

VarList ImplicitInputsOf(const EnergyLayer& layer, const EnergyContext& ctx) {
  VarList inputs = ctx.Values();
  for (const Var& p : layer.parameters()) inputs.push_back(p);
  return inputs;
}

ImplicitResult SolveEnergyFixedPoint(const EnergyLayer& layer,
                                     const Tensor& z0,
                                     const EnergyContext& ctx,
                                     const ImplicitOptions& options,
                                     const std::shared_ptr<AdjointWarmStart>& warm_start,
                                     std::vector<std::vector<double>>* iteration_trace) {
  SP_CHECK(z0.defined() && z0.rank() >= 2, layer.Name(),
           ": the initial state must be [B, ...] with rank >= 2, got ",
           z0.defined() ? z0.shape().ToString() : std::string("undefined"));
  const std::vector<int64_t> dims = z0.shape().dims();
  const Shape state_shape(std::vector<int64_t>(dims.begin() + 1, dims.end()));
  const EnergyLayer* layer_ptr = &layer;
  CellFn update = MakeUpdateCell(layer, ctx, state_shape);
  CellEnergyFn energy = [layer_ptr, ctx, state_shape](const Var& z,
                                                      const std::vector<int64_t>& ids) {
    std::vector<int64_t> shape = {z.dim(0)};
    for (int64_t d : state_shape.dims()) shape.push_back(d);
    return layer_ptr->SampleEnergies(reshape(z, Shape(shape)), ctx.Select(ids));
  };
  if (iteration_trace == nullptr) {
    return SolveImplicit(update, z0, options, energy, ImplicitInputsOf(layer, ctx), warm_start);
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
  CellEnergyFn traced_energy = [energy, recorder](const Var& z, const std::vector<int64_t>& ids) {
    recorder->Record(z.value(), ids);
    return energy(z, ids);
  };
  ImplicitOptions traced_options = options;
  const Shape shape = z0.shape();
  traced_options.forward.callbacks.push_back(
      [recorder, layer_ptr, ctx, shape](const IterationSummary&) {
        recorder->Flush(*layer_ptr, ctx, shape);
        return CallbackReturnType::kContinue;
      });
  ImplicitResult result = SolveImplicit(traced_update, z0, traced_options, traced_energy,
                                        ImplicitInputsOf(layer, ctx), warm_start);
  recorder->Flush(layer, ctx, shape);  // evaluations after the last callback, if any
  const std::vector<double> final_energies = EnergiesOf(layer, result.z_star, ctx);
  for (int64_t b = 0; b < batch; ++b) recorder->energies[b].push_back(final_energies[b]);
  *iteration_trace = std::move(recorder->energies);
  return result;
}

Var SolveEnergy(const EnergyLayer& layer,
                const Var& z0,
                const EnergyContext& ctx,
                const EnergySolveOptions& options,
                EnergySolveReport* report,
                const std::shared_ptr<AdjointWarmStart>& warm_start) {
  SP_CHECK(z0.defined() && z0.rank() >= 2, layer.Name(),
           ": the initial state must be [B, ...] with rank >= 2, got ",
           z0.defined() ? z0.shape().ToString() : std::string("undefined"));
  EnergySolveReport local;
  EnergySolveReport& out = report != nullptr ? *report : local;
  out = EnergySolveReport();
  out.mode = options.mode;
  if (options.trace_energy) out.energies.push_back(EnergiesOf(layer, z0, ctx));

  if (options.mode == EnergySolveMode::kFixedSteps) {
    SP_CHECK(options.steps >= 0, layer.Name(), ": steps must be >= 0, got ", options.steps);
    Var z = z0;
    for (int t = 0; t < options.steps; ++t) {
      z = layer.Update(z, ctx);
      if (options.trace_energy) out.energies.push_back(EnergiesOf(layer, z, ctx));
    }
    out.steps = options.steps;
    return z;
  }

  out.implicit = SolveEnergyFixedPoint(layer, z0.value(), ctx, options.implicit, warm_start);
  if (options.trace_energy) out.energies.push_back(EnergiesOf(layer, out.implicit.z_star, ctx));
  return out.implicit.z_star;
}

Var EnergyLayer::Solve(const Var& z0,
                       const EnergyContext& ctx,
                       const EnergySolveOptions& options) const {
  if (options.mode != EnergySolveMode::kFixedPoint) {
    return SolveEnergy(*this, z0, ctx, options, last_solve_.get(), adjoint_warm_start_);
  }
  EnergySolveOptions tallied = options;
  tallied.implicit = TallyingAdjoints(options.implicit, solve_tally_);
  Var result = SolveEnergy(*this, z0, ctx, tallied, last_solve_.get(), adjoint_warm_start_);
  solve_tally_->forward.Add(last_solve_->implicit.forward.sample_termination);
  return result;
}

ImplicitTally EnergyLayer::TakeSolveTally() const {
  ImplicitTally taken = *solve_tally_;
  *solve_tally_ = ImplicitTally();
  return taken;
}

}  // namespace stillpoint
