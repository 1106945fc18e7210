// How far the gradient an implicit model trains with is from the exact one.
//
// At a fixed point z* the exact gradient solves the adjoint equation
// (solvers/adjoint.h) exactly. The model's configured backward pass may not:
// an inexact mode (jfb, phantom, unrolled), a fixed budget, or an adjoint
// solve that stopped above its tolerance. CheckGradient measures it on one
// batch: the gradient of the batch loss w.r.t. every parameter with the
// configured backward options ("used"), and with a reference backward pass,
// ift with GMRES to a relative adjoint residual of 1e-10 ("reference"), at
// the same weights and the same forward solve. Every implicit layer takes the
// reference options: the model's own and the energy attentions inside its
// cells (model.attention), so the reference is exact for nested solves as
// well. The model runs in eval mode
// (no dropout draws, so training's random streams are untouched) and
// without the adjoint warm start, both restored afterwards.
#pragma once

#include <limits>
#include <string>
#include <vector>

#include "layers/models.h"
#include "solvers/adjoint.h"
#include "training/dataset.h"

namespace stillpoint {

struct GradientCheck {
  bool ran = false;  // false for a model without any implicit layer
  // cos(used, reference) and ||used - reference|| / ||reference|| over the
  // flattened parameter gradients (NaN when a gradient is zero).
  double cosine = std::numeric_limits<double>::quiet_NaN();
  double relative_error = std::numeric_limits<double>::quiet_NaN();
  // The reference adjoint solves: the worst relative residual and status
  // over the implicit layers. In float32 the VJPs limit it to about 1e-6;
  // the status says whether 1e-10 was reached.
  double reference_residual = std::numeric_limits<double>::quiet_NaN();
  std::string reference_status;
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

  // "gradient check: cos 0.99998, rel err 6.1e-03 against ift/gmres to 1e-10
  // (reached 3.2e-08, MAX_ITERATIONS); spectral radius of J_f 0.93
  // (eigenvalue -0.93)".
  std::string Line() const;
};

// The reference backward options: ift, GMRES(50), tolerance 1e-10, at most
// 100 iterations per solve. In float32 the residual stops falling near 1e-6
// well before that; the bound keeps nested solves (an energy attention inside
// the cell, whose reference solve runs inside every outer VJP) affordable.
BackwardOptions ReferenceBackwardOptions();

// Flattened gradient of the batch loss w.r.t. every parameter (zeros where a
// parameter gets none); the parameters' gradients are zero afterwards.
std::vector<double> ParameterGradient(SequenceModel& model, const Batch& batch);

// Whether the model has an implicit layer whose gradient CheckGradient
// probes: its own (implicit and energy kinds), an energy attention inside its
// cells, or a Hopfield pooling or lookup.
bool HasImplicitLayer(const SequenceModel& model);

GradientCheck CheckGradient(SequenceModel& model, const Batch& batch);

// The fixed probe batch of the checks: the first `size` examples of a
// shuffle of `dataset` with a seed of its own, the same in every run.
Batch GradientProbeBatch(const Dataset& dataset, int64_t size, DType dtype);

}  // namespace stillpoint
