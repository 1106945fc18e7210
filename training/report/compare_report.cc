#include "training/report/compare_report.h"
#include "training/report/real_data_report.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <limits>
#include <map>
#include <sstream>

#include "training/config_schema.h"
#include "training/metrics.h"
#include "training/summary_json.h"
#include "training/report/compare_heat_map.h"
#include "training/svg_plot.h"

namespace stillpoint {
namespace {

std::string Scientific(double value) {
  if (!std::isfinite(value)) return "-";
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

// The finite values' mean and sample standard deviation (NaN for the
// deviation of fewer than two).
std::pair<double, double> MeanStd(const std::vector<double>& values) {
  double sum = 0;
  int n = 0;
  for (double v : values) {
    if (std::isfinite(v)) sum += v, ++n;
  }
  if (n == 0) return {kNaN, kNaN};
  const double mean = sum / n;
  if (n < 2) return {mean, kNaN};
  double squares = 0;
  for (double v : values) {
    if (std::isfinite(v)) squares += (v - mean) * (v - mean);
  }
  return {mean, std::sqrt(squares / (n - 1))};
}

// "x" for one run, "mean ± std" for several; format turns a value into text.
// Runs whose value is not finite (NaN: not measured, or a diverged run) are
// left out of the mean and said so: "97.50% (2 of 3 seeds)".
template <typename Format>
std::string PooledCell(const std::vector<double>& values,
                       Format format,
                       const std::string& suffix = "") {
  const auto [mean, std_dev] = MeanStd(values);
  if (!std::isfinite(mean)) return "-";
  std::size_t finite = 0;
  for (double v : values) finite += std::isfinite(v);
  const std::string pooled = finite < 2 || !std::isfinite(std_dev)
                                 ? format(mean) + suffix
                                 : format(mean) + " ± " + format(std_dev) + suffix;
  if (finite == values.size()) return pooled;
  return pooled + " (" + std::to_string(finite) + " of " + std::to_string(values.size()) +
         " seeds)";
}

// A held-out figure of a run, NaN when no evaluation ran (an old
// summary.json may hold 0 there).
double Evaluated(const VariantResult& v, double value) {
  return v.train.final_eval.examples > 0 ? value : kNaN;
}

// "-", or "stopped" with how many of the group's runs stopped early.
std::string StopCell(const std::vector<const VariantResult*>& runs) {
  std::size_t stopped = 0;
  for (const VariantResult* run : runs) stopped += run->train.stopped_early;
  if (stopped == 0) return "-";
  if (runs.size() == 1) return "stopped at step " + std::to_string(runs[0]->train.steps);
  return "stopped (" + std::to_string(stopped) + " of " + std::to_string(runs.size()) + " seeds)";
}

// The equilibrium verdicts of a group's runs: the verdict when they agree
// (VerdictCell's short form if `brief`), else "unhealthy (k of n seeds)".
std::string VerdictOf(const std::vector<const VariantResult*>& runs, bool brief) {
  std::size_t unhealthy = 0;
  std::string first;
  for (const VariantResult* run : runs) {
    const Equilibrium& e = run->train.equilibrium;
    if (!e.applies) return "-";
    if (!e.healthy()) {
      ++unhealthy;
      if (first.empty()) first = e.verdict;
    }
  }
  if (unhealthy == 0) return "healthy";
  if (runs.size() > 1) {
    return "unhealthy (" + std::to_string(unhealthy) + " of " + std::to_string(runs.size()) +
           " seeds)";
  }
  return brief ? VerdictCell(first) : first;
}

// The runs of one variant name (one per seed).
struct Group {
  std::string name;
  std::vector<const VariantResult*> runs;
  std::vector<const std::map<std::string, std::vector<double>>*> metrics;

  template <typename Get>
  std::vector<double> Values(Get get) const {
    std::vector<double> values;
    for (const VariantResult* run : runs) values.push_back(get(*run));
    return values;
  }
};

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

// Markdown prose as HTML paragraphs (`code` and *emphasis* kept).
std::string ProseToHtml(const std::string& text) {
  std::string html = "<p>";
  bool code = false, emphasis = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '`') {
      html += code ? "</code>" : "<code>";
      code = !code;
    } else if (c == '*' && !code) {
      html += emphasis ? "</em>" : "<em>";
      emphasis = !emphasis;
    } else if (c == '\n' && i + 1 < text.size() && text[i + 1] == '\n') {
      html += "</p>\n<p>";
      ++i;
    } else if (c == '<') {
      html += "&lt;";
    } else if (c == '>') {
      html += "&gt;";
    } else if (c == '&') {
      html += "&amp;";
    } else {
      html += c;
    }
  }
  return html + "</p>\n";
}

// A curve figure's numbers: one row per x value (of any series), one column
// per series ("-" where a series has no point; mean ± std for a band).
std::string CurveTable(const std::vector<PlotSeries>& series,
                       const std::string& x_name,
                       const std::string& unit) {
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
    table << "| " << TickLabel(x) << " |";
    for (const PlotSeries& s : series) {
      std::string cell = "-";
      for (std::size_t i = 0; i < s.x.size(); ++i) {
        if (s.x[i] != x || !std::isfinite(s.y[i])) continue;
        cell = Fixed(s.y[i], 2) + unit;
        if (i < s.y_high.size() && std::isfinite(s.y_high[i])) {
          cell = Fixed(s.y[i], 2) + " ± " + Fixed(s.y_high[i] - s.y[i], 2) + unit;
        }
      }
      table << " " << cell << " |";
    }
    table << "\n";
  }
  return table.str();
}

