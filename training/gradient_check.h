// How far the gradient an implicit model trains with is from the exact one.
//
// At a fixed point z* the exact gradient solves the adjoint equation
// (solvers/adjoint.h) exactly. The model's configured backward pass may not:
// an inexact mode (jfb, phantom, unrolled), a fixed budget, or an adjoint
// solve that stopped above its tolerance. CheckGradient measures it on one
// batch: the gradient of the batch loss w.r.t. every parameter as training
// computes it ("used": the configured backward options, the adjoint warm
// start from training's last solution, and during pretraining the unrolled
// depth), and with a reference backward pass, ift with GMRES to a relative
// adjoint residual of ReferenceTolerance(dtype) ("reference"), at the same
// weights. Every implicit layer takes the reference options: the model's own,
// the energy attentions inside its cells (model.attention) and the Hopfield
// readouts, so the reference is exact for nested solves as well. A reference
// that does not meet its tolerance gives no cosine: the check says "no
// reference" and why. The model runs in eval mode (no dropout draws, so
// training's random streams are untouched); its warm starts and depth are
// restored afterwards.
//
// This is the one gradient check of a run: the trainer runs it at every
// evaluation (eval.gradient_check_batch_size), and its figures are the same
// in the metrics (grad_cos, grad_rel_err), the progress output, summary.json
// (gradient_check, and the smallest cosine in equilibrium) and compare's
// report.
#pragma once

#include <limits>
#include <string>
#include <vector>

#include "layers/models.h"
#include "solvers/adjoint.h"
#include "training/data/dataset.h"

namespace stillpoint {

struct GradientCheck {
  bool ran = false;  // false for a model without any implicit layer
  // cos(used, reference) and ||used - reference|| / ||reference|| over the
  // flattened parameter gradients (NaN when a gradient is zero, and when
  // there is no reference).
  double cosine = std::numeric_limits<double>::quiet_NaN();
  double relative_error = std::numeric_limits<double>::quiet_NaN();
  // The reference adjoint solves: the tolerance they had to meet, the worst
  // relative residual and status over the implicit layers.
  double reference_tolerance = std::numeric_limits<double>::quiet_NaN();
  double reference_residual = std::numeric_limits<double>::quiet_NaN();
  std::string reference_status;
  // Non-empty when the reference did not converge: why ("the reference
  // adjoint stopped at 3.2e-06 > 1e-06 (MAX_ITERATIONS)"); cosine and
  // relative_error are then NaN.
  std::string no_reference;
  // The depth override the used gradient was taken at (the unrolled steps of
  // pretraining; 0: the implicit solve).
  int64_t used_depth = 0;
  // The used backward pass's brief report (the model's own implicit layer,
  // else the first energy attention).
  std::string used_brief;
  // Max over the probe batch of the power-iteration estimate of the spectral
  // radius of J_f at z* (solvers/regularizers.h): the fixed_point adjoint
  // converges only below 1. Models of kind implicit (the cell) and energy
  // (the block's update); NaN otherwise.
  double spectral_radius = std::numeric_limits<double>::quiet_NaN();
  // The signed dominant eigenvalue behind that radius (the Rayleigh quotient
  // of its sample, SpectralRadiusResult::dominant_eigenvalue): near
  // -spectral_radius the map overshoots (damping contracts it), near
  // +spectral_radius it expands (a saddle of an energy). NaN with the radius.
  double spectral_eigenvalue = std::numeric_limits<double>::quiet_NaN();

  bool has_reference() const { return ran && no_reference.empty(); }

  // "gradient check: cos 0.99998, rel err 6.1e-03 against ift/gmres to 1e-05
  // (reached 3.2e-08); spectral radius of J_f 0.93 (eigenvalue -0.93)", or "gradient check: no
  // reference (...)".
  std::string Line() const;
};

// The relative adjoint residual the reference must reach: 1e-10 in float64;
// 1e-5 in float32, whose VJPs (rounded to float32) limit the residual to
// about 1e-6 / (1 - rho).
double ReferenceTolerance(DType dtype);

// The reference backward options: ift, GMRES(100), ReferenceTolerance(dtype),
// at most 400 iterations per solve. CheckGradient gives the energy
// attentions inside the cells (whose reference solves run inside every outer
// VJP) a tenth of that tolerance, and accepts an inner solve that stopped
// between the two.
BackwardOptions ReferenceBackwardOptions(DType dtype = DType::kFloat64);

// Flattened gradient of the batch loss w.r.t. every parameter (zeros where a
// parameter gets none); the parameters' gradients are zero afterwards.
std::vector<double> ParameterGradient(SequenceModel& model, const Batch& batch);

// Whether the model has an implicit layer whose gradient CheckGradient
// probes: its own (implicit and energy kinds), an energy attention inside its
// cells, or a Hopfield pooling or lookup.
bool HasImplicitLayer(const SequenceModel& model);

// used_depth > 0: the used gradient is that of the model at this depth
// override (pretraining's unrolled steps); the reference is the implicit
// gradient whatever it is.
GradientCheck CheckGradient(SequenceModel& model, const Batch& batch, int64_t used_depth = 0);

// The fixed probe batch of the checks: the first `size` examples of a
// shuffle of `dataset` with a seed of its own, the same in every run.
Batch GradientProbeBatch(const Dataset& dataset, int64_t size, DType dtype);

}  // namespace stillpoint
