#include "training/report/compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <limits>
#include <map>
#include <optional>
#include <ostream>
#include <sstream>

#include "framework/ops.h"
#include "layers/energy_attention.h"
#include "layers/energy_block.h"
#include "solvers/adjoint/backward_options.h"
#include "training/report/compare_report.h"
#include "training/config_schema.h"
#include "training/distributed.h"
#include "training/distributed_training.h"
#include "training/experiment.h"
#include "training/gradient_check.h"
#include "training/memory_estimate.h"
#include "training/metrics.h"
#include "training/output_policy.h"
#include "training/run_directory.h"
#include "training/svg_plot.h"
#include "training/trainer_options.h"

namespace stillpoint {
namespace {

std::vector<double> DepthSweep(const Config& config) {
  std::vector<double> sweep = config.GetDoubleList("eval.iterations_sweep");
  if (sweep.empty()) sweep = {1, 2, 4, 8, 16, 32};
  return sweep;
}

// The report's heat map: every scale of eval.sizes (else eval.lengths) at
// every depth of the sweep (an explicit model at its one depth).
void MeasureScaleDepthGrid(const Config& config, const std::string& config_path,
                           const SequenceModel& model, VariantResult* v) {
  const std::vector<double> sizes = config.GetDoubleList("eval.sizes");
  const bool by_size = !sizes.empty();
  const std::vector<double> scales = by_size ? sizes : config.GetDoubleList("eval.lengths");
  v->scale_name = by_size ? "size (cells per side)" : "length (task.length)";
  const bool has_depth = model.implicit() != nullptr || model.options().kind == ModelKind::kTied;
  const std::vector<double> depths =
      has_depth ? DepthSweep(config)
                : std::vector<double>{static_cast<double>(model.options().num_layers)};
  for (double scale : scales) {
    const auto s = static_cast<int64_t>(scale);
    Experiment at = BuildExperiment(config, config_path, by_size ? 0 : s, by_size ? s : 0);
    at.model->LoadParameters(model.NamedValues());
    for (double depth : depths) {
      Config c = config;
      if (has_depth) c.Set("eval.max_iterations=" + std::to_string(static_cast<int64_t>(depth)));
      SetEvalDepth(*at.model, c, at.test->info().length);
      const EvalResult r =
          Evaluate(*at.model, *at.test, config.GetInt("eval.batch_size"), at.dtype);
      v->scale_depth.push_back({scale, depth, r.accuracy, r.solved_fraction});
    }
  }
}

}  // namespace

namespace {

// compare.kinds' kinds for its error: every model kind, and implicit_<mode>.
std::string CompareKindsText() {
  std::string text;
  const std::vector<std::string> kinds = ModelKindNames();
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    text += (i == 0 ? "" : i + 1 == kinds.size() ? " and " : ", ") + kinds[i];
    if (kinds[i] == "implicit") text += ", implicit_<mode>";
  }
  return text;
}

// compare.variants' variants for its error: every model kind, each backward
// mode as implicit_<mode>, each energy block as energy_<layer>.
std::string KnownVariantsText() {
  std::string known;
  for (const std::string& kind : ModelKindNames()) {
    known += (known.empty() ? "" : ", ") + kind;
    if (kind == "implicit") {
      for (BackwardMode mode : AllBackwardModes()) {
        known += std::string(", implicit_") + ToString(mode);
      }
    } else if (kind == "energy") {
      for (const std::string& layer : EnergyBlockRegistry().Names()) known += ", energy_" + layer;
    }
  }
  return known;
}

}  // namespace

std::vector<std::string> VariantOverrides(const std::string& variant) {
  const std::size_t slash = variant.find('/');
  if (slash != std::string::npos) {
    // ATTENTION/KIND: a cell of the attention x kind grid.
    const std::string attention = variant.substr(0, slash);
    const std::string kind = variant.substr(slash + 1);
    const std::vector<std::string> attentions = AttentionKindNames();
    if (std::find(attentions.begin(), attentions.end(), attention) == attentions.end()) return {};
    if (kind == "energy") {
      if (attention == "softmax") return {};  // the energy kind needs an energy attention
      return {"model.kind=energy", "model.attention=" + attention};
    }
    if (kind.find('/') != std::string::npos || kind.rfind("energy", 0) == 0) return {};
    std::vector<std::string> overrides = VariantOverrides(kind);
    if (overrides.empty()) return {};
    overrides.push_back("model.attention=" + attention);
    return overrides;
  }
  for (const std::string& kind : ModelKindNames()) {
    if (variant == kind) return {"model.kind=" + variant};
  }
  for (BackwardMode mode : AllBackwardModes()) {
    if (variant == std::string("implicit_") + ToString(mode)) {
      return {"model.kind=implicit", std::string("model.solver.backward.mode=") + ToString(mode)};
    }
  }
  for (const std::string& layer : EnergyBlockRegistry().Names()) {
    if (variant == "energy_" + layer) return {"model.kind=energy", "model.energy.layer=" + layer};
  }
  return {};
}