// The series of a group's runs as one: at each x of the first run, the mean
// over the runs that have it, with a band of +- one standard deviation when
// there are several runs.
PlotSeries Pool(const std::string& name, const std::vector<PlotSeries>& runs, bool markers) {
  PlotSeries pooled;
  pooled.name = name;
  pooled.markers = markers;
  if (runs.empty()) return pooled;
  if (runs.size() == 1) {
    pooled.x = runs[0].x;
    pooled.y = runs[0].y;
    return pooled;
  }
  for (std::size_t i = 0; i < runs[0].x.size(); ++i) {
    const double x = runs[0].x[i];
    std::vector<double> ys;
    for (const PlotSeries& run : runs) {
      for (std::size_t j = 0; j < run.x.size(); ++j) {
        if (run.x[j] == x) ys.push_back(run.y[j]);
      }
    }
    const auto [mean, std_dev] = MeanStd(ys);
    pooled.x.push_back(x);
    pooled.y.push_back(mean);
    pooled.y_low.push_back(std::isfinite(std_dev) ? mean - std_dev : kNaN);
    pooled.y_high.push_back(std::isfinite(std_dev) ? mean + std_dev : kNaN);
  }
  return pooled;
}

PlotSeries PairsSeries(const std::string& name,
                       const std::vector<std::pair<double, double>>& pairs) {
  PlotSeries s{name, {}, {}, true};
  for (const auto& [x, y] : pairs) {
    s.x.push_back(x);
    s.y.push_back(100.0 * y);
  }
  return s;
}

std::vector<double> Column(const std::map<std::string, std::vector<double>>& metrics,
                           const std::string& key) {
  const auto it = metrics.find(key);
  return it == metrics.end() ? std::vector<double>{} : it->second;
}

// "mean iterations | max relative residual" of a solve, or "- | -".
std::string StatsCells(const Group& g, SolverStats TrainSummary::*stats) {
  const SolverStats& first = g.runs[0]->train.*stats;
  if (first.converged + first.not_converged + first.inexact == 0) return "- | -";
  return PooledCell(
             g.Values([&](const VariantResult& v) { return (v.train.*stats).iterations_mean; }),
             [](double x) { return Fixed(x, 1); }) +
         " | " + ResidualCell(first);
}

// When the runs of a group first reached an accuracy (steps_to_target or
// steps_to_final with its seconds): "150 steps, 2.1 s", pooled over seeds,
// "(2 of 3 seeds)" when some never did, "not reached" when none did.
std::string ReachedCell(const Group& g, double VariantResult::*steps,
                        double VariantResult::*seconds) {
  std::vector<double> reached_steps, reached_seconds;
  for (const VariantResult* run : g.runs) {
    if (!std::isfinite(run->*steps)) continue;
    reached_steps.push_back(run->*steps);
    reached_seconds.push_back(run->*seconds);
  }
  if (reached_steps.empty()) return "not reached";
  std::string cell =
      PooledCell(reached_steps, [](double x) { return Fixed(x, 0); }, " steps") + ", " +
      PooledCell(reached_seconds, [](double x) { return Fixed(x, 1); }, " s");
  if (reached_steps.size() < g.runs.size()) {
    cell += " (" + std::to_string(reached_steps.size()) + " of " + std::to_string(g.runs.size()) +
            " seeds)";
  }
  return cell;
}

