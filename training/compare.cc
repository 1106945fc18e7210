#include "training/compare.h"

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
#include "training/config_schema.h"
#include "training/distributed.h"
#include "training/distributed_training.h"
#include "training/experiment.h"
#include "training/gradient_check.h"
#include "training/memory_estimate.h"
#include "training/metrics.h"
#include "training/run_directory.h"
#include "training/svg_plot.h"

namespace stillpoint {
namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

const std::vector<std::string> kBackwardModes = {"ift", "jfb", "phantom", "unrolled"};

std::string Scientific(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.2e", value);
  return buffer;
}

std::string Fixed(double value, int digits) {
  if (!std::isfinite(value)) return "-";
  std::ostringstream out;
  out << std::fixed << std::setprecision(digits) << value;
  return out.str();
}

// The markdown table `table` (header, |---| line, rows) as HTML rows.
std::string MarkdownTableToHtml(const std::string& table) {
  std::ostringstream html;
  html << "<table>\n";
  std::istringstream rows(table);
  std::string row;
  int index = 0;
  while (std::getline(rows, row)) {
    if (index++ == 1) continue;  // the |---| line
    html << "<tr>";
    std::istringstream cells(row);
    std::string cell;
    std::getline(cells, cell, '|');
    while (std::getline(cells, cell, '|')) {
      const auto a = cell.find_first_not_of(' '), b = cell.find_last_not_of(' ');
      html << (index == 1 ? "<th>" : "<td>")
           << (a == std::string::npos ? "" : cell.substr(a, b - a + 1))
           << (index == 1 ? "</th>" : "</td>");
    }
    html << "</tr>\n";
  }
  html << "</table>\n";
  return html.str();
}

// A curve figure's numbers: one row per x value (of any variant), one column
// per variant, accuracies in percent ("-" where a variant has no point).
std::string CurveTable(const std::vector<PlotSeries>& series, const std::string& x_name) {
  std::vector<double> xs;
  for (const PlotSeries& s : series) xs.insert(xs.end(), s.x.begin(), s.x.end());
  std::sort(xs.begin(), xs.end());
  xs.erase(std::unique(xs.begin(), xs.end()), xs.end());
  std::ostringstream table;
  table << "| " << x_name << " |";
  for (const PlotSeries& s : series) table << " " << s.name << " |";
  table << "\n|---|";
  for (std::size_t i = 0; i < series.size(); ++i) table << "---|";
  table << "\n";
  for (double x : xs) {
    table << "| " << x << " |";
    for (const PlotSeries& s : series) {
      double y = kNaN;
      for (std::size_t i = 0; i < s.x.size(); ++i) {
        if (s.x[i] == x) y = s.y[i];
      }
      table << " " << (std::isfinite(y) ? Fixed(100.0 * y, 2) + "%" : "-") << " |";
    }
    table << "\n";
  }
  return table.str();
}

// The attention x kind table: one row per attention, one column per kind;
// each cell "held-out accuracy, ms/step, steps to the target accuracy".
std::string GridTable(const CompareReport& report, const Config& config) {
  const std::vector<std::string> kinds = config.GetStringList("compare.kinds");
  std::ostringstream grid;
  grid << "| attention |";
  for (const std::string& kind : kinds) grid << " " << kind << " |";
  grid << "\n|---|";
  for (std::size_t i = 0; i < kinds.size(); ++i) grid << "---|";
  grid << "\n";
  for (const std::string& attention : config.GetStringList("compare.attention")) {
    grid << "| " << attention << " |";
    for (const std::string& kind : kinds) {
      const VariantResult* cell = nullptr;
      for (const VariantResult& v : report.variants) {
        if (v.name == attention + "/" + kind) cell = &v;
      }
      if (cell == nullptr) {
        grid << " - |";
        continue;
      }
      grid << " " << Fixed(100.0 * cell->train.final_eval.accuracy, 2) << "%, "
           << Fixed(1000.0 * cell->train.seconds_per_step, 1) << " ms, "
           << (std::isfinite(cell->steps_to_target)
                   ? std::to_string(static_cast<int64_t>(cell->steps_to_target)) + " steps"
                   : std::string("not reached"))
           << " |";
    }
    grid << "\n";
  }
  return grid.str();
}

// "mean iterations | max relative residual" of a solve, or "- | -".
std::string StatsCells(const SolverStats& stats) {
  if (stats.converged + stats.not_converged + stats.inexact == 0) return "- | -";
  return Fixed(stats.iterations_mean, 1) + " | " + ResidualCell(stats);
}

// A metrics column, empty when the run has none.
std::vector<double> Column(const std::map<std::string, std::vector<double>>& metrics,
                           const std::string& key) {
  const auto it = metrics.find(key);
  return it == metrics.end() ? std::vector<double>{} : it->second;
}

std::vector<double> DepthSweep(const Config& config) {
  std::vector<double> sweep = config.GetDoubleList("eval.iterations_sweep");
  if (sweep.empty()) sweep = {1, 2, 4, 8, 16, 32};
  return sweep;
}

}  // namespace

