#include "training/generate_step.h"

#include "framework/autograd.h"
#include "framework/ops.h"
#include "solvers/implicit_solve.h"

namespace stillpoint {

bool StepDecoder::Supports(const SequenceModel& model, std::string* why) {
  auto fail = [&](const std::string& reason) {
    if (why != nullptr) *why = reason;
    return false;
  };
  const ModelOptions& options = model.options();
  if (options.feature_dim > 0) return fail("the model reads feature vectors, not symbols");
  if (options.kind == ModelKind::kEnergy) {
    return fail("an energy model's block is solved over every position at once");
  }
  if (model.num_cells() == 0) return fail("the model has no cells");
  for (int64_t l = 0; l < model.num_cells(); ++l) {
    std::string reason;
    if (!model.cell(l)->SupportsStep(&reason)) return fail("its cell: " + reason);
  }
  if (why != nullptr) why->clear();
  return true;
}

StepDecoder::StepDecoder(const SequenceModel& model, bool warm_start)
    : model_(model), warm_start_(warm_start) {
  std::string why;
  SP_CHECK(Supports(model, &why), "StepDecoder: the model cannot be decoded step by step: ", why);
  const ModelOptions& options = model.options();
  const bool unroll = options.kind == ModelKind::kTied ||
                      (options.kind == ModelKind::kImplicit && model.depth_override() > 0);
  first_step_ = options.input_injection == InputInjection::kFirstStep &&
                (options.kind == ModelKind::kExplicit || options.kind == ModelKind::kTied);
  if (options.kind == ModelKind::kExplicit) {
    for (int64_t l = 0; l < model.num_cells(); ++l) layers_.push_back(model.cell(l).get());
  } else if (unroll) {
    const int64_t steps =
        model.depth_override() > 0 ? model.depth_override() : options.unroll_steps;
    layers_.assign(static_cast<std::size_t>(steps), model.cell(0).get());
  } else {
    solve_ = true;
    layers_.push_back(model.cell(0).get());
  }
  caches_.resize(layers_.size());
}

void StepDecoder::Reset() {
  for (KeyValueCache& cache : caches_) cache = KeyValueCache();
  symbols_.clear();
  states_ = Tensor();
  last_iterations_ = 0;
  last_converged_ = true;
}

std::vector<double> StepDecoder::Push(const std::vector<int64_t>& ids) {
  SP_CHECK(!ids.empty(), "StepDecoder: Push needs at least one symbol");
  Tensor start;
  if (solve_ && warm_start_ && states_.defined()) {
    // Every new position starts where the last one ended.
    NoGrad no_grad;
    const int64_t n = static_cast<int64_t>(ids.size()), last = states_.dim(1);
    start = broadcast_to(slice(constant(states_), 1, last - 1, last),
                         Shape{1, n, states_.dim(2)})
                .value()
                .Clone();
  }
  return Read(ids, start);
}

std::vector<double> StepDecoder::Slide(int64_t keep) {
  SP_CHECK(keep >= 1 && keep <= length(), "StepDecoder: Slide keeps ", keep,
           " symbols of a window of ", length());
  const std::vector<int64_t> kept(symbols_.end() - keep, symbols_.end());
  Tensor start;
  if (solve_ && warm_start_ && states_.defined()) {
    NoGrad no_grad;
    start = slice(constant(states_), 1, length() - keep, length()).value().Clone();
  }
  Reset();
  return Read(kept, start);
}

std::vector<double> StepDecoder::Read(const std::vector<int64_t>& ids, const Tensor& start) {
  NoGrad no_grad;
  const Var u = model_.EmbedFrom(ids, length());  // [1, n, d]
  const Tensor zeros = Tensor::Zeros(u.shape(), u.value().dtype());
  Var z;
  if (solve_) {
    // The new positions' fixed point, the earlier ones held in the cache.
    const Cell& cell = *layers_[0];
    const KeyValueCache& past = caches_[0];
    const CellFn map = [&](const Var& state, const std::vector<int64_t>&) {
      return cell.ForwardStep(state, u, past, nullptr);
    };
    const ImplicitResult solved =
        SolveImplicit(map, start.defined() ? start : zeros, model_.implicit()->options());
    z = solved.z_star;
    last_iterations_ = solved.forward.sample_iterations.empty()
                           ? solved.forward.iterations
                           : solved.forward.sample_iterations[0];
    last_converged_ = solved.forward.IsUsable();
    // The cache gets the new positions' keys and values at their fixed point.
    cell.ForwardStep(z, u, caches_[0], &caches_[0]);
    states_ = states_.defined() ? concat({constant(states_), z}, 1).value() : z.value();
  } else {
    z = first_step_ ? u : constant(zeros);
    const Var injection = first_step_ ? constant(zeros) : u;
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      z = layers_[l]->ForwardStep(z, injection, caches_[l], &caches_[l]);
    }
  }
  symbols_.insert(symbols_.end(), ids.begin(), ids.end());
  const int64_t n = z.dim(1);
  return model_.Logits(slice(z, 1, n - 1, n)).value().ToVector();
}

}  // namespace stillpoint