// The attention x kind table: one row per attention, one column per kind;
// each cell "held-out accuracy, ms/step, steps to the target accuracy".
std::string GridTable(const std::vector<Group>& groups, const ReportHeader& header) {
  std::ostringstream grid;
  grid << "| attention |";
  for (const std::string& kind : header.grid_kinds) grid << " " << kind << " |";
  grid << "\n|---|";
  for (std::size_t i = 0; i < header.grid_kinds.size(); ++i) grid << "---|";
  grid << "\n";
  for (const std::string& attention : header.grid_attentions) {
    grid << "| " << attention << " |";
    for (const std::string& kind : header.grid_kinds) {
      const Group* cell = nullptr;
      for (const Group& g : groups) {
        if (g.name == attention + "/" + kind) cell = &g;
      }
      if (cell == nullptr) {
        grid << " - |";
        continue;
      }
      const std::string steps =
          ReachedCell(*cell, &VariantResult::steps_to_target, &VariantResult::seconds_to_target);
      grid << " "
           << PooledCell(
                  cell->Values([](const VariantResult& v) {
                    return Evaluated(v, 100.0 * v.train.final_eval.accuracy);
                  }),
                  [](double x) { return Fixed(x, 2); }, "%")
           << ", "
           << PooledCell(
                  cell->Values(
                      [](const VariantResult& v) { return 1000.0 * v.train.seconds_per_step; }),
                  [](double x) { return Fixed(x, 1); }, " ms")
           << ", " << steps << " |";
    }
    grid << "\n";
  }
  return grid.str();
}

// Cells padded to their column's width (UTF-8 "±" counts as one column).
std::size_t DisplayWidth(const std::string& text) {
  std::size_t width = 0;
  for (unsigned char c : text) width += (c & 0xC0) != 0x80;
  return width;
}

// The console's table: one line per variant with what a reader scans first,
// the verdict among it, in at most kConsoleColumns columns (the full table
// is report.md's). A variant name too long for its column is cut with "~".
constexpr std::size_t kConsoleColumns = 100;

