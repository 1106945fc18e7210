#include "training/gradient_check.h"

#include <cmath>
#include <cstdio>

#include "framework/ops.h"
#include "layers/energy_attention.h"
#include "training/experiment.h"

namespace stillpoint {

std::string GradientCheck::Line() const {
  if (!ran) return "gradient check: no implicit layer";
  char buffer[320];
  std::string line;
  if (!no_reference.empty()) {
    line = "gradient check: no reference (" + no_reference + ")";
  } else {
    std::snprintf(buffer, sizeof(buffer),
                  "gradient check: cos %.6f, rel err %.2e against ift/gmres to %.0e (reached %.1e)",
                  cosine, relative_error, reference_tolerance, reference_residual);
    line = buffer;
  }
  if (used_depth > 0) {
    line += "; used: the unrolled gradient of pretraining (" + std::to_string(used_depth) +
            " steps)";
  }
  if (!std::isnan(spectral_radius)) {
    std::snprintf(buffer, sizeof(buffer), "; spectral radius of J_f %.3g (eigenvalue %.3g)",
                  spectral_radius, spectral_eigenvalue);
    line += buffer;
  }
  return line;
}

double ReferenceTolerance(DType dtype) { return dtype == DType::kFloat64 ? 1e-10 : 1e-5; }

BackwardOptions ReferenceBackwardOptions(DType dtype) {
  BackwardOptions options;
  options.mode = BackwardMode::kIft;
  options.solver = AdjointSolverType::kGmres;
  options.tolerance = ReferenceTolerance(dtype);
  // Enough Krylov steps for a radius up to about 0.9 with its spectrum
  // spread over a disk (where the residual falls like rho^k): at 100 steps
  // (restart 50) the reference of the quickstart's probabilistic implicit
  // model stopped at 2.8e-5.
  options.max_iterations = 400;
  options.gmres_restart = 100;
  return options;
}

std::vector<double> ParameterGradient(SequenceModel& model, const Batch& batch) {
  model.ZeroGrad();
  Var loss = BatchLoss(ForwardBatch(model, batch), batch);
  backward(loss);
  std::vector<double> flat;
  for (const Var& p : model.parameters()) {
    if (p.has_grad()) {
      const std::vector<double> g = p.grad().value().ToVector();
      flat.insert(flat.end(), g.begin(), g.end());
    } else {
      flat.insert(flat.end(), p.numel(), 0.0);
    }
  }
  model.ZeroGrad();
  return flat;
}

Batch GradientProbeBatch(const Dataset& dataset, int64_t size, DType dtype) {
  Batcher probe(dataset, size, 12345, dtype);
  return probe.Next();
}

bool HasImplicitLayer(const SequenceModel& model) {
  return model.implicit() != nullptr || !FindEnergyAttentions(model).empty() ||
         !model.HopfieldReadouts().empty();
}

namespace {

// The warm starts of training's adjoint solves, for the used gradient: each
// start cut to the probe's rows (a start of another shape would not be used,
// as in training after a change of batch size), and restored afterwards, so
// the probe's own solutions never reach training.
class WarmStartsForProbe {
 public:
  WarmStartsForProbe(const std::vector<std::shared_ptr<AdjointWarmStart>>& starts, int64_t rows)
      : starts_(starts) {
    for (const auto& start : starts_) {
      saved_.push_back(start->solution);
      const Tensor& s = start->solution;
      if (s.defined() && s.rank() == 2 && s.dim(0) > rows) {
        start->solution = s.SliceRows(0, rows).Clone();
      } else if (s.defined()) {
        start->solution = s.Clone();
      }
    }
  }
  ~WarmStartsForProbe() {
    for (std::size_t i = 0; i < starts_.size(); ++i) starts_[i]->solution = saved_[i];
  }

