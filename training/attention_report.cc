#include "training/attention_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "framework/ops.h"
#include "training/experiment.h"

namespace stillpoint {

const std::vector<std::string>& AttentionColumns() {
  static const std::vector<std::string> columns = {
      "attn_iters",         "attn_residual",         "attn_bwd_iters",  "attn_bwd_residual",
      "attn_unconverged",   "attn_entropy_first",    "attn_entropy",    "attn_max_weight_first",
      "attn_max_weight",    "attn_move",             "attn_monotone",   "attn_spectral_radius",
      "attn_spectral_eigenvalue"};
  return columns;
}

std::map<std::string, double> AttentionSolverColumns(const SolverStats& forward,
                                                     const SolverStats& backward) {
  std::map<std::string, double> row;
  if (forward.converged + forward.not_converged + forward.inexact == 0) return row;
  row["attn_iters"] = forward.iterations_mean;
  row["attn_residual"] = forward.residual_max;
  row["attn_unconverged"] = static_cast<double>(forward.not_converged);
  if (backward.converged + backward.not_converged + backward.inexact > 0) {
    row["attn_bwd_iters"] = backward.iterations_mean;
    // Inexact backward modes measure no residual: the column stays empty.
    if (backward.HasResidual()) row["attn_bwd_residual"] = backward.residual_max;
  }
  return row;
}

std::map<std::string, double> AttentionDiagnosticColumns(SequenceModel& model,
                                                         const Dataset& test,
                                                         int64_t examples,
                                                         DType dtype,
                                                         std::set<std::string>* warned,
                                                         std::vector<std::string>* warnings) {
  std::map<std::string, double> row;
  std::vector<int64_t> indices;
  for (int64_t i = 0; i < std::min(examples, test.size()); ++i) indices.push_back(i);
  if (indices.empty()) return row;
  const Batch batch = MakeBatch(test, indices, dtype);
  const bool was_training = model.is_training();
  model.Eval();
  NoGrad no_grad;
  const Var u = EmbedBatch(model, batch);
  const auto diagnostics = model.DiagnoseAttention(u);
  model.Train(was_training);
  if (diagnostics.empty()) return row;
  double n = static_cast<double>(diagnostics.size());
  bool monotone = true;
  double radius = std::numeric_limits<double>::quiet_NaN();
  double eigenvalue = radius;
  for (const auto& [name, d] : diagnostics) {
    if (!std::isnan(d.spectral_radius) && !(d.spectral_radius <= radius)) {
      radius = d.spectral_radius;
      eigenvalue = d.dominant_eigenvalue;
    }
    row["attn_entropy_first"] += d.entropy_first / n;
    row["attn_entropy"] += d.entropy_fixed_point / n;
    row["attn_max_weight_first"] += d.max_weight_first / n;
    row["attn_max_weight"] += d.max_weight_fixed_point / n;
    row["attn_move"] += d.relative_move / n;
    monotone = monotone && d.energy_monotone;
    if (d.collapsed && warned->insert(name).second) {
      char line[256];
      std::snprintf(line, sizeof(line),
                    "warning: energy attention '%s' may have collapsed: its solve snaps the "
                    "queries onto single keys (mean largest weight %.2f at the first iterate, "
                    "%.2f at the fixed point); if accuracy stalls, see docs/energy-layers.md, "
                    "operating points",
                    name.c_str(), d.max_weight_first, d.max_weight_fixed_point);
      warnings->push_back(line);
    }
  }
  row["attn_monotone"] = monotone ? 1.0 : 0.0;
  if (!std::isnan(radius)) {
    row["attn_spectral_radius"] = radius;
    row["attn_spectral_eigenvalue"] = eigenvalue;
  }
  return row;
}

std::string AttentionSummaryLine(const std::map<std::string, double>& row) {
  auto at = [&](const char* column) {
    const auto it = row.find(column);
    return it == row.end() ? std::numeric_limits<double>::quiet_NaN() : it->second;
  };
  char line[320];
  std::snprintf(line, sizeof(line),
                "energy attention: largest weight %.2f -> %.2f, entropy %.2f -> %.2f, move %.2f, "
                "energy %s",
                at("attn_max_weight_first"), at("attn_max_weight"), at("attn_entropy_first"),
                at("attn_entropy"), at("attn_move"),
                at("attn_monotone") == 1.0 ? "monotone" : "not monotone");
  std::string text = line;
  if (std::isfinite(at("attn_iters"))) {
    std::snprintf(line, sizeof(line), ", inner iterations %.1f (residual %.2g)", at("attn_iters"),
                  at("attn_residual"));
    text += line;
  }
  return text;
}

}  // namespace stillpoint