std::string ConsoleTable(const std::vector<Group>& groups, bool pooled) {
  auto fixed = [](int digits) { return [digits](double x) { return Fixed(x, digits); }; };
  // A language model's first figure is its held-out bits per character.
  bool language_models = !groups.empty();
  for (const Group& g : groups) {
    for (const VariantResult* run : g.runs) language_models &= run->train.language_model;
  }
  std::vector<std::vector<std::string>> rows = {
      {"variant", language_models ? "test bpc" : "test acc", "ms/step", "grad cos", "stop",
       "equilibrium"}};
  if (pooled) rows[0].insert(rows[0].begin() + 1, "seeds");
  for (const Group& g : groups) {
    std::vector<std::string> row = {
        g.name,
        language_models
            ? PooledCell(g.Values([](const VariantResult& x) {
                return Evaluated(x, x.train.test_bpc);
              }),
                         fixed(4))
            : PooledCell(g.Values([](const VariantResult& x) {
                return Evaluated(x, 100.0 * x.train.final_eval.accuracy);
              }),
                         fixed(2), "%"),
        PooledCell(
            g.Values([](const VariantResult& x) { return 1000.0 * x.train.seconds_per_step; }),
            fixed(1)),
        PooledCell(g.Values([](const VariantResult& x) { return x.gradient_cosine_vs_ift; }),
                   fixed(4)),
        StopCell(g.runs).substr(0, 7) == "stopped" ? std::string("stopped") : std::string("-"),
        VerdictOf(g.runs, /*brief=*/true)};
    if (pooled) row.insert(row.begin() + 1, std::to_string(g.runs.size()));
    rows.push_back(row);
  }
  const std::size_t columns = rows[0].size();
  std::vector<std::size_t> widths(columns, 0);
  for (const auto& row : rows) {
    for (std::size_t c = 0; c < columns; ++c) widths[c] = std::max(widths[c], DisplayWidth(row[c]));
  }
  std::size_t others = 2 * (columns - 1);
  for (std::size_t c = 1; c < columns; ++c) others += widths[c];
  const std::size_t name_width =
      others + 8 < kConsoleColumns ? std::min(widths[0], kConsoleColumns - others) : 8;
  std::ostringstream out;
  for (const auto& row : rows) {
    std::string line;
    for (std::size_t c = 0; c < columns; ++c) {
      std::string cell = row[c];
      const std::size_t width = c == 0 ? name_width : widths[c];
      if (c == 0 && DisplayWidth(cell) > width) cell = cell.substr(0, width - 1) + "~";
      line += cell + std::string(width - DisplayWidth(cell), ' ');
      if (c + 1 < columns) line += "  ";
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out << line << "\n";
  }
  return out.str();
}

const char kGridExplanation[] =
    "Each cell: final held-out accuracy, median ms per training step, and the first evaluated "
    "step (train.eval_every) at which held-out accuracy reached 98%, with the wall time of "
    "training until then.";

const char kTableExplanation[] =
    "Columns: *params* the number of trained parameters; *train loss* the mean cross-entropy "
    "(nats) of the last logged window, *test loss* and *test acc* (percent of held-out target "
    "tokens predicted) at the final evaluation, *test solved* the percent of held-out inputs "
    "predicted right at every target; *ms/step* the median wall time of a training "
    "step; *to 98%* and *to final acc* the first evaluation (train.eval_every) at which "
    "held-out accuracy reached 98% and came within one point of the run's final accuracy, in "
    "steps and in wall time of the training steps until then (evaluations left out), so variants "
    "are judged by the time to a result as well as the time per step; *peak tensor MiB* the "
    "peak of bytes held by tensors during training; *fwd*/*bwd* "
    "iterations and residuals are those of the outer fixed-point solve and its adjoint in the "
    "last training step (residuals relative, max over samples, beside the tolerance they had to "
    "meet: NOT MET marks a missed tolerance, n/a a residual that an inexact backward mode does "
    "not measure); *status* the samples per termination, INEXACT for a backward pass that is an "
    "approximation by design; *attn* the inner solves of the energy attentions inside the cell "
    "(mean over them, worst residual); *attn max weight* the mean largest attention weight at "
    "the first iterate -> at the fixed point, at the last evaluation, where a jump to above 0.9 "
    "is a collapse; *grad cos vs ref* and *grad rel err vs ref* compare the gradient each "
    "variant with an implicit layer trains with (its backward mode, adjoint solver and warm "
    "start) with a reference solved by GMRES to a relative adjoint residual of 1e-10 (float64) or "
    "1e-5 (float32), at the run's last evaluation (the figure of its summary.json; \"-\" when the "
    "reference did not converge); the gradient-quality figure shows the same at every "
    "evaluation; *stop* whether the run stopped early (train.on_nonfinite, "
    "train.on_unconverged); *equilibrium* the run's verdict (summary.json equilibrium: spectral "
    "radius, converged solves and gradient cosine against the health.* thresholds), its reasons "
    "listed below the table.";

const char kPoolingExplanation[] =
    "Variants trained with several seeds (compare.seeds) show mean ± sample standard deviation "
    "over the seeds, and their curves the mean with a shaded band of ± one standard deviation; "
    "solver residual and status cells are those of the first seed.";

using RunMetrics = std::map<std::string, std::vector<double>>;

// Each run's time to accuracy and last collapse diagnostics, from its
// metrics.
void SetMetricsFigures(const std::vector<RunMetrics>& run_metrics, CompareReport* report) {
  for (std::size_t r = 0; r < report->variants.size(); ++r) {
    VariantResult& v = report->variants[r];
    const std::vector<double> steps = Column(run_metrics[r], "step"),
                              accuracy = Column(run_metrics[r], "test_accuracy");
    const std::vector<double> first = Column(run_metrics[r], "attn_max_weight_first"),
                              fixed = Column(run_metrics[r], "attn_max_weight");
    for (std::size_t i = 0; i < first.size() && i < fixed.size(); ++i) {
      if (std::isfinite(first[i]) && std::isfinite(fixed[i])) {
        v.max_weight_first = first[i];
        v.max_weight_fixed_point = fixed[i];
      }
    }
    // The training steps' own time (train_s), so that a variant is not
    // charged for what its evaluations measure (an implicit model's gradient
    // check and radius estimates); runs logged before train_s existed: that
    // many steps at the median step time.
    const std::vector<double> trained = Column(run_metrics[r], "train_s");
    const auto seconds_at = [&](std::size_t i) {
      return i < trained.size() && std::isfinite(trained[i]) ? trained[i]
                                                             : steps[i] * v.train.seconds_per_step;
    };
    const auto first_reaching = [&](double level, double* at_step, double* at_seconds) {
      *at_step = *at_seconds = kNaN;
      for (std::size_t i = 0; i < steps.size() && i < accuracy.size(); ++i) {
        if (std::isfinite(accuracy[i]) && accuracy[i] >= level) {
          *at_step = steps[i];
          *at_seconds = seconds_at(i);
          return;
        }
      }
    };
    first_reaching(kTargetAccuracy, &v.steps_to_target, &v.seconds_to_target);
    first_reaching(v.train.final_eval.accuracy - kFinalAccuracyMargin, &v.steps_to_final,
                   &v.seconds_to_final);
  }
}

// The runs by variant name, in order of first appearance.
std::vector<Group> GroupRuns(const CompareReport* report,
                             const std::vector<RunMetrics>& run_metrics) {
  std::vector<Group> groups;
  for (std::size_t r = 0; r < report->variants.size(); ++r) {
    const VariantResult& v = report->variants[r];
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const Group& g) { return g.name == v.name; });
    if (it == groups.end()) {
      groups.push_back({v.name, {}, {}});
      it = groups.end() - 1;
    }
    it->runs.push_back(&v);
    it->metrics.push_back(&run_metrics[r]);
  }
  return groups;
}

