#include "layers/implicit.h"

#include <sstream>
#include <utility>

#include "framework/ops.h"
#include "layers/dropout.h"

namespace stillpoint {
namespace {

// The injection rows of the listed samples (u itself when all are listed:
// ids are increasing, so k == B means 0..B-1).
Var InjectionRows(const Var& u, const std::vector<int64_t>& ids) {
  if (static_cast<int64_t>(ids.size()) == u.dim(0)) return u;
  return gather(u, 0, ids);
}

// The states the solver evaluated since the last iteration callback, and the
// energies recorded from them (EnergyImplicitOptions::trace_energy).
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
    const std::vector<double> values = layer.Energy(Var(rows), ctx.Select(ids)).value().ToVector();
    for (std::size_t i = 0; i < ids.size(); ++i) {
      energies[ids[i]].push_back(values[i]);
      dirty[ids[i]] = 0;
    }
  }
};

}  // namespace

Implicit::Implicit(Function f, const ImplicitOptions& options, EnergyFunction energy)
    : f_(std::move(f)), energy_(std::move(energy)), options_(options) {
  SP_CHECK(static_cast<bool>(f_), "Implicit: the cell function is empty");
}

Implicit::Implicit(Function f, std::shared_ptr<Module> cell, const ImplicitOptions& options)
    : f_(std::move(f)), cell_(std::move(cell)), options_(options) {
  RegisterModule("cell", cell_);
}

Implicit::Implicit(std::shared_ptr<EnergyLayer> layer,
                   const ImplicitOptions& options,
                   const EnergyImplicitOptions& energy_options)
    : cell_(layer),
      energy_layer_(std::move(layer)),
      options_(options),
      energy_options_(energy_options) {
  SP_CHECK(energy_layer_ != nullptr, "Implicit: the energy layer is null");
  f_ = [name = energy_layer_->Name()](const Var&, const Var&, const std::vector<int64_t>&) -> Var {
    SP_CHECK(false, "Implicit: this layer solves the energy layer ", name,
             "; call Forward(ctx, z0) with its context, not Forward(u)");
    return Var();
  };
  RegisterModule("layer", cell_);
}

std::string Implicit::Name() const {
  std::ostringstream out;
  out << "Implicit(";
  if (energy_layer_) out << energy_layer_->Name() << ", ";
  out << stillpoint::ToString(options_.forward.type) << " forward, "
      << stillpoint::ToString(options_.backward.mode);
  if (options_.backward.mode == BackwardMode::kIft) {
    out << "/" << stillpoint::ToString(options_.backward.solver);
  }
  out << " backward)";
  return out.str();
}

Var Implicit::Forward(const Var& u) {
  SP_CHECK(u.defined() && u.rank() >= 1, "Implicit: the injection must be [B, ...]");
  return Forward(u, Tensor::Zeros(u.shape(), u.dtype()));
}

Var Implicit::Forward(const Var& u, const Tensor& z0) {
  SP_CHECK(u.defined() && u.rank() >= 1, "Implicit: the injection must be [B, ...]");
  SP_CHECK(z0.defined() && z0.rank() >= 1 && z0.dim(0) == u.dim(0) && z0.dtype() == u.dtype(),
           "Implicit: z0 ", (z0.defined() ? z0.shape().ToString() : "undefined"), " (",
           (z0.defined() ? stillpoint::ToString(z0.dtype()) : "-"),
           ") must be [B, ...] with the B and dtype of the injection ", u.shape(), " (",
           stillpoint::ToString(u.dtype()), ")");
  if (cell_) {
    // Fresh masks for this solve, frozen for its iterations and its backward.
    ReleaseDropoutMasks(*cell_);
    FreezeDropoutMasks(*cell_);
  }
  // By value, so the closure stays valid even if a graph node keeps it.
  CellFn cell = [f = f_, u](const Var& z, const std::vector<int64_t>& ids) {
    return f(z, InjectionRows(u, ids), ids);
  };
  CellEnergyFn energy;
  if (energy_) {
    energy = [e = energy_, u](const Var& z, const std::vector<int64_t>& ids) {
      return e(z, InjectionRows(u, ids), ids);
    };
  }
  // The injection and the cell module's parameters: what the cell reads
  // besides z, for second derivatives through the solve (a bare function
  // cell has no module, so its solve is differentiable to first order).
  VarList explicit_inputs;
  if (cell_) {
    explicit_inputs.push_back(u);
    for (const Var& p : cell_->parameters()) explicit_inputs.push_back(p);
  }
  last_ = SolveImplicit(cell, z0, options_, energy, explicit_inputs);
  return last_.z_star;
}

Var Implicit::Forward(const EnergyContext& ctx, const Var& z0) {
  SP_CHECK(energy_layer_ != nullptr,
           "Implicit: Forward(ctx, z0) needs an energy layer; this one solves a cell, call "
           "Forward(u)");
  SP_CHECK(z0.defined() && z0.rank() >= 2, "Implicit: the initial state of ",
           energy_layer_->Name(), " must be [B, ...] with rank >= 2, got ",
           z0.defined() ? z0.shape().ToString() : std::string("undefined"));
  SP_CHECK(ctx.batch_size() < 0 || ctx.batch_size() == z0.dim(0), "Implicit: the context of ",
           energy_layer_->Name(), " has ", ctx.batch_size(), " samples but z0 ", z0.shape(),
           " has ", z0.dim(0));
  const std::vector<int64_t> dims = z0.shape().dims();
  const Shape state_shape(std::vector<int64_t>(dims.begin() + 1, dims.end()));
  const EnergyLayer* layer = energy_layer_.get();
  CellFn update = MakeUpdateCell(*layer, ctx, state_shape);
  CellEnergyFn energy = [layer, ctx, state_shape](const Var& z, const std::vector<int64_t>& ids) {
    std::vector<int64_t> shape = {z.dim(0)};
    for (int64_t d : state_shape.dims()) shape.push_back(d);
    return layer->Energy(reshape(z, Shape(shape)), ctx.Select(ids));
  };
  energy_trace_.clear();
  if (!energy_options_.trace_energy) {
    last_ = SolveImplicit(update, z0.value(), options_, energy, ImplicitInputsOf(*layer, ctx));
    return last_.z_star;
  }

  // Record the states the solver evaluates (tape off: the solve itself, not
  // the recorded evaluation at z* or the JVPs) and turn them into energies
  // after every iteration.
  const int64_t batch = z0.dim(0);
  auto recorder = std::make_shared<EnergyTraceRecorder>();
  recorder->latest = z0.value().Reshape(Shape{batch, state_shape.numel()}).Clone();
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
  ImplicitOptions options = options_;
  const Shape shape = z0.shape();
  options.forward.callbacks.push_back([recorder, layer, ctx, shape](const IterationSummary&) {
    recorder->Flush(*layer, ctx, shape);
    return CallbackReturnType::kContinue;
  });
  last_ = SolveImplicit(traced_update, z0.value(), options, traced_energy,
                        ImplicitInputsOf(*layer, ctx));
  recorder->Flush(*layer, ctx, shape);  // evaluations after the last callback, if any
  {
    NoGrad no_grad;
    const std::vector<double> final_energies =
        layer->Energy(Var(last_.z_star.value()), ctx).value().ToVector();
    for (int64_t b = 0; b < batch; ++b) recorder->energies[b].push_back(final_energies[b]);
  }
  energy_trace_ = std::move(recorder->energies);
  return last_.z_star;
}

}  // namespace stillpoint