void SetGradientFigures(VariantResult* v) {
  const GradientCheck& check = v->train.gradient_check;
  v->gradient_cosine_vs_ift = check.ran ? check.cosine : kNaN;
  v->gradient_relative_error_vs_ift = check.ran ? check.relative_error : kNaN;
}

bool AnyStoppedEarly(const CompareReport& report) {
  for (const VariantResult& v : report.variants) {
    if (v.train.stopped_early) return true;
  }
  return false;
}

namespace {

// One entry of compare.overrides, VARIANT:KEY=VALUE, split; false when it
// has no ':' before its '='.
bool SplitVariantOverride(const std::string& entry, std::string* variant, std::string* setting) {
  const std::size_t colon = entry.find(':');
  const std::size_t equals = entry.find('=');
  if (colon == std::string::npos || equals == std::string::npos || equals < colon) return false;
  const auto trim = [](const std::string& text) {
    const std::size_t first = text.find_first_not_of(' ');
    const std::size_t last = text.find_last_not_of(' ');
    return first == std::string::npos ? std::string() : text.substr(first, last - first + 1);
  };
  *variant = trim(entry.substr(0, colon));
  *setting = trim(entry.substr(colon + 1));
  return !variant->empty() && setting->find('=') > 0;
}

// The comparison's settings for a variant: model.solver.init applies to the
// variants that solve a fixed point of their own (implicit, energy), and
// each model.regularization.* key to the variants it fits
// (RegularizationKeyApplies); the others get their defaults back (the
// trainer refuses them).
void ResetInapplicableSettings(const Config& probe, std::vector<std::string>* overrides) {
  const std::string kind = probe.GetString("model.kind");
  if (kind != "implicit" && kind != "energy" && probe.GetString("model.solver.init") != "zeros") {
    overrides->push_back("model.solver.init=zeros");
  }
  const std::string attention = probe.GetString("model.attention");
  const RegularizationOptions given = RegularizationOptions::FromConfig(probe);
  const RegularizationOptions defaults;
  for (const auto& field : RegularizationOptions::Fields().fields()) {
    if (field.in_config && field.Text(given) != field.Text(defaults) &&
        !RegularizationKeyApplies(field.name, kind, attention)) {
      overrides->push_back("model.regularization." + field.name + "=" + field.Text(defaults));
    }
  }
}

}  // namespace

std::vector<std::string> VariantConfigOverrides(const Config& base, const std::string& variant) {
  std::vector<std::string> overrides = VariantOverrides(variant);
  Config probe = base;
  for (const std::string& o : overrides) probe.Set(o);
  const std::string kind = probe.GetString("model.kind");
  ResetInapplicableSettings(probe, &overrides);
  // The progressive loss needs a cell that runs any number of steps: the
  // explicit and energy variants train without it.
  if (kind != "tied" && kind != "implicit" &&
      probe.GetDouble("train.progressive_loss.weight") > 0) {
    overrides.push_back("train.progressive_loss.weight=0");
  }
  for (const std::string& entry : base.GetStringList("compare.overrides")) {
    std::string name, setting;
    if (SplitVariantOverride(entry, &name, &setting) && name == variant) {
      overrides.push_back(setting);
    }
  }
  return overrides;
}

std::vector<std::string> CompareVariants(const Config& config) {
  const std::vector<std::string> attentions = config.GetStringList("compare.attention");
  if (attentions.empty()) return config.GetStringList("compare.variants");
  std::vector<std::string> variants;
  for (const std::string& attention : attentions) {
    for (const std::string& kind : config.GetStringList("compare.kinds")) {
      if (attention == "softmax" && kind == "energy") continue;  // no such model
      variants.push_back(attention + "/" + kind);
    }
  }
  return variants;
}