// One variant's row of the results table.
std::string ResultsRow(const Group& g, bool pooled) {
  std::ostringstream table;
  auto fixed = [](int digits) { return [digits](double x) { return Fixed(x, digits); }; };
  const TrainSummary& t = g.runs[0]->train;
  const VariantResult& v = *g.runs[0];
  const bool solved = t.forward.iterations_max > 0;
  const bool backward_ran = !t.backward.status_counts.empty();
  table << "| " << g.name << " | ";
  if (pooled) table << g.runs.size() << " | ";
  table << t.num_parameters << " | "
        << PooledCell(g.Values([](const VariantResult& x) { return x.train.final_train_loss; }),
                      fixed(4))
        << " | "
        << PooledCell(g.Values([](const VariantResult& x) {
             return Evaluated(x, x.train.final_eval.loss);
           }),
                      fixed(4))
        << " | "
        << PooledCell(g.Values([](const VariantResult& x) {
             return Evaluated(x, 100.0 * x.train.final_eval.accuracy);
           }),
                      fixed(2), "%")
        << " | "
        << PooledCell(g.Values([](const VariantResult& x) {
             return Evaluated(x, 100.0 * x.train.final_eval.solved_fraction);
           }),
                      fixed(2), "%")
        << " | "
        << PooledCell(
               g.Values([](const VariantResult& x) { return 1000.0 * x.train.seconds_per_step; }),
               fixed(1))
        << " | "
        << ReachedCell(g, &VariantResult::steps_to_target, &VariantResult::seconds_to_target)
        << " | " << ReachedCell(g, &VariantResult::steps_to_final, &VariantResult::seconds_to_final)
        << " | "
        << PooledCell(g.Values([](const VariantResult& x) { return x.train.pool_peak_mb; }),
                      fixed(1))
        << " | "
        << (solved ? PooledCell(g.Values([](const VariantResult& x) {
             return x.train.forward.iterations_mean;
           }),
                                fixed(1))
                   : "-")
        << " | " << (solved ? ResidualCell(t.forward) : "-") << " | "
        << (solved ? StatusCell(t.forward) : "-") << " | "
        << (backward_ran ? PooledCell(g.Values([](const VariantResult& x) {
             return x.train.backward.iterations_mean;
           }),
                                      fixed(1))
                         : "-")
        << " | " << ResidualCell(t.backward) << " | " << StatusCell(t.backward) << " | "
        << StatsCells(g, &TrainSummary::attention_forward) << " | "
        << StatsCells(g, &TrainSummary::attention_backward) << " | "
        << (std::isfinite(v.max_weight_fixed_point)
                ? Fixed(v.max_weight_first, 2) + " -> " + Fixed(v.max_weight_fixed_point, 2)
                : std::string("-"))
        << " | "
        << PooledCell(g.Values([](const VariantResult& x) { return x.gradient_cosine_vs_ift; }),
                      fixed(4))
        << " | "
        << PooledCell(
               g.Values([](const VariantResult& x) { return x.gradient_relative_error_vs_ift; }),
               Scientific)
        << " | " << StopCell(g.runs) << " | " << VerdictOf(g.runs, /*brief=*/false) << " |\n";
  return table.str();
}

// The results table (markdown), a row per variant.
std::string ResultsTable(const std::vector<Group>& groups, bool pooled) {
  std::ostringstream table;
  table << "| variant | " << (pooled ? "seeds | " : "")
        << "params | train loss | test loss | test acc | test solved | ms/step | to 98% | to final acc "
           "| peak tensor MiB "
           "| fwd iters | fwd residual | fwd status | bwd iters | bwd residual | bwd status "
           "| attn iters | attn residual | attn bwd iters | attn bwd residual | attn max weight "
           "| grad cos vs ref | grad rel err vs ref | stop | equilibrium |\n"
        << "|---|" << (pooled ? "---|" : "")
        << "---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
           "---|---|\n";
  for (const Group& g : groups) table << ResultsRow(g, pooled);
  return table.str();
}

