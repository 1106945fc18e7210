#include "training/compare.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <limits>
#include <ostream>
#include <sstream>

#include "framework/ops.h"
#include "layers/energy_block.h"
#include "training/config_schema.h"
#include "training/experiment.h"
#include "training/memory_estimate.h"
#include "training/metrics.h"
#include "training/run_directory.h"
#include "training/svg_plot.h"

namespace stillpoint {
namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

const std::vector<std::string> kBackwardModes = {"ift", "jfb", "phantom", "unrolled"};

// Flattened gradient of the batch loss w.r.t. every parameter.
std::vector<double> GradientOn(SequenceModel& model, const Batch& batch) {
  model.ZeroGrad();
  Var loss = BatchLoss(ForwardBatch(model, batch), batch);
  backward(loss);
  std::vector<double> flat;
  for (const Var& p : model.parameters()) {
    if (p.has_grad()) {
      const std::vector<double> g = p.grad().value().ToVector();
      flat.insert(flat.end(), g.begin(), g.end());
    } else {
      flat.insert(flat.end(), p.numel(), 0.0);
    }
  }
  model.ZeroGrad();
  return flat;
}

double Cosine(const std::vector<double>& a, const std::vector<double>& b) {
  double dot = 0, na = 0, nb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    dot += a[i] * b[i];
    na += a[i] * a[i];
    nb += b[i] * b[i];
  }
  return na > 0 && nb > 0 ? dot / std::sqrt(na * nb) : kNaN;
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

std::vector<double> DepthSweep(const Config& config) {
  std::vector<double> sweep = config.GetDoubleList("eval.iterations_sweep");
  if (sweep.empty()) sweep = {1, 2, 4, 8, 16, 32};
  return sweep;
}

}  // namespace