void ValidateCompareVariants(const Config& config, const std::string& config_path) {
  const std::vector<std::string> attentions = config.GetStringList("compare.attention");
  const std::vector<std::string> known_attentions = AttentionKindNames();
  for (const std::string& attention : attentions) {
    if (std::find(known_attentions.begin(), known_attentions.end(), attention) ==
        known_attentions.end()) {
      std::string known;
      for (const std::string& a : known_attentions) known += (known.empty() ? "" : ", ") + a;
      std::string message = config.Origin("compare.attention") + ": unknown attention '" +
                            attention + "' in compare.attention (known: " + known + ")";
      const std::string closest = ClosestName(attention, known_attentions);
      if (!closest.empty()) message += "; did you mean '" + closest + "'?";
      throw ConfigError(message);
    }
  }
  const std::string key = attentions.empty() ? "compare.variants" : "compare.kinds";
  const std::vector<std::string> variants = CompareVariants(config);
  if (variants.empty()) {
    throw ConfigError(config.Origin(key) + ": " + key + " is empty");
  }
  for (std::size_t i = 0; i < variants.size(); ++i) {
    if (std::find(variants.begin(), variants.begin() + i, variants[i]) != variants.begin() + i) {
      // Both would train into one run directory.
      throw ConfigError(config.Origin(key) + ": variant '" + variants[i] + "' appears twice in " +
                        key);
    }
  }
  for (const std::string& v : variants) {
    if (VariantOverrides(v).empty()) {
      if (!attentions.empty()) {
        throw ConfigError(config.Origin(key) + ": unknown kind in variant '" + v +
                          "' (compare.kinds takes " + CompareKindsText() + ")");
      }
      throw ConfigError(config.Origin("compare.variants") + ": unknown variant '" + v +
                        "' in compare.variants (known: " + KnownVariantsText() + ")");
    }
  }
  const std::vector<double> seeds = config.GetDoubleList("compare.seeds");
  for (std::size_t i = 0; i < seeds.size(); ++i) {
    if (seeds[i] != std::floor(seeds[i])) {
      throw ConfigError(config.Origin("compare.seeds") + ": compare.seeds holds " +
                        config.ValueText("compare.seeds") + "; seeds are whole numbers");
    }
    if (std::find(seeds.begin(), seeds.begin() + i, seeds[i]) != seeds.begin() + i) {
      throw ConfigError(config.Origin("compare.seeds") + ": seed " +
                        std::to_string(static_cast<int64_t>(seeds[i])) +
                        " appears twice in compare.seeds");
    }
  }
  for (const std::string& entry : config.GetStringList("compare.overrides")) {
    std::string name, setting;
    if (!SplitVariantOverride(entry, &name, &setting)) {
      throw ConfigError(config.Origin("compare.overrides") + ": compare.overrides entry '" +
                        entry + "' is not VARIANT:KEY=VALUE");
    }
    if (std::find(variants.begin(), variants.end(), name) == variants.end()) {
      std::string trained;
      for (const std::string& v : variants) trained += (trained.empty() ? "" : ", ") + v;
      throw ConfigError(config.Origin("compare.overrides") + ": compare.overrides entry '" +
                        entry + "' names variant '" + name + "', which this comparison does "
                        "not train (it trains " + trained + ")");
    }
  }
  // Each variant's own settings, so a bad one is found before the first
  // variant spends its training time.
  for (const std::string& v : variants) {
    Config variant = config;
    try {
      for (const std::string& o : VariantConfigOverrides(config, v)) variant.Set(o);
      CheckMemoryFits(variant, /*training=*/true);
      BuildExperiment(variant, config_path);
      CheckTrainingConfig(variant);
    } catch (const ConfigError& e) {
      throw ConfigError("variant '" + v + "' of " + key + ": " + e.what());
    } catch (const Error& e) {
      throw ConfigError("variant '" + v + "' of " + key + ": " + e.what());
    }
  }
}