struct Figure {
  std::string file, title, x, y;
  std::vector<PlotSeries> series;
  bool log_y;
  std::string table_x;  // non-empty: the numbers follow the plot as a table
};

// The report's plots, from the groups' metrics and sweeps.
std::vector<Figure> Figures(const std::vector<Group>& groups) {
  std::vector<PlotSeries> loss, accuracy, depth, length, gradient, spectral;
  bool any_length = false;
  for (const Group& g : groups) {
    std::vector<PlotSeries> l, a, d, n, q, r;
    for (std::size_t i = 0; i < g.runs.size(); ++i) {
      const auto& m = *g.metrics[i];
      l.push_back(EvaluatedPoints(g.name, Column(m, "step"), Column(m, "loss"), 1.0, false));
      a.push_back(EvaluatedPoints(g.name, Column(m, "step"), Column(m, "test_accuracy"), 100.0));
      q.push_back(EvaluatedPoints(g.name, Column(m, "step"), Column(m, "grad_cos")));
      r.push_back(EvaluatedPoints(g.name, Column(m, "step"), Column(m, "spectral_radius")));
      d.push_back(PairsSeries(g.name, g.runs[i]->accuracy_vs_depth));
      n.push_back(PairsSeries(g.name, g.runs[i]->accuracy_vs_length));
      any_length = any_length || !g.runs[i]->accuracy_vs_length.empty();
    }
    loss.push_back(Pool(g.name, l, false));
    accuracy.push_back(Pool(g.name, a, true));
    depth.push_back(Pool(g.name, d, true));
    length.push_back(Pool(g.name, n, true));
    PlotSeries pooled_gradient = Pool(g.name, q, true);
    if (!pooled_gradient.x.empty()) gradient.push_back(pooled_gradient);
    PlotSeries pooled_spectral = Pool(g.name, r, true);
    if (!pooled_spectral.x.empty()) spectral.push_back(pooled_spectral);
  }
  std::vector<Figure> figures = {
      {"loss.svg", "Training loss", "step", "cross-entropy (nats)", loss, true, ""},
      {"accuracy.svg", "Held-out accuracy during training", "step", "held-out accuracy (%)",
       accuracy, false, ""},
      {"accuracy_vs_depth.svg",
       "Test-time compute: accuracy vs solver iterations (implicit) / depth (tied, explicit)",
       "solver iterations or layers", "held-out accuracy (%)", depth, false,
       "iterations or layers"}};
  if (!gradient.empty()) {
    figures.push_back({"gradient_quality.svg",
                       "Gradient quality: cosine between the gradient used and the reference "
                       "(ift, GMRES to 1e-10) at every evaluation",
                       "step", "cosine similarity", gradient, false, ""});
  }
  if (!spectral.empty()) {
    figures.push_back({"spectral_radius.svg",
                       "Stability: spectral radius of the fixed-point map's Jacobian at z* (power "
                       "iteration) at every evaluation; the fixed_point adjoint and Picard "
                       "converge below 1",
                       "step", "spectral radius", spectral, false, ""});
  }
  if (any_length) {
    figures.push_back({"accuracy_vs_length.svg", "Length extrapolation",
                       "sequence length (task.length)",
                       "held-out accuracy (%)", length, false, "sequence length"});
  }
  return figures;
}

// The report's two texts, written side by side.
struct ReportText {
  std::ostringstream md, html;
};

// Why a run stopped and why it is unhealthy, in full.
void WriteStopNotes(const CompareReport& report, ReportText* text) {
  std::ostringstream& md = text->md;
  std::ostringstream& html = text->html;
  std::string notes;
  for (const VariantResult& v : report.variants) {
    const std::string who = "- " + v.name + " (seed " + std::to_string(v.seed) + "): ";
    if (v.train.stopped_early) notes += who + "stopped early: " + v.train.stop_reason + "\n";
    if (v.train.equilibrium.applies && !v.train.equilibrium.healthy()) {
      notes += who + v.train.equilibrium.verdict + "\n";
    }
  }
  if (!notes.empty()) {
    md << "Stops and equilibrium verdicts:\n\n" << notes << "\n";
    html << ProseToHtml("Stops and equilibrium verdicts:") << "<ul>\n";
    std::istringstream lines(notes);
    std::string line;
    while (std::getline(lines, line)) {
      const std::string item = ProseToHtml(line.substr(2));
      html << "<li>" << item.substr(3, item.size() - 8) << "</li>\n";
    }
    html << "</ul>\n";
  }
}