std::vector<std::string> AttentionNames() {
  std::vector<std::string> names = {"softmax"};
  for (const std::string& name : EnergyBlockRegistry().Names()) names.push_back(name);
  return names;
}

std::vector<std::string> VariantOverrides(const std::string& variant) {
  const std::size_t slash = variant.find('/');
  if (slash != std::string::npos) {
    // ATTENTION/KIND: a cell of the attention x kind grid.
    const std::string attention = variant.substr(0, slash);
    const std::string kind = variant.substr(slash + 1);
    const std::vector<std::string> attentions = AttentionNames();
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
  if (variant == "explicit" || variant == "tied" || variant == "implicit") {
    return {"model.kind=" + variant};
  }
  for (const std::string& mode : kBackwardModes) {
    if (variant == "implicit_" + mode) {
      return {"model.kind=implicit", "model.solver.backward.mode=" + mode};
    }
  }
  if (variant == "energy") return {"model.kind=energy"};
  for (const std::string& layer : EnergyBlockRegistry().Names()) {
    if (variant == "energy_" + layer) return {"model.kind=energy", "model.energy.layer=" + layer};
  }
  return {};
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
  const std::vector<std::string> known_attentions = AttentionNames();
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
                          "' (compare.kinds takes explicit, tied, implicit, implicit_<mode> "
                          "and energy)");
      }
      std::string known = "explicit, tied, implicit";
      for (const std::string& mode : kBackwardModes) known += ", implicit_" + mode;
      known += ", energy";
      for (const std::string& layer : EnergyBlockRegistry().Names()) known += ", energy_" + layer;
      throw ConfigError(config.Origin("compare.variants") + ": unknown variant '" + v +
                        "' in compare.variants (known: " + known + ")");
    }
  }
  // Each variant's own settings, so a bad one is found before the first
  // variant spends its training time.
  for (const std::string& v : variants) {
    Config variant = config;
    for (const std::string& o : VariantOverrides(v)) variant.Set(o);
    try {
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

CompareReport RunComparison(const Config& base, const std::string& config_path,
                            std::ostream* progress, bool overwrite) {
  ValidateCompareVariants(base, config_path);
  const std::string root = RunDirectory(base, config_path);
  // Under mpirun every rank trains and evaluates each variant (training/
  // distributed.h); rank 0 alone writes.
  std::optional<RunDirectoryLock> lock;
  OnMainRank([&] {
    lock.emplace(root);
    if (overwrite) {
      RemoveRunFiles(root);
    } else {
      RefuseNonEmptyRunDirectory(root);
    }
  });
  CompareReport report;
  const std::vector<double> lengths = base.GetDoubleList("eval.lengths");
  const int64_t eval_batch = base.GetInt("eval.batch_size");

  for (const std::string& name : CompareVariants(base)) {
    VariantResult v;
    v.name = name;
    v.overrides = VariantOverrides(name);
    v.run_dir = (std::filesystem::path(root) / name).string();
    Config config = base;
    for (const std::string& o : v.overrides) config.Set(o);
    config.Set("log.dir=" + v.run_dir);
    if (progress) *progress << "\n== variant " << name << " ==\n";
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

    // Gradient quality of every variant with an implicit layer: the
    // configured backward pass against the reference (ift, GMRES to 1e-10)
    // with the trained weights.
    v.gradient_cosine_vs_ift = kNaN;
    v.gradient_relative_error_vs_ift = kNaN;
    if (HasImplicitLayer(model)) {
      const GradientCheck check = CheckGradient(
          model, GradientProbeBatch(*e.train, config.GetInt("compare.probe_batch_size"), e.dtype));
      v.gradient_cosine_vs_ift = check.cosine;
      v.gradient_relative_error_vs_ift = check.relative_error;
    }

    // Test-time compute: solver budget (implicit) or unroll depth (tied).
    if (model.implicit() != nullptr || model.options().kind == ModelKind::kTied) {
      for (double depth : DepthSweep(config)) {
        Config at = config;
        at.Set("eval.max_iterations=" + std::to_string(static_cast<int64_t>(depth)));
        SetEvalDepth(model, at);
        v.accuracy_vs_depth.emplace_back(
            depth, Evaluate(model, *e.test, eval_batch, e.dtype).accuracy);
      }
      SetEvalDepth(model, config);
    } else {
      v.accuracy_vs_depth.emplace_back(static_cast<double>(model.options().num_layers),
                                       v.train.final_eval.accuracy);
    }

    // Length extrapolation with the trained weights.
    for (double length : lengths) {
      Experiment longer = BuildExperiment(config, config_path, static_cast<int64_t>(length));
      longer.model->LoadParameters(model.NamedValues());
      SetEvalDepth(*longer.model, config);
      v.accuracy_vs_length.emplace_back(
          length, Evaluate(*longer.model, *longer.test, eval_batch, e.dtype).accuracy);
    }
    report.variants.push_back(std::move(v));
  }

  // Each run's metrics, read once for the time to accuracy and the plots.
  std::vector<std::map<std::string, std::vector<double>>> run_metrics;
  for (const VariantResult& v : report.variants) run_metrics.push_back(ReadRunMetrics(v.run_dir));

  // ---- time to accuracy
  for (std::size_t r = 0; r < report.variants.size(); ++r) {
    VariantResult& v = report.variants[r];
    auto column = [&](const std::string& key) { return Column(run_metrics[r], key); };
    const std::vector<double> steps = column("step"), accuracy = column("test_accuracy");
    // The last evaluated collapse diagnostics (energy attentions only).
    const std::vector<double> first = column("attn_max_weight_first"),
                              fixed = column("attn_max_weight");
    for (std::size_t i = 0; i < first.size() && i < fixed.size(); ++i) {
      if (std::isfinite(first[i]) && std::isfinite(fixed[i])) {
        v.max_weight_first = first[i];
        v.max_weight_fixed_point = fixed[i];
      }
    }
    for (std::size_t i = 0; i < steps.size() && i < accuracy.size(); ++i) {
      if (std::isfinite(accuracy[i]) && accuracy[i] >= kTargetAccuracy) {
        v.steps_to_target = steps[i];
        v.seconds_to_target = steps[i] * v.train.seconds_per_step;
        break;
      }
    }
  }

  // ---- table
  std::ostringstream table;
  table << "| variant | params | train loss | test loss | test acc | ms/step | peak tensor MiB "
           "| fwd iters | fwd residual | fwd status | bwd iters | bwd residual | bwd status "
           "| attn iters | attn residual | attn bwd iters | attn bwd residual | attn max weight "
           "| grad cos vs ref | grad rel err vs ref |\n"
        << "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const VariantResult& v : report.variants) {
    const TrainSummary& t = v.train;
    const bool solved = t.forward.iterations_max > 0;
    const bool backward_ran = !t.backward.status_counts.empty();
    table << "| " << v.name << " | " << t.num_parameters << " | " << Fixed(t.final_train_loss, 4)
          << " | " << Fixed(t.final_eval.loss, 4) << " | "
          << Fixed(100.0 * t.final_eval.accuracy, 2) << "% | "
          << Fixed(1000.0 * t.seconds_per_step, 1) << " | " << Fixed(t.pool_peak_mb, 1) << " | "
          << (solved ? Fixed(t.forward.iterations_mean, 1) : "-") << " | "
          << (solved ? ResidualCell(t.forward) : "-") << " | "
          << (solved ? StatusCell(t.forward) : "-") << " | "
          << (backward_ran ? Fixed(t.backward.iterations_mean, 1) : "-") << " | "
          << ResidualCell(t.backward) << " | " << StatusCell(t.backward) << " | "
          << StatsCells(t.attention_forward) << " | " << StatsCells(t.attention_backward) << " | "
          << (std::isfinite(v.max_weight_fixed_point)
                  ? Fixed(v.max_weight_first, 2) + " -> " + Fixed(v.max_weight_fixed_point, 2)
                  : std::string("-"))
          << " | " << Fixed(v.gradient_cosine_vs_ift, 4) << " | "
          << (std::isfinite(v.gradient_relative_error_vs_ift)
                  ? Scientific(v.gradient_relative_error_vs_ift)
                  : "-")
          << " |\n";
  }
  report.table = table.str();
  if (!base.GetStringList("compare.attention").empty()) report.grid = GridTable(report, base);

  // ---- plots
  std::vector<PlotSeries> loss, accuracy, depth, length, gradient;
  for (std::size_t r = 0; r < report.variants.size(); ++r) {
    const VariantResult& v = report.variants[r];
    auto column = [&](const std::string& key) { return Column(run_metrics[r], key); };
    loss.push_back({v.name, column("step"), column("loss")});
    // Test accuracy where evaluated, train accuracy otherwise would mix: plot both.
    accuracy.push_back({v.name + " (test)", column("step"), column("test_accuracy"), true});
    // Rows without a check are NaN in the column: keep the evaluated steps.
    PlotSeries g{v.name, {}, {}, true};
    const std::vector<double> steps = column("step"), cosines = column("grad_cos");
    for (std::size_t i = 0; i < std::min(steps.size(), cosines.size()); ++i) {
      if (std::isfinite(cosines[i])) {
        g.x.push_back(steps[i]);
        g.y.push_back(cosines[i]);
      }
    }
    if (!g.x.empty()) gradient.push_back(g);
    PlotSeries d{v.name, {}, {}, true};
    for (const auto& [x, y] : v.accuracy_vs_depth) {
      d.x.push_back(x);
      d.y.push_back(y);
    }
    depth.push_back(d);
    PlotSeries l{v.name, {}, {}, true};
    for (const auto& [x, y] : v.accuracy_vs_length) {
      l.x.push_back(x);
      l.y.push_back(y);
    }
    length.push_back(l);
  }
  struct Figure {
    std::string file, title, x, y;
    std::vector<PlotSeries>* series;
    bool log_y;
    std::string table_x;  // non-empty: the numbers follow the plot as a table
  };
  std::vector<Figure> figures = {
      {"loss.svg", "Training loss", "step", "cross-entropy", &loss, true, ""},
      {"accuracy.svg", "Held-out accuracy during training", "step", "accuracy", &accuracy, false,
       ""},
      {"accuracy_vs_depth.svg",
       "Test-time compute: accuracy vs solver iterations (implicit) / depth (tied, explicit)",
       "iterations or layers", "test accuracy", &depth, false, "iterations or layers"}};
  if (!gradient.empty()) {
    figures.push_back({"gradient_quality.svg",
                       "Gradient quality: cosine between the gradient used and the reference "
                       "(ift, GMRES to 1e-10) at every evaluation",
                       "step", "cosine", &gradient, false, ""});
  }
  if (!lengths.empty()) {
    figures.push_back({"accuracy_vs_length.svg", "Length extrapolation", "sequence length",
                       "test accuracy", &length, false, "sequence length"});
  }
  std::ostringstream md, html;
  md << "# stillpoint comparison\n\nConfig: `" << config_path << "`; task `"
     << base.GetString("task.kind") << "`, seed " << base.GetInt("seed")
     << "; every variant trained with the same seeds and data order.\n\n"
     << report.grid
     << (report.grid.empty() ? ""
                             : "\nEach cell: final held-out accuracy, median ms per training "
                               "step, and the first evaluated step (train.eval_every) at which "
                               "held-out accuracy reached 98%.\n\n")
     << report.table
     << "\nms/step is the median wall time of a training step; peak tensor MiB is the peak of "
        "bytes held by tensors during training; iterations and residuals are those of the last "
        "training step (residuals relative, max over samples, beside the tolerance they had "
        "to meet: NOT MET marks a missed tolerance, n/a a residual that an inexact backward "
        "mode does not measure; status: samples per termination, INEXACT for a backward pass "
        "that is an approximation by design; attn: the inner solves of the energy attentions "
        "inside the cell, mean over them, worst residual; attn max weight: the mean largest "
        "attention weight at the first iterate -> at the fixed point, at the last eval, where a "
        "jump to above 0.9 is a collapse); the gradient columns compare the gradient each "
        "variant with an implicit layer trains with (its backward modes and adjoint solvers) "
        "with a reference solved to a relative adjoint residual of 1e-10 by GMRES in every "
        "implicit layer, at the same weights and fixed points, on a probe batch after training "
        "(cosine and relative error); the gradient-quality plot shows the same at every "
        "evaluation during training.\n\n";
  html << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>stillpoint "
          "comparison</title>\n<style>body{font-family:sans-serif;max-width:1100px;margin:auto}"
          "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;"
          "text-align:right}</style></head><body>\n<h1>stillpoint comparison</h1>\n<p>Config "
       << config_path << ", task " << base.GetString("task.kind") << ".</p>\n";
  if (!report.grid.empty()) html << MarkdownTableToHtml(report.grid);
  html << MarkdownTableToHtml(report.table);
  for (const Figure& f : figures) {
    PlotOptions options{f.title, f.x, f.y, f.log_y, 760, 420};
    const std::string svg = LinePlotSvg(*f.series, options);
    if (IsMainRank()) WriteTextFile(root + "/" + f.file, svg);
    md << "![" << f.title << "](" << f.file << ")\n\n";
    html << "<h2>" << f.title << "</h2>\n" << svg;
    if (!f.table_x.empty()) {
      const std::string table = CurveTable(*f.series, f.table_x);
      md << "Held-out accuracy:\n\n" << table << "\n";
      html << "<p>Held-out accuracy:</p>\n" << MarkdownTableToHtml(table);
    }
  }
  html << "</body></html>\n";
  report.markdown_path = root + "/report.md";
  report.html_path = root + "/report.html";
  if (IsMainRank()) {
    WriteTextFile(report.markdown_path, md.str());
    WriteTextFile(report.html_path, html.str());
  }
  return report;
}

}  // namespace stillpoint