namespace {

// The variant `name` of a comparison in `root`, trained with the
// seed_index-th of compare.seeds (none: the config's seed).
VariantResult NewVariant(const Config& base, const std::string& root, const std::string& name,
                         const std::vector<double>& seeds, std::size_t seed_index) {
  VariantResult v;
  v.name = name;
  v.overrides = VariantConfigOverrides(base, name);
  v.run_dir = (std::filesystem::path(root) / name).string();
  v.seed = base.GetInt("seed");
  if (!seeds.empty()) {
    v.seed = static_cast<int64_t>(seeds[seed_index]);
    v.overrides.push_back("seed=" + std::to_string(v.seed));
    v.run_dir = (std::filesystem::path(v.run_dir) / ("seed-" + std::to_string(v.seed))).string();
  }
  return v;
}

// The trained model's accuracy against its test-time depth and, with the
// trained weights, against the lengths of eval.lengths.
void MeasureSweeps(const Config& config, const std::string& config_path, const Experiment& e,
                   VariantResult* v) {
  SequenceModel& model = *e.model;
  const int64_t eval_batch = config.GetInt("eval.batch_size");
  // Test-time compute: solver budget (implicit) or unroll depth (tied).
  if (model.implicit() != nullptr || model.options().kind == ModelKind::kTied) {
    for (double depth : DepthSweep(config)) {
      Config at = config;
      at.Set("eval.max_iterations=" + std::to_string(static_cast<int64_t>(depth)));
      SetEvalDepth(model, at);
      v->accuracy_vs_depth.emplace_back(depth,
                                        Evaluate(model, *e.test, eval_batch, e.dtype).accuracy);
    }
    SetEvalDepth(model, config);
  } else {
    v->accuracy_vs_depth.emplace_back(static_cast<double>(model.options().num_layers),
                                      v->train.final_eval.accuracy);
  }

  // Length extrapolation with the trained weights, at the budget rule's
  // depth for each length.
  for (double length : config.GetDoubleList("eval.lengths")) {
    Experiment longer = BuildExperiment(config, config_path, static_cast<int64_t>(length));
    longer.model->LoadParameters(model.NamedValues());
    SetEvalDepth(*longer.model, config, longer.test->info().length);
    v->accuracy_vs_length.emplace_back(
        length, Evaluate(*longer.model, *longer.test, eval_batch, e.dtype).accuracy);
  }
}

// The report's description of the comparison, and its grid.
ReportHeader ComparisonHeader(const Config& base, const std::string& config_path) {
  ReportHeader header;
  std::ostringstream description;
  description << "Config `" << config_path << "`; task `" << base.GetString("task.kind") << "`, ";
  if (base.GetDoubleList("compare.seeds").empty()) {
    description << "seed " << base.GetInt("seed")
                << "; every variant trained with the same seeds and data order.";
  } else {
    description << "seeds " << base.ValueText("compare.seeds")
                << " (compare.seeds); every variant trained once per seed, with that seed's "
                   "initialisation and data order.";
  }
  header.description = description.str();
  if (!base.GetStringList("compare.attention").empty()) {
    header.grid_attentions = base.GetStringList("compare.attention");
    header.grid_kinds = base.GetStringList("compare.kinds");
  }
  return header;
}

}  // namespace

CompareReport RunComparison(const Config& base,
                            const std::string& config_path,
                            std::ostream* progress,
                            bool overwrite) {
  ValidateCompareVariants(base, config_path);
  const std::string root = RunDirectory(base, config_path);
  // Under mpirun every rank trains and evaluates each variant (training/
  // distributed.h); rank 0 alone writes.
  std::optional<RunDirectoryLock> lock;
  OnMainRank([&] {
    lock.emplace(root);
    CheckRunDirectory(root, overwrite, config_path, ComparisonFileNames());
    if (overwrite) RemoveRunFiles(root, ComparisonFileNames());
  });
  CompareReport report;
  const std::vector<double> seeds = base.GetDoubleList("compare.seeds");
  for (const std::string& name : CompareVariants(base)) {
    for (std::size_t seed_index = 0; seed_index < std::max<std::size_t>(seeds.size(), 1);
         ++seed_index) {
      VariantResult v = NewVariant(base, root, name, seeds, seed_index);
      Config config = base;
      for (const std::string& o : v.overrides) config.Set(o);
      config.Set("log.dir=" + v.run_dir);
      if (progress) {
        *progress << "\n== variant " << name
                  << (seeds.empty() ? "" : ", seed " + std::to_string(v.seed)) << " ==\n";
      }
      Experiment e = BuildExperiment(config, config_path);
      TrainOptions options;
      options.progress = progress;
      options.overwrite = overwrite;
      v.train = Train(e, options);
      Barrier();  // rank 0 has written the variant's files, which the report reads
      if (progress) *progress << v.train.BriefReport() << "\n";
      if (v.train.stop_signal != 0) {
        report.stop_signal = v.train.stop_signal;
        report.variants.push_back(std::move(v));
        return report;
      }
      SequenceModel& model = *e.model;

      // Gradient quality: the run's own check at its last evaluation, the
      // one figure of summary.json and the metrics.
      SetGradientFigures(&v);

      MeasureSweeps(config, config_path, e, &v);
      MeasureScaleDepthGrid(config, config_path, model, &v);
      OnMainRank([&] { SaveVariantResult(v); });
      report.variants.push_back(std::move(v));
    }
  }

  const ReportHeader header = ComparisonHeader(base, config_path);
  // Rank 0 alone writes (training/distributed.h); the others print nothing.
  if (IsMainRank()) WriteComparisonReport(root, header, &report);
  return report;
}

}  // namespace stillpoint
