#include "training/gradient_check.h"

#include <cmath>
#include <cstdio>

#include "training/experiment.h"

namespace stillpoint {

std::string GradientCheck::Line() const {
  if (!ran) return "gradient check: no implicit layer";
  char buffer[256];
  std::snprintf(buffer, sizeof(buffer),
                "gradient check: cos %.6f, rel err %.2e against ift/gmres to 1e-10 (reached "
                "%.1e, %s)",
                cosine, relative_error, reference_residual, reference_status.c_str());
  return buffer;
}

BackwardOptions ReferenceBackwardOptions() {
  BackwardOptions options;
  options.mode = BackwardMode::kIft;
  options.solver = AdjointSolverType::kGmres;
  options.tolerance = 1e-10;
  options.max_iterations = 500;
  options.gmres_restart = 50;
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

GradientCheck CheckGradient(SequenceModel& model, const Batch& batch) {
  GradientCheck check;
  Implicit* layer = model.mutable_implicit();
  if (layer == nullptr) return check;
  const bool was_training = model.is_training();
  const int64_t depth = model.depth_override();
  const ImplicitOptions saved = layer->options();
  model.Eval();
  model.SetDepthOverride(0);
  layer->mutable_options().backward.warm_start = false;
  const std::vector<double> used = ParameterGradient(model, batch);
  if (layer->backward_summary()) check.used_brief = layer->backward_summary()->BriefReport();
  layer->mutable_options().backward = ReferenceBackwardOptions();
  const std::vector<double> reference = ParameterGradient(model, batch);
  if (const auto summary = layer->backward_summary()) {
    check.reference_residual = summary->HasResiduals() ? summary->MaxRelResidual() : NAN;
    check.reference_status = ToString(summary->termination_type);
  }
  layer->mutable_options() = saved;
  model.SetDepthOverride(depth);
  model.Train(was_training);

  double dot = 0, used_sq = 0, reference_sq = 0, diff_sq = 0;
  for (std::size_t i = 0; i < used.size(); ++i) {
    dot += used[i] * reference[i];
    used_sq += used[i] * used[i];
    reference_sq += reference[i] * reference[i];
    diff_sq += (used[i] - reference[i]) * (used[i] - reference[i]);
  }
  check.ran = true;
  if (used_sq > 0 && reference_sq > 0) check.cosine = dot / std::sqrt(used_sq * reference_sq);
  if (reference_sq > 0) check.relative_error = std::sqrt(diff_sq / reference_sq);
  return check;
}

}  // namespace stillpoint
