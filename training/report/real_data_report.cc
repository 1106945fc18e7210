#include "training/report/real_data_report.h"

#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "training/generate.h"

namespace stillpoint {
namespace {

namespace fs = std::filesystem;

std::string HtmlEscape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '<') {
      out += "&lt;";
    } else if (c == '>') {
      out += "&gt;";
    } else if (c == '&') {
      out += "&amp;";
    } else {
      out += c;
    }
  }
  return out;
}

std::string Percent(double fraction) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.2f", 100.0 * fraction);
  return buffer;
}

// (class name, accuracy) of RUN_DIR/summary.json's per_class_accuracy.
std::vector<std::pair<std::string, double>> PerClassAccuracy(const std::string& run_dir) {
  std::vector<std::pair<std::string, double>> classes;
  try {
    const YAML::Node root = YAML::LoadFile(run_dir + "/summary.json");
    const YAML::Node per_class = root["per_class_accuracy"];
    if (!per_class || !per_class.IsMap()) return classes;
    for (const auto& entry : per_class) {
      classes.emplace_back(entry.first.as<std::string>(), entry.second.as<double>());
    }
  } catch (const YAML::Exception&) {
  }
  return classes;
}

}  // namespace

ReportSection PerClassSection(const std::vector<VariantResult>& variants, const std::string& root) {
  ReportSection section;
  std::vector<std::pair<const VariantResult*, std::vector<std::pair<std::string, double>>>> runs;
  for (const VariantResult& v : variants) {
    auto classes = PerClassAccuracy(v.run_dir);
    if (!classes.empty()) runs.emplace_back(&v, std::move(classes));
  }
  if (runs.empty()) return section;
  std::ostringstream table;
  table << "| class |";
  for (const auto& [v, classes] : runs) table << " " << v->name << " |";
  table << "\n|---|";
  for (std::size_t i = 0; i < runs.size(); ++i) table << "---:|";
  table << "\n";
  for (std::size_t c = 0; c < runs[0].second.size(); ++c) {
    table << "| " << runs[0].second[c].first << " |";
    for (const auto& [v, classes] : runs) {
      table << " " << (c < classes.size() ? Percent(classes[c].second) : "-") << " |";
    }
    table << "\n";
  }
  std::ostringstream md, html;
  md << "## Per-class held-out accuracy (%)\n\n" << table.str() << "\n";
  html << "<h2>Per-class held-out accuracy (%)</h2>\n<table><tr><th>class</th>";
  for (const auto& [v, classes] : runs) html << "<th>" << HtmlEscape(v->name) << "</th>";
  html << "</tr>\n";
  for (std::size_t c = 0; c < runs[0].second.size(); ++c) {
    html << "<tr><td>" << HtmlEscape(runs[0].second[c].first) << "</td>";
    for (const auto& [v, classes] : runs) {
      html << "<td>" << (c < classes.size() ? Percent(classes[c].second) : "-") << "</td>";
    }
    html << "</tr>\n";
  }
  html << "</table>\n";
  for (const auto& [v, classes] : runs) {
    const fs::path svg = fs::path(v->run_dir) / "confusion.svg";
    if (!fs::exists(svg)) continue;
    std::error_code error;
    fs::path link = fs::relative(svg, root, error);
    if (error || link.empty()) link = svg;
    md << "Confusion matrix, " << v->name << ":\n\n![" << v->name << " confusion matrix]("
       << link.string() << ")\n\n";
    std::ifstream in(svg);
    std::stringstream content;
    content << in.rdbuf();
    html << "<h3>Confusion matrix, " << HtmlEscape(v->name) << "</h3>\n" << content.str();
  }
  section.markdown = md.str();
  section.html = html.str();
  return section;
}

ReportSection TextSection(const std::vector<VariantResult>& variants) {
  ReportSection section;
  std::ostringstream table, samples, html_samples;
  bool any = false;
  table << "| variant | held-out nats/char | bits/char | held-out characters outside the "
           "vocabulary |\n|---|---:|---:|---:|\n";
  for (const VariantResult& v : variants) {
    if (!v.train.language_model) continue;
    any = true;
    char row[160];
    std::snprintf(row, sizeof(row), "| %s | %.4f | %.4f | %lld |\n", v.name.c_str(),
                  v.train.final_eval.loss, v.train.test_bpc,
                  static_cast<long long>(v.train.test_unknown_symbols));
    table << row;
    // A sample of 300 characters from the start of a line, temperature 0.8,
    // seed 0: the same sampling for every variant.
    std::string text;
    try {
      TextGenerator generator = LoadTextGenerator(v.run_dir);
      GenerateOptions options;
      options.tokens = 300;
      options.temperature = 0.8;
      const std::string prompt = generator.vocabulary().Id('\n') != Vocabulary::kUnknown
                                     ? "\n"
                                     : std::string(1, ' ');
      text = generator.Generate(prompt, options).text;
    } catch (const std::exception& e) {
      text = std::string("(no sample: ") + e.what() + ")";
    }
    samples << "Sample, " << v.name << " (`stillpoint generate " << v.run_dir
            << " --prompt ... --tokens 300 --temperature 0.8 --seed 0`):\n\n```text\n" << text
            << "\n```\n\n";
    html_samples << "<h3>Sample, " << HtmlEscape(v.name) << "</h3>\n<pre>" << HtmlEscape(text)
                 << "</pre>\n";
  }
  if (!any) return section;
  section.markdown = "## Held-out text\n\n" + table.str() + "\n" + samples.str();
  std::ostringstream html;
  html << "<h2>Held-out text</h2>\n<table><tr><th>variant</th><th>nats/char</th>"
          "<th>bits/char</th><th>unknown characters</th></tr>\n";
  for (const VariantResult& v : variants) {
    if (!v.train.language_model) continue;
    char row[200];
    std::snprintf(row, sizeof(row), "<tr><td>%s</td><td>%.4f</td><td>%.4f</td><td>%lld</td></tr>\n",
                  HtmlEscape(v.name).c_str(), v.train.final_eval.loss, v.train.test_bpc,
                  static_cast<long long>(v.train.test_unknown_symbols));
    html << row;
  }
  html << "</table>\n" << html_samples.str();
  section.html = html.str();
  return section;
}

}  // namespace stillpoint
