#include "training/summary_files.h"

#include <sstream>

#include "training/confusion.h"
#include "training/metrics.h"
#include "training/provenance.h"
#include "training/summary_json.h"
#include "training/svg_plot.h"

namespace stillpoint {

std::string SummaryMarkdown(const TrainSummary& summary, const std::string& model_name) {
  std::ostringstream md;
  md << "# Run summary\n\n"
     << summary.BriefReport() << "\n\nModel: " << model_name << ", " << summary.num_parameters
     << " parameters.\n\nProvenance: " << ProvenanceMarkdown(summary.provenance) << "\n";
  if (!summary.forward.brief.empty()) {
    md << "\nLast forward solve: " << summary.forward.brief << "\n\nForward residual "
       << ResidualCell(summary.forward) << "; samples: " << StatusCell(summary.forward) << "\n";
  }
  if (!summary.backward.brief.empty()) {
    md << "\nLast backward solve: " << summary.backward.brief << "\n\nBackward residual "
       << ResidualCell(summary.backward) << "; samples: " << StatusCell(summary.backward) << "\n";
  }
  if (summary.equilibrium.applies) {
    md << "\nEquilibrium: " << summary.equilibrium.verdict << "\n";
  }
  if (summary.gradient_check.ran) {
    md << "\nAt step " << summary.gradient_check_step << ", " << summary.gradient_check.Line()
       << "\n";
  }
  if (!summary.attention_forward.brief.empty()) {
    md << "\nEnergy attention, last inner solve (worst of the model's attentions): "
       << summary.attention_forward.brief << "\n";
  }
  if (!summary.attention_backward.brief.empty()) {
    md << "\nEnergy attention, last inner adjoint: " << summary.attention_backward.brief << "\n";
  }
  if (summary.language_model) {
    md << "\nHeld-out text: " << JsonNumber(summary.final_eval.loss) << " nats per character, "
       << JsonNumber(summary.test_bpc) << " bits per character; " << summary.test_unknown_symbols
       << " held-out characters outside the vocabulary.\n";
  }
  if (summary.confusion.classes() > 0) {
    md << "\nPer-class held-out accuracy (confusion matrix: confusion.svg):\n\n"
       << PerClassAccuracyMarkdown(summary.confusion);
  }
  return md.str();
}

void WriteSummaryFiles(const TrainSummary& summary, const std::string& model_name) {
  WriteTextFile(summary.run_dir + "/summary.json", SummaryJson(summary));
  WriteTextFile(summary.run_dir + "/summary.md", SummaryMarkdown(summary, model_name));
}

}  // namespace stillpoint
