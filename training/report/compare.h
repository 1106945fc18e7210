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
//                        EnergyBlockRegistry() (the built-ins of
//                        layers/energy_block_list.h, or a user's)
//   ATTENTION/KIND       a cell of the attention x kind grid: KIND (one of
//                        the above but energy_<layer>) with
//                        model.attention=ATTENTION (softmax or an energy
//                        attention); ATTENTION/energy is the energy kind
//                        with that block. compare.attention x compare.kinds
//                        lists them all; the report then opens with one
//                        table attention x kind.
//
// Seeds (compare.seeds): each variant trains once per seed, in
// RUN_DIR/<variant>/seed-<N>; the report pools a variant's seeds (mean ±
// standard deviation in the tables, shaded bands in the plots). Without
// compare.seeds each variant trains once with `seed`, in RUN_DIR/<variant>.
//
// The report (RUN_DIR/report.md and report.html with the plots inline, plus
// one run directory per variant; training/report/compare_report.h) holds, per variant: parameters, final
// train/test loss and accuracy, median wall time per step, peak tensor
// memory, forward and backward solver iterations, residuals beside their
// tolerance and status counts (the energy block's solve for energy
// variants), and for every variant with an implicit layer the cosine and
// relative error between its gradient and the reference gradient on a probe
// batch; and the plots: loss and accuracy curves of all variants, gradient
// quality at every evaluation (variants with an implicit layer), test
// accuracy against test-time solver iterations (implicit and energy) and
// unroll depth (tied; explicit at its depth), and test accuracy against
// sequence length beyond the training length (eval.lengths).
#pragma once

#include <iosfwd>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "training/config/config.h"
#include "training/trainer.h"

namespace stillpoint {

// Held-out accuracy at one input scale (a length or a size) and one
// test-time depth.
struct ScaleDepthResult {
  double scale = 0;
  double depth = 0;
  double accuracy = 0;
  double solved_fraction = 0;
};

struct VariantResult {
  std::string name;
  int64_t seed = 0;  // the config's seed this run trained with
  std::vector<std::string> overrides;  // applied to the base config
  std::string run_dir;
  TrainSummary train;
  // Cosine and relative error between the gradient this variant trains with
  // and the reference gradient (training/gradient_check.h) at the run's last
  // evaluation: train.gradient_check's, the same figure as summary.json's
  // (NaN for variants without an implicit layer, and without a converged
  // reference).
  double gradient_cosine_vs_ift = std::numeric_limits<double>::quiet_NaN();
  double gradient_relative_error_vs_ift = std::numeric_limits<double>::quiet_NaN();
  std::vector<std::pair<double, double>> accuracy_vs_depth;   // (iterations or depth, acc)
  std::vector<std::pair<double, double>> accuracy_vs_length;  // (length, acc)
  // The report's heat map: eval.lengths (or eval.sizes) x
  // eval.iterations_sweep (an explicit model: its one depth).
  std::string scale_name;  // "length (task.length)" or "size (cells per side)"
  std::vector<ScaleDepthResult> scale_depth;
  // The first evaluated step whose held-out accuracy reached
  // kTargetAccuracy, and the wall time of the training steps until then
  // (the metrics' train_s: evaluations not included; NaN when never
  // reached).
  double steps_to_target = std::numeric_limits<double>::quiet_NaN();
  double seconds_to_target = std::numeric_limits<double>::quiet_NaN();
  // The same for the run's own final held-out accuracy: the first evaluated
  // step within kFinalAccuracyMargin of it.
  double steps_to_final = std::numeric_limits<double>::quiet_NaN();
  double seconds_to_final = std::numeric_limits<double>::quiet_NaN();
  // The energy attentions' mean largest weight at the first iterate and at
  // the fixed point, at the last eval (NaN without energy attention).
  double max_weight_first = std::numeric_limits<double>::quiet_NaN();
  double max_weight_fixed_point = std::numeric_limits<double>::quiet_NaN();
};

// Fills the gradient figures of `variant` from its run's gradient check.
void SetGradientFigures(VariantResult* variant);

// The held-out accuracy whose time to reach compare reports.
inline constexpr double kTargetAccuracy = 0.98;
// "Reached its final accuracy": within one percentage point of it.
inline constexpr double kFinalAccuracyMargin = 0.01;

struct CompareReport {
  std::vector<VariantResult> variants;
  // The full table (report.md and report.html).
  std::string table;
  // The console's: variant, seeds, test acc, ms/step, to 98%, grad cos,
  // stop and equilibrium verdict, fitting 100 columns.
  std::string console_table;
  // With compare.attention: the attention x kind table (held-out accuracy,
  // ms/step, steps to kTargetAccuracy per cell); empty otherwise.
  std::string grid;
  std::string markdown_path;
  std::string html_path;
  // SIGINT or SIGTERM stopped the comparison during the last variant in
  // `variants` (its run directory holds a checkpoint of the step reached);
  // no report was written. 0 otherwise.
  int stop_signal = 0;
};

// Whether any run of the comparison stopped early (train.on_nonfinite,
// train.on_unconverged, failed ranks): `stillpoint compare` then exits 1.
bool AnyStoppedEarly(const CompareReport& report);

// The variants to train: the attention x kind grid (ATTENTION/KIND) when
// compare.attention is set, else compare.variants.
std::vector<std::string> CompareVariants(const Config& config);

// Throws ConfigError naming the key when the variants are empty, hold an
// unknown variant or one twice, or when a variant's config does not build
// (BuildExperiment) or train (CheckTrainingConfig): every variant is checked
// before the first one trains. config_path resolves relative data paths as
// BuildExperiment does.
void ValidateCompareVariants(const Config& config, const std::string& config_path = "");

// The overrides that turn the base config into the named variant.
std::vector<std::string> VariantOverrides(const std::string& variant);
// VariantOverrides(variant) for a comparison of base, plus the overrides
// that set base's model.regularization.* keys the variant does not fit
// (RegularizationKeyApplies) back to their defaults, and model.solver.init
// for a variant without a fixed point of its own (explicit, tied).
std::vector<std::string> VariantConfigOverrides(const Config& base, const std::string& variant);

// The report directory (log.dir, or runs/<config name>) is locked for the
// comparison and must be empty unless `overwrite` (which also overwrites
// each variant's run directory in it).
CompareReport RunComparison(const Config& base, const std::string& config_path,
                            std::ostream* progress, bool overwrite = false);

}  // namespace stillpoint
