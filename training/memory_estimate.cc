#include "training/memory_estimate.h"

#include <unistd.h>

#include <cstdio>
#include <sstream>
#include <vector>

#include "training/data/dataset.h"
#include "training/data/dataset_registry.h"

namespace stillpoint {
namespace {

double Elements(const Config& c, const char* key) { return static_cast<double>(c.GetInt(key)); }

}  // namespace

std::string FormatBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int unit = 0;
  while (bytes >= 1024.0 && unit < 5) {
    bytes /= 1024.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), unit == 0 ? "%.0f %s" : "%.1f %s", bytes, units[unit]);
  return text;
}

std::string MemoryEstimate::Breakdown() const {
  std::ostringstream out;
  out << "parameters " << FormatBytes(parameters);
  if (gradients > 0) out << ", gradients " << FormatBytes(gradients);
  if (optimizer_state > 0) out << ", optimizer state " << FormatBytes(optimizer_state);
  out << ", activations " << FormatBytes(activations);
  if (solver_history > 0) out << ", solver history " << FormatBytes(solver_history);
  if (dataset > 0) out << ", dataset " << FormatBytes(dataset);
  return out.str();
}

MemoryEstimate EstimateMemory(const Config& c, bool training) {
  const double bytes = c.GetString("dtype") == "float64" ? 8.0 : 4.0;
  const double dim = Elements(c, "model.dim");
  const double hidden = Elements(c, "model.hidden");
  const std::string kind = c.GetString("model.kind");
  const TaskFootprint task = TaskFootprintOf(c);
  const double length = static_cast<double>(task.length);
  const double vocab = static_cast<double>(task.vocab_size);
  // Untied cells (explicit) hold their own weights; tied and implicit share
  // one cell; the energy model's block is at least its feed-forward sublayer.
  const double cells = kind == "explicit" ? Elements(c, "model.num_layers") : 1.0;
  const double cell_weights =
      kind == "energy" ? 2 * dim * hidden : 4 * dim * dim + 2 * dim * hidden;
  const double parameters =
      cells * cell_weights + vocab * dim + Elements(c, "model.max_length") * dim;

  MemoryEstimate e;
  e.parameters = parameters * bytes;
  const double batch = Elements(c, training ? "train.batch_size" : "eval.batch_size");
  // Layers whose activations a backward pass keeps: each explicit layer or
  // unrolled step; one recorded evaluation of an implicit or energy model.
  double kept_layers = 1.0;
  if (training && kind == "explicit") kept_layers = cells;
  if (training && kind == "tied") kept_layers = Elements(c, "model.unroll_steps");
  e.activations = kept_layers * batch * length * (dim + hidden) * bytes;
  const std::string solver = c.GetString("model.solver.forward.type");
  if (kind == "implicit" && (solver == "anderson" || solver == "broyden")) {
    const double memory = Elements(c, solver == "anderson" ? "model.solver.forward.anderson_memory"
                                                           : "model.solver.forward.broyden_memory");
    e.solver_history = 2 * memory * batch * length * dim * bytes;
  }
  // Each generated example: its Example (three vectors) and int64 tokens and
  // targets per position; the held-out set is generated too (at the same
  // length unless eval --length changes it, which the caller checks again).
  const double per_example = sizeof(Example) + 2.0 * sizeof(int64_t) * length;
  e.dataset = static_cast<double>(task.examples) * per_example;
  if (training) {
    e.gradients = e.parameters;
    const std::string optimizer = c.GetString("train.optimizer.type");
    const double moments =
        optimizer == "sgd" ? (c.GetDouble("train.optimizer.momentum") > 0 ? 1 : 0) : 2;
    e.optimizer_state = moments * e.parameters;
  }
  return e;
}

double PhysicalMemoryBytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_size = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page_size > 0 ? static_cast<double>(pages) * static_cast<double>(page_size)
                                    : 0.0;
}

void CheckMemoryFits(const Config& c, bool training, double available_bytes) {
  if (available_bytes <= 0) available_bytes = PhysicalMemoryBytes();
  if (available_bytes <= 0) return;  // unknown machine: nothing to compare with
  const MemoryEstimate e = EstimateMemory(c, training);
  if (e.total() <= available_bytes) return;
  std::ostringstream keys;
  std::vector<std::string> drivers = {"model.dim",        "model.hidden",       "model.kind",
                                      "model.num_layers", "model.unroll_steps", "model.max_length"};
  for (const std::string& key : TaskFootprintOf(c).keys) drivers.push_back(key);
  for (const char* key : {training ? "train.batch_size" : "eval.batch_size",
                          "model.solver.forward.type", "dtype"}) {
    drivers.push_back(key);
  }
  for (const std::string& key : drivers) {
    keys << (keys.tellp() > 0 ? ", " : "") << key << "=" << c.ValueText(key);
  }
  throw ConfigError(c.source() + ": this " + (training ? "training run" : "evaluation") +
                    " needs at least " + FormatBytes(e.total()) + " (" + e.Breakdown() +
                    "), more than this machine's " + FormatBytes(available_bytes) +
                    " of memory; the size comes from " + keys.str());
}

}  // namespace stillpoint
