#include "training/solve_counts.h"

#include "layers/energy_attention.h"
#include "layers/hopfield.h"

namespace stillpoint {

const char* ToString(SolveFamily family) {
  switch (family) {
    case SolveFamily::kModel:
      return "model";
    case SolveFamily::kAttention:
      return "attention";
    case SolveFamily::kHopfield:
      return "hopfield";
  }
  return "?";
}

void SolveCounts::Merge(const SolveCounts& other) {
  for (SolveFamily f : kSolveFamilies) (*this)[f].Merge(other[f]);
}

bool SolveCounts::AdjointUnconverged() const {
  for (SolveFamily f : kSolveFamilies) {
    if ((*this)[f].backward.unconverged_solves > 0) return true;
  }
  return false;
}

std::string SolveCounts::ForwardFailure() const {
  for (SolveFamily f : kSolveFamilies) {
    const SolveTally& forward = (*this)[f].forward;
    if (forward.failed_solves == 0) continue;
    std::string statuses;
    for (TerminationType t : {TerminationType::kDiverged, TerminationType::kNonFinite,
                              TerminationType::kFailure}) {
      const auto it = forward.status_counts.find(ToString(t));
      if (it == forward.status_counts.end()) continue;
      statuses += (statuses.empty() ? "" : ", ") + it->first + " " + std::to_string(it->second);
    }
    return std::string("the ") + ToString(f) + " forward solve ended " + statuses +
           " (samples; their state is the solver's best iterate, not a fixed point)";
  }
  return "";
}

std::string SolveCounts::AdjointMisses() const {
  std::string out;
  for (SolveFamily f : kSolveFamilies) {
    const SolveTally& backward = (*this)[f].backward;
    if (backward.unconverged_solves == 0) continue;
    out += (out.empty() ? "" : ", ") + std::string(ToString(f)) + " " +
           std::to_string(backward.unconverged_samples()) + "/" +
           std::to_string(backward.samples);
  }
  return out;
}

SolveCounts TakeSolveCounts(const SequenceModel& model) {
  SolveCounts counts;
  if (const Implicit* layer = model.implicit()) counts[SolveFamily::kModel] = layer->TakeTally();
  for (const auto& [name, attention] : FindEnergyAttentions(model)) {
    counts[SolveFamily::kAttention].Merge(attention->implicit().TakeTally());
  }
  for (const auto& [name, hopfield] : model.HopfieldReadouts()) {
    counts[SolveFamily::kHopfield].Merge(hopfield->TakeSolveTally());
  }
  return counts;
}

void RunSolveCounts::AddStep(const SolveCounts& step) {
  solves.Merge(step);
  for (SolveFamily f : kSolveFamilies) {
    const int i = static_cast<int>(f);
    forward_unconverged_steps[i] += step[f].forward.unconverged_solves > 0;
    backward_unconverged_steps[i] += step[f].backward.unconverged_solves > 0;
    steps_with_solves[i] += step[f].forward.solves > 0 || step[f].backward.solves > 0;
  }
}

}  // namespace stillpoint