void WriteProvenance(const CompareReport& report, ReportText* text) {
  std::ostringstream& md = text->md;
  std::ostringstream& html = text->html;
  std::string provenance = "Each run's stillpoint version, git revision, command, overrides, "
                           "machine and times (from its summary.json):\n\n";
  for (const VariantResult& v : report.variants) {
    provenance += "- " + v.name + " (seed " + std::to_string(v.seed) +
                  "): " + ProvenanceMarkdown(v.train.provenance) + "\n";
  }
  md << "## Provenance\n\n" << provenance << "\n";
  html << "<h2>Provenance</h2>\n<ul>\n";
  for (const VariantResult& v : report.variants) {
    std::string item = ProseToHtml(v.name + " (seed " + std::to_string(v.seed) +
                                   "): " + ProvenanceMarkdown(v.train.provenance));
    html << "<li>" << item.substr(3, item.size() - 8) << "</li>\n";
  }
  html << "</ul>\n";
}

// Each figure as an SVG file beside the report, and in it (with its numbers
// as a table when the figure has one).
void WriteFigures(const std::vector<Figure>& figures, const std::string& root, ReportText* text) {
  std::ostringstream& md = text->md;
  std::ostringstream& html = text->html;
  for (const Figure& f : figures) {
    PlotOptions options{f.title, f.x, f.y, f.log_y, 760, 420};
    const std::string svg = LinePlotSvg(f.series, options);
    WriteTextFile(root + "/" + f.file, svg);
    md << "![" << f.title << "](" << f.file << ")\n\n";
    html << "<h2>" << f.title << "</h2>\n" << svg;
    if (!f.table_x.empty()) {
      const std::string curve = CurveTable(f.series, f.table_x, "%");
      md << "Held-out accuracy:\n\n" << curve << "\n";
      html << "<p>Held-out accuracy:</p>\n" << MarkdownTableToHtml(curve);
    }
  }
}

// The title, the description, the grid, the results table and their notes.
void WriteHead(const ReportHeader& header, const CompareReport& report, bool pooled,
               ReportText* text) {
  std::ostringstream& md = text->md;
  std::ostringstream& html = text->html;
  md << "# stillpoint comparison\n\n" << header.description << "\n\n";
  html << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>stillpoint "
          "comparison</title>\n<style>body{font-family:sans-serif;max-width:1100px;margin:auto}"
          "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;"
          "text-align:right}</style></head><body>\n<h1>stillpoint comparison</h1>\n"
       << ProseToHtml(header.description);
  if (!report.grid.empty()) {
    md << report.grid << "\n" << kGridExplanation << "\n\n";
    html << MarkdownTableToHtml(report.grid) << ProseToHtml(kGridExplanation);
  }
  md << report.table << "\n" << kTableExplanation << "\n\n";
  html << MarkdownTableToHtml(report.table) << ProseToHtml(kTableExplanation);
  WriteStopNotes(report, text);
  if (pooled) {
    md << kPoolingExplanation << "\n\n";
    html << ProseToHtml(kPoolingExplanation);
  }
}

}  // namespace

void WriteComparisonReport(const std::string& root,
                           const ReportHeader& header,
                           CompareReport* report) {
  std::filesystem::create_directories(root);
  // Each run's metrics, read once for the time to accuracy and the plots.
  std::vector<RunMetrics> run_metrics;
  for (const VariantResult& v : report->variants) run_metrics.push_back(ReadRunMetrics(v.run_dir));
  SetMetricsFigures(run_metrics, report);
  const std::vector<Group> groups = GroupRuns(report, run_metrics);
  bool pooled = false;
  for (const Group& g : groups) pooled = pooled || g.runs.size() > 1;
  report->table = ResultsTable(groups, pooled);
  report->console_table = ConsoleTable(groups, pooled);
  report->grid = header.grid_attentions.empty() ? "" : GridTable(groups, header);

  ReportText text;
  WriteHead(header, *report, pooled, &text);
  for (const ReportSection& section :
       {PerClassSection(report->variants, root), TextSection(report->variants)}) {
    text.md << section.markdown;
    text.html << section.html;
  }
  WriteProvenance(*report, &text);
  WriteFigures(Figures(groups), root, &text);
  const HeatMapSection heat_map = WriteHeatMapSection(root, report->variants);
  text.md << heat_map.markdown;
  text.html << heat_map.html << "</body></html>\n";
  report->markdown_path = root + "/report.md";
  report->html_path = root + "/report.html";
  WriteTextFile(report->markdown_path, text.md.str());
  WriteTextFile(report->html_path, text.html.str());
}

