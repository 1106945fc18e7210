// `stillpoint compare`: train several variants of one base config on the same
// task, with the same seeds and data order, and report them side by side.
//
// Variants (compare.variants):
//   explicit             model.kind=explicit (num_layers untied cells)
//   tied                 model.kind=tied (one cell unrolled, backprop)
//   implicit             model.kind=implicit with the configured backward mode
//   implicit_<mode>      implicit with model.solver.backward.mode=<mode>
//                        (ift, jfb, phantom, unrolled)
//   energy               model.kind=energy with the configured
//                        model.energy.layer
//   energy_<layer>       energy with model.energy.layer=<layer>, any name of
//                        EnergyBlockRegistry() (hopfield, probabilistic,
//                        expfam, energy_transformer)
//
// The report (RUN_DIR/report.md and report.html with the plots inline, plus
// one run directory per variant) holds, per variant: parameters, final
// train/test loss and accuracy, median wall time per step, peak tensor
// memory, forward and backward solver iterations and residuals (the energy
// block's solve for energy variants), and for
// inexact backward modes the cosine between their gradient and the ift
// gradient on a probe batch; and the plots: loss and accuracy curves of all
// variants, test accuracy against test-time solver iterations (implicit and
// energy) and
// unroll depth (tied; explicit at its depth), and test accuracy against
// sequence length beyond the training length (eval.lengths).
#pragma once

#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include "training/config.h"
#include "training/trainer.h"

namespace stillpoint {

struct VariantResult {
  std::string name;
  std::vector<std::string> overrides;  // applied to the base config
  std::string run_dir;
  TrainSummary train;
  // Cosine between this variant's gradient and the ift gradient of the same
  // trained model on a probe batch (NaN where it does not apply).
  double gradient_cosine_vs_ift = 0;
  std::vector<std::pair<double, double>> accuracy_vs_depth;   // (iterations or depth, acc)
  std::vector<std::pair<double, double>> accuracy_vs_length;  // (length, acc)
};

struct CompareReport {
  std::vector<VariantResult> variants;
  std::string table;  // the summary table as printed
  std::string markdown_path;
  std::string html_path;
  // SIGINT or SIGTERM stopped the comparison during the last variant in
  // `variants` (its run directory holds a checkpoint of the step reached);
  // no report was written. 0 otherwise.
  int stop_signal = 0;
};

// Throws ConfigError naming the key when compare.variants is empty, holds
// an unknown variant or one twice, or when a variant's config does not
// build (BuildExperiment) or train (CheckTrainingConfig): every variant is
// checked before the first one trains. config_path resolves relative data
// paths as BuildExperiment does.
void ValidateCompareVariants(const Config& config, const std::string& config_path = "");

// The overrides that turn the base config into the named variant.
std::vector<std::string> VariantOverrides(const std::string& variant);

// The report directory (log.dir, or runs/<config name>) is locked for the
// comparison and must be empty unless `overwrite` (which also overwrites
// each variant's run directory in it).
CompareReport RunComparison(const Config& base, const std::string& config_path,
                            std::ostream* progress, bool overwrite = false);

}  // namespace stillpoint
