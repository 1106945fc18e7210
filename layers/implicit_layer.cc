#include "layers/implicit_layer.h"

#include <sstream>
#include <utility>

#include "framework/ops.h"
#include "layers/dropout.h"
#include "layers/energy_solve.h"

namespace stillpoint {
namespace {

// The injection rows of the listed samples (u itself when all are listed:
// ids are increasing, so k == B means 0..B-1).
Var InjectionRows(const Var& u, const std::vector<int64_t>& ids) {
  if (static_cast<int64_t>(ids.size()) == u.dim(0)) return u;
  return gather(u, 0, ids);
}

}  // namespace

Implicit::Implicit(Function f, const ImplicitOptions& options, EnergyFunction energy)
    : f_(std::move(f)), energy_(std::move(energy)), options_(options) {
  SP_CHECK(static_cast<bool>(f_), "Implicit: the cell function is empty");
}

Implicit::Implicit(Function f, std::shared_ptr<Module> cell, const ImplicitOptions& options)
    : f_(std::move(f)), cell_(std::move(cell)), options_(options) {
  RegisterModule("cell", cell_);
}

Implicit::Implicit(std::shared_ptr<EnergyLayerBase> layer,
                   const ImplicitOptions& options,
                   const EnergyImplicitOptions& energy_options)
    : cell_(layer),
      energy_layer_(std::move(layer)),
      options_(options),
      energy_options_(energy_options) {
  SP_CHECK(energy_layer_ != nullptr, "Implicit: the energy layer is null");
  std::string error;
  SP_CHECK(energy_options.IsValid(&error), "Implicit: ", error);
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
  return KeepResult(SolveImplicit(cell, z0, TallyingAdjoints(options_, tally_), energy,
                                  explicit_inputs, adjoint_warm_start_));
}

Var Implicit::KeepResult(ImplicitResult result) {
  tally_->forward.Add(result.forward.sample_termination);
  last_ = std::move(result);
  // last_ keeps z*'s value, not its graph: a kept graph would hold this
  // solve's recorded evaluation (everything it saved for the backward pass)
  // until the next Forward had finished, so that two of them were alive at
  // once (a layer nested in another's map solves many times a step).
  Var z_star = last_.z_star;
  if (z_star.defined()) last_.z_star = Var(z_star.value());
  return z_star;
}

const EnergyLayerBase& Implicit::EnergyLayerOrThrow() const {
  SP_CHECK(energy_layer_ != nullptr,
           "Implicit: Forward(ctx, z0) needs an energy layer; this one solves a cell, call "
           "Forward(u)");
  return *energy_layer_;
}

Var Implicit::Forward(const BoundEnergyPtr& energy, const Var& z0) {
  const EnergyLayerBase& layer = EnergyLayerOrThrow();
  SP_CHECK(
      energy != nullptr && &energy->layer() == &layer, "Implicit: Forward over ", layer.Name(),
      " was given ",
      energy == nullptr ? std::string("no energy") : "the energy of " + energy->layer().Name());
  SP_CHECK(z0.defined() && z0.rank() >= 2, "Implicit: the initial state of ", layer.Name(),
           " must be [B, ...] with rank >= 2, got ",
           z0.defined() ? z0.shape().ToString() : std::string("undefined"));
  SP_CHECK(energy->batch_size() < 0 || energy->batch_size() == z0.dim(0),
           "Implicit: the context of ", layer.Name(), " has ", energy->batch_size(), " samples (",
           energy->DescribeContext(), ") but z0 ", z0.shape(), " has ", z0.dim(0));
  energy_trace_.clear();
  return KeepResult(SolveEnergyFixedPoint(energy, z0.value(), TallyingAdjoints(options_, tally_),
                                          adjoint_warm_start_,
                                          energy_options_.trace_energy ? &energy_trace_ : nullptr));
}

ImplicitTally Implicit::TakeTally() const {
  ImplicitTally taken = *tally_;
  *tally_ = ImplicitTally();
  return taken;
}

const OptionFields<EnergyImplicitOptions>& EnergyImplicitOptions::Fields() {
  using O = EnergyImplicitOptions;
  static const auto* fields = &(new OptionFields<O>)
                                   ->Bool("trace_energy", &O::trace_energy,
                                          "Record energy_trace(): the energy after every forward "
                                          "solver iteration and at the returned state");
  return *fields;
}

bool EnergyImplicitOptions::IsValid(std::string* error) const {
  const std::string problem = Fields().Check(*this);
  if (!problem.empty() && error != nullptr) *error = "EnergyImplicitOptions: " + problem;
  return problem.empty();
}

std::string EnergyImplicitOptions::ToString() const { return Fields().Describe(*this) + "\n"; }

}  // namespace stillpoint