void SaveVariantResult(const VariantResult& v) {
  std::ostringstream out;
  auto pairs = [&](const std::vector<std::pair<double, double>>& values) {
    out << "[";
    for (std::size_t i = 0; i < values.size(); ++i) {
      out << (i ? ", " : "") << "[" << JsonNumber(values[i].first) << ", "
          << JsonNumber(values[i].second) << "]";
    }
    out << "]";
  };
  out << "{\n  \"name\": " << JsonString(v.name) << ",\n  \"seed\": " << v.seed
      << ",\n  \"overrides\": [";
  for (std::size_t i = 0; i < v.overrides.size(); ++i) {
    out << (i ? ", " : "") << JsonString(v.overrides[i]);
  }
  out << "],\n  \"gradient_cosine_vs_ift\": " << JsonNumber(v.gradient_cosine_vs_ift)
      << ",\n  \"gradient_relative_error_vs_ift\": " << JsonNumber(v.gradient_relative_error_vs_ift)
      << ",\n  \"accuracy_vs_depth\": ";
  pairs(v.accuracy_vs_depth);
  out << ",\n  \"accuracy_vs_length\": ";
  pairs(v.accuracy_vs_length);
  out << ",\n  \"scale_name\": " << JsonString(v.scale_name) << ",\n  \"scale_depth\": [";
  for (std::size_t i = 0; i < v.scale_depth.size(); ++i) {
    const ScaleDepthResult& g = v.scale_depth[i];
    out << (i ? ", " : "") << "[" << JsonNumber(g.scale) << ", " << JsonNumber(g.depth) << ", "
        << JsonNumber(g.accuracy) << ", " << JsonNumber(g.solved_fraction) << "]";
  }
  out << "]\n}\n";
  WriteTextFile((std::filesystem::path(v.run_dir) / "variant.json").string(), out.str());
}

VariantResult LoadVariantResult(const std::string& run_dir, const std::string& fallback_name) {
  VariantResult v;
  v.name = fallback_name;
  v.run_dir = run_dir;
  v.train = ReadTrainSummary(run_dir);
  SetGradientFigures(&v);
  const std::string path = (std::filesystem::path(run_dir) / "variant.json").string();
  if (!std::filesystem::exists(path)) return v;
  try {
    const YAML::Node root = YAML::LoadFile(path);
    if (!root.IsMap()) throw ConfigError(path + ": expected a JSON object");
    if (root["name"]) v.name = root["name"].as<std::string>();
    if (root["seed"]) v.seed = root["seed"].as<int64_t>();
    for (const auto& o : root["overrides"]) v.overrides.push_back(o.as<std::string>());
    // The gradient figures are the run's own (summary.json), not variant.json's.
    auto pairs = [&](const char* key, std::vector<std::pair<double, double>>* out) {
      for (const auto& p : root[key]) {
        out->emplace_back(p[0].IsNull() ? kNaN : p[0].as<double>(),
                          p[1].IsNull() ? kNaN : p[1].as<double>());
      }
    };
    pairs("accuracy_vs_depth", &v.accuracy_vs_depth);
    pairs("accuracy_vs_length", &v.accuracy_vs_length);
    if (root["scale_name"]) v.scale_name = root["scale_name"].as<std::string>();
    for (const auto& g : root["scale_depth"]) {
      auto at = [&](int i) { return g[i].IsNull() ? kNaN : g[i].as<double>(); };
      v.scale_depth.push_back({at(0), at(1), at(2), at(3)});
    }
  } catch (const YAML::Exception& error) {
    throw ConfigError(path + ": malformed (" + error.msg + ")");
  }
  SetGradientFigures(&v);
  return v;
}

std::vector<std::string> FindRunDirectories(const std::string& path) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(path)) throw ConfigError("'" + path + "' is not a directory");
  if (fs::exists(fs::path(path) / "summary.json")) return {path};
  std::vector<std::string> runs;
  for (const auto& entry : fs::recursive_directory_iterator(path)) {
    if (entry.is_regular_file() && entry.path().filename() == "summary.json") {
      runs.push_back(entry.path().parent_path().string());
    }
  }
  std::sort(runs.begin(), runs.end());
  if (runs.empty()) {
    throw ConfigError("'" + path + "' holds no run (no summary.json in it or below it)");
  }
  return runs;
}

}  // namespace stillpoint