 private:
  std::vector<std::shared_ptr<AdjointWarmStart>> starts_;
  std::vector<Tensor> saved_;
};

}  // namespace

namespace {

// The reference solves' worst status (returned, and as reference_status)
// and worst residual. A solve asked for more than the reference tolerance
// (the inner adjoints) counts as converged when it reached that tolerance.
TerminationType SetReferenceOutcome(
    const std::vector<std::shared_ptr<const AdjointSummary>>& summaries, GradientCheck* check) {
  TerminationType worst = TerminationType::kConverged;
  for (const auto& summary : summaries) {
    if (!summary) continue;
    const bool reached = summary->HasResiduals() &&
                         summary->MaxRelResidual() <= check->reference_tolerance &&
                         summary->termination_type == TerminationType::kMaxIterations;
    if (!reached) worst = std::max(worst, summary->termination_type);
    if (summary->HasResiduals() && !(summary->MaxRelResidual() <= check->reference_residual)) {
      check->reference_residual = summary->MaxRelResidual();
    }
  }
  check->reference_status = ToString(worst);
  return worst;
}

// The cosine and the relative error of the gradient used against the
// reference (left NaN when a norm is 0).
void CompareGradients(const std::vector<double>& used, const std::vector<double>& reference,
                      GradientCheck* check) {
  double dot = 0, used_sq = 0, reference_sq = 0, diff_sq = 0;
  for (std::size_t i = 0; i < used.size(); ++i) {
    dot += used[i] * reference[i];
    used_sq += used[i] * used[i];
    reference_sq += reference[i] * reference[i];
    diff_sq += (used[i] - reference[i]) * (used[i] - reference[i]);
  }
  if (used_sq > 0 && reference_sq > 0) check->cosine = dot / std::sqrt(used_sq * reference_sq);
  if (reference_sq > 0) check->relative_error = std::sqrt(diff_sq / reference_sq);
}

}  // namespace

GradientCheck CheckGradient(SequenceModel& model, const Batch& batch, int64_t used_depth) {
  GradientCheck check;
  // Every implicit layer: the model's own (implicit and energy kinds) and
  // the energy attentions inside its cells (model.attention), so that the
  // reference is exact for nested solves too.
  std::vector<Implicit*> layers;
  if (Implicit* layer = model.mutable_implicit()) layers.push_back(layer);
  for (const auto& [name, attention] : FindEnergyAttentions(model)) {
    layers.push_back(&attention->implicit());
  }
  // The Hopfield pooling and lookup solve through their own layers.
  std::vector<ImplicitOptions*> readouts;
  std::vector<std::shared_ptr<AdjointWarmStart>> warm_starts;
  for (Implicit* layer : layers) warm_starts.push_back(layer->adjoint_warm_start());
  for (const auto& [name, hopfield] : model.HopfieldReadouts()) {
    readouts.push_back(&hopfield->mutable_solve_options().implicit);
    warm_starts.push_back(hopfield->adjoint_warm_start());
  }
  if (layers.empty() && readouts.empty()) return check;
  const bool was_training = model.is_training();
  const int64_t depth = model.depth_override();
  std::vector<ImplicitOptions> saved, saved_readouts;
  for (Implicit* layer : layers) saved.push_back(layer->options());
  for (ImplicitOptions* options : readouts) saved_readouts.push_back(*options);
  model.Eval();
  check.used_depth = used_depth;
  model.SetDepthOverride(used_depth);
  std::vector<double> used;
  {
    const WarmStartsForProbe probe_starts(warm_starts, batch.batch_size);
    used = ParameterGradient(model, batch);
  }
  if (!layers.empty() && layers[0]->backward_summary()) {
    check.used_brief = layers[0]->backward_summary()->BriefReport();
  }
  model.SetDepthOverride(0);
  const BackwardOptions reference_options = ReferenceBackwardOptions(model.options().dtype);
  check.reference_tolerance = reference_options.tolerance;
  // The inner adjoints (the energy attentions') are asked for a tenth of the
  // outer tolerance: the outer reference's operator contains them, and with
  // both at the same tolerance the outer GMRES can stall just above its own
  // (docs/examples.md, "The attention grid"). Float32 VJPs may keep an inner
  // solve above that; it counts when it reached the reference tolerance.
  BackwardOptions inner_options = reference_options;
  inner_options.tolerance = 0.1 * reference_options.tolerance;
  for (Implicit* layer : layers) {
    layer->mutable_options().backward =
        layer == model.mutable_implicit() ? reference_options : inner_options;
  }
  for (ImplicitOptions* options : readouts) options->backward = reference_options;
  const std::vector<double> reference = ParameterGradient(model, batch);
  if (model.options().kind == ModelKind::kImplicit || model.options().kind == ModelKind::kEnergy) {
    // Power iteration on J_f^T at the fixed point of the reference's solve:
    // the solve of this batch even when the used gradient came from
    // pretraining's unroll, which solves nothing.
    const SpectralRadiusResult estimate = model.FixedPointSpectralRadius(EmbedBatch(model, batch));
    check.spectral_radius = estimate.max_radius;
    check.spectral_eigenvalue = estimate.dominant_eigenvalue;
  }
  // The reference's worst residual and status over the layers.
  std::vector<std::shared_ptr<const AdjointSummary>> summaries;
  for (Implicit* layer : layers) summaries.push_back(layer->backward_summary());
  for (const auto& [name, hopfield] : model.HopfieldReadouts()) {
    summaries.push_back(hopfield->last_solve().implicit.backward);
  }
  const TerminationType worst = SetReferenceOutcome(summaries, &check);
  for (std::size_t i = 0; i < layers.size(); ++i) layers[i]->mutable_options() = saved[i];
  for (std::size_t i = 0; i < readouts.size(); ++i) *readouts[i] = saved_readouts[i];
  model.SetDepthOverride(depth);
  model.Train(was_training);
  check.ran = true;
  if (worst != TerminationType::kConverged) {
    char buffer[160];
    std::snprintf(buffer, sizeof(buffer),
                  "the reference adjoint (ift/gmres) stopped at %.1e above its tolerance %.0e, %s",
                  check.reference_residual, check.reference_tolerance,
                  check.reference_status.c_str());
    check.no_reference = buffer;
    return check;
  }
  CompareGradients(used, reference, &check);
  return check;
}

}  // namespace stillpoint
