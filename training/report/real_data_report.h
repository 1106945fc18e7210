// The comparison report's sections for real data (training/report/compare_report.h):
// for classification runs, each variant's per-class held-out accuracy and its
// confusion matrix (RUN_DIR/confusion.svg); for language models (task.kind
// text), each variant's held-out nats and bits per character and a sample of
// generated text beside the loss curves.
#pragma once

#include <string>
#include <vector>

#include "training/report/compare.h"

namespace stillpoint {

struct ReportSection {
  std::string markdown;
  std::string html;
};

// Empty sections when no variant has per-class accuracies / is a language
// model. `root` is the report's directory (links to the runs' files are
// relative to it).
ReportSection PerClassSection(const std::vector<VariantResult>& variants, const std::string& root);
ReportSection TextSection(const std::vector<VariantResult>& variants);

}  // namespace stillpoint
