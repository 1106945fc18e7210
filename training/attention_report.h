// The energy attentions' side of a training run: their inner solves and
// their collapse diagnostics (layers/energy_attention.h) as metrics columns,
// and the warning a user sees when a block's heads collapse.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "layers/models.h"
#include "training/data/dataset.h"
#include "training/experiment.h"

namespace stillpoint {

// The metrics columns this file writes (all "attn_...").
const std::vector<std::string>& AttentionColumns();

// The inner solves of a step (AttentionForwardStats and
// AttentionBackwardStats of experiment.h): attn_iters, attn_residual,
// attn_bwd_iters, attn_bwd_residual, attn_unconverged (empty for a model
// without energy attention).
std::map<std::string, double> AttentionSolverColumns(const SolverStats& forward,
                                                     const SolverStats& backward);

// Diagnostics on the first `examples` held-out examples: attn_entropy_first,
// attn_entropy, attn_max_weight_first, attn_max_weight (means over the
// attentions), attn_move (their mean relative move), attn_monotone (1 when
// every energy decreased monotonically), attn_spectral_radius and
// attn_spectral_eigenvalue (the largest radius of an attention's update map
// at its solved state, and its signed eigenvalue). Appends to *warnings a line naming
// each attention that collapsed and is not yet in *warned (which it joins).
std::map<std::string, double> AttentionDiagnosticColumns(SequenceModel& model,
                                                         const Dataset& test,
                                                         int64_t examples,
                                                         DType dtype,
                                                         std::set<std::string>* warned,
                                                         std::vector<std::string>* warnings);

// One progress line from a metrics row holding the columns above:
// "energy attention: largest weight 0.58 -> 0.94, entropy 1.62 -> 0.31,
// move 0.41, energy monotone, inner iterations 5.2 (residual 8.1e-05)".
std::string AttentionSummaryLine(const std::map<std::string, double>& row);

}  // namespace stillpoint