std::vector<std::string> VariantOverrides(const std::string& variant) {
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

void ValidateCompareVariants(const Config& config, const std::string& config_path) {
  const std::vector<std::string> variants = config.GetStringList("compare.variants");
  if (variants.empty()) {
    throw ConfigError(config.Origin("compare.variants") + ": compare.variants is empty");
  }
  for (std::size_t i = 0; i < variants.size(); ++i) {
    if (std::find(variants.begin(), variants.begin() + i, variants[i]) != variants.begin() + i) {
      // Both would train into one run directory.
      throw ConfigError(config.Origin("compare.variants") + ": variant '" + variants[i] +
                        "' appears twice in compare.variants");
    }
  }
  for (const std::string& v : variants) {
    if (VariantOverrides(v).empty()) {
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
      throw ConfigError("variant '" + v + "' of compare.variants: " + e.what());
    } catch (const Error& e) {
      throw ConfigError("variant '" + v + "' of compare.variants: " + e.what());
    }
  }
}

CompareReport RunComparison(const Config& base, const std::string& config_path,
                            std::ostream* progress, bool overwrite) {
  ValidateCompareVariants(base, config_path);
  const std::string root = RunDirectory(base, config_path);
  const RunDirectoryLock lock(root);
  if (overwrite) {
    RemoveRunFiles(root);
  } else {
    RefuseNonEmptyRunDirectory(root);
  }
  CompareReport report;
  const std::vector<double> lengths = base.GetDoubleList("eval.lengths");
  const int64_t eval_batch = base.GetInt("eval.batch_size");

  for (const std::string& name : base.GetStringList("compare.variants")) {
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
    if (progress) *progress << v.train.BriefReport() << "\n";
    if (v.train.stop_signal != 0) {
      report.stop_signal = v.train.stop_signal;
      report.variants.push_back(std::move(v));
      return report;
    }
    SequenceModel& model = *e.model;

    // Gradient quality of inexact backward modes against ift, same weights.
    v.gradient_cosine_vs_ift = kNaN;
    Implicit* layer = model.mutable_implicit();
    if (layer && layer->options().backward.mode != BackwardMode::kIft) {
      Batcher probe(*e.train, config.GetInt("compare.probe_batch_size"), 12345, e.dtype);
      const Batch batch = probe.Next();
      const std::vector<double> inexact = GradientOn(model, batch);
      const BackwardMode mode = layer->options().backward.mode;
      layer->mutable_options().backward.mode = BackwardMode::kIft;
      v.gradient_cosine_vs_ift = Cosine(inexact, GradientOn(model, batch));
      layer->mutable_options().backward.mode = mode;
    }

    // Test-time compute: solver budget (implicit) or unroll depth (tied).
    if (layer || model.options().kind == ModelKind::kTied) {
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

  // ---- table
  std::ostringstream table;
  table << "| variant | params | train loss | test loss | test acc | ms/step | peak tensor MiB "
           "| fwd iters | fwd residual | bwd iters | bwd residual | grad cos vs ift |\n"
        << "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const VariantResult& v : report.variants) {
    const TrainSummary& t = v.train;
    const bool solved = t.forward.iterations_max > 0;
    table << "| " << v.name << " | " << t.num_parameters << " | " << Fixed(t.final_train_loss, 4)
          << " | " << Fixed(t.final_eval.loss, 4) << " | "
          << Fixed(100.0 * t.final_eval.accuracy, 2) << "% | "
          << Fixed(1000.0 * t.seconds_per_step, 1) << " | " << Fixed(t.pool_peak_mb, 1) << " | "
          << (solved ? Fixed(t.forward.iterations_mean, 1) : "-") << " | "
          << (solved ? Fixed(t.forward.residual_max, 6) : "-") << " | "
          << (t.backward.iterations_max > 0 ? Fixed(t.backward.iterations_mean, 1) : "-")
          << " | " << (t.backward.iterations_max > 0 ? Fixed(t.backward.residual_max, 6) : "-")
          << " | " << Fixed(v.gradient_cosine_vs_ift, 4) << " |\n";
  }
  report.table = table.str();

  // ---- plots
  std::vector<PlotSeries> loss, accuracy, depth, length;
  for (const VariantResult& v : report.variants) {
    const auto m = ReadRunMetrics(v.run_dir);
    auto column = [&](const std::string& key) {
      auto it = m.find(key);
      return it == m.end() ? std::vector<double>{} : it->second;
    };
    loss.push_back({v.name, column("step"), column("loss")});
    // Test accuracy where evaluated, train accuracy otherwise would mix: plot both.
    accuracy.push_back({v.name + " (test)", column("step"), column("test_accuracy"), true});
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
  if (!lengths.empty()) {
    figures.push_back({"accuracy_vs_length.svg", "Length extrapolation", "sequence length",
                       "test accuracy", &length, false, "sequence length"});
  }
  std::ostringstream md, html;
  md << "# stillpoint comparison\n\nConfig: `" << config_path << "`; task `"
     << base.GetString("task.kind") << "`, seed " << base.GetInt("seed")
     << "; every variant trained with the same seeds and data order.\n\n"
     << report.table
     << "\nms/step is the median wall time of a training step; peak tensor MiB is the peak of "
        "bytes held by tensors during training; iterations and residuals are those of the last "
        "training step (residuals relative, max over samples); the gradient cosine compares an "
        "inexact backward mode with the exact implicit (ift) gradient of the same weights on a "
        "probe batch.\n\n";
  html << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>stillpoint "
          "comparison</title>\n<style>body{font-family:sans-serif;max-width:1100px;margin:auto}"
          "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;"
          "text-align:right}</style></head><body>\n<h1>stillpoint comparison</h1>\n<p>Config "
       << config_path << ", task " << base.GetString("task.kind") << ".</p>\n";
  html << MarkdownTableToHtml(report.table);
  for (const Figure& f : figures) {
    PlotOptions options{f.title, f.x, f.y, f.log_y, 760, 420};
    const std::string svg = LinePlotSvg(*f.series, options);
    WriteTextFile(root + "/" + f.file, svg);
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
  WriteTextFile(report.markdown_path, md.str());
  WriteTextFile(report.html_path, html.str());
  return report;
}

}  // namespace stillpoint
