#include "training/trainer.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "framework/parallel.h"
#include "training/distributed.h"
#include "training/step_regularizers.h"
#include "training/summary_files.h"
#include "training/train_session.h"
#include "training/trainer_options.h"

namespace stillpoint {

double PeakResidentMegabytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) {
      std::istringstream fields(line.substr(6));
      double kib = 0;
      fields >> kib;
      return kib / 1024.0;
    }
  }
  return 0.0;
}

std::string RunDirectory(const Config& config, const std::string& config_path) {
  const std::string dir = config.GetString("log.dir");
  if (!dir.empty()) return dir;
  const std::string stem =
      config_path.empty() ? "run" : std::filesystem::path(config_path).stem().string();
  return (std::filesystem::path("runs") / stem).string();
}

void CheckTrainingConfig(const Config& c) {
  // The regularisers are taken at the model's own fixed point: a key of
  // model.regularization.* set away from its default for a model without one
  // (or, for the correction loss, without a solved cell) would change
  // nothing, so it is refused by name rather than ignored.
  const std::string kind = c.GetString("model.kind");
  const std::string attention = c.GetString("model.attention");
  const RegularizationOptions given = RegularizationOptions::FromConfig(c);
  const RegularizationOptions defaults;
  for (const auto& field : RegularizationOptions::Fields().fields()) {
    if (!field.in_config || field.Text(given) == field.Text(defaults)) continue;
    if (RegularizationKeyApplies(field.name, kind, attention)) continue;
    const std::string key = "model.regularization." + field.name;
    // A default that follows another key (model.attention energy_transformer:
    // the attention penalty) is what the config gives every kind; the kinds
    // it does not fit ignore it.
    if (c.Origin(key) == "default") continue;
    if (field.name.rfind("attention_", 0) == 0) {
      // Taken on the inner solves of the cells' energy attentions.
      throw ConfigError(c.Origin(key) + ": " + key +
                        " needs an energy attention inside the cells (model.attention an energy "
                        "block and model.kind explicit, tied or implicit), not " +
                        (kind == "energy" ? "model.kind energy (its block is the model's own "
                                            "fixed point: use model.regularization."
                                            "spectral_radius_*)"
                                          : std::string("model.attention softmax")));
    }
    const bool needs_cell = field.name.rfind("correction_", 0) == 0;
    throw ConfigError(c.Origin(key) + ": " + key + " needs model.kind implicit" +
                      (needs_cell ? std::string(" (the correction loss is taken on the "
                                                "implicit solve's iterates)")
                                  : std::string(" or energy (a fixed point of the model's "
                                                "own)")) +
                      ", not " + kind);
  }
  if (c.GetDouble("train.progressive_loss.weight") > 0) {
    const int64_t k = c.GetInt("train.progressive_loss.steps");
    const int64_t total = c.GetInt("train.progressive_loss.iterations") > 0
                              ? c.GetInt("train.progressive_loss.iterations")
                              : c.GetInt("model.unroll_steps");
    if (total <= k) {
      throw ConfigError(c.Origin("train.progressive_loss.steps") +
                        ": train.progressive_loss.steps (" + std::to_string(k) +
                        ") must be below the most steps N = " + std::to_string(total) +
                        " (train.progressive_loss.iterations, 0: model.unroll_steps), so that n "
                        "can be drawn from [0, N - k)");
    }
  }
  if (c.GetStringList("log.formats").empty()) {
    throw ConfigError(c.Origin("log.formats") +
                      ": log.formats must name at least one of csv, jsonl");
  }
  const int64_t shards = c.GetInt("train.shards");
  if (shards > c.GetInt("train.batch_size")) {
    throw ConfigError(c.Origin("train.shards") + ": train.shards (" + std::to_string(shards) +
                      ") is more than train.batch_size (" +
                      std::to_string(c.GetInt("train.batch_size")) + ")");
  }
  // Under mpirun every rank runs train.shards shards of each batch.
  if (shards * WorldSize() > c.GetInt("train.batch_size")) {
    throw ConfigError(c.Origin("train.batch_size") + ": a batch of " +
                      std::to_string(c.GetInt("train.batch_size")) + " rows cannot be cut into " +
                      std::to_string(WorldSize()) + " ranks x train.shards " +
                      std::to_string(shards) + " = " + std::to_string(shards * WorldSize()) +
                      " shards (each shard needs a row); use fewer ranks or a larger batch");
  }
}

void CheckModelKindKeys(const Config& c) {
  const std::string kind = c.GetString("model.kind");
  if (c.GetString("model.solver.init") != "zeros" && kind != "implicit" && kind != "energy") {
    throw ConfigError(c.Origin("model.solver.init") + ": model.solver.init " +
                      c.GetString("model.solver.init") +
                      " needs model.kind implicit or energy (a model that solves for its state), "
                      "not " + kind);
  }
  if (c.GetDouble("train.progressive_loss.weight") > 0 && kind != "tied" && kind != "implicit") {
    throw ConfigError(c.Origin("train.progressive_loss.weight") +
                      ": train.progressive_loss.weight needs model.kind tied or implicit (a cell "
                      "that can run for any number of steps), not " + kind);
  }
  if (c.GetString("model.input_injection") != "every_step" && kind != "explicit" &&
      kind != "tied") {
    throw ConfigError(c.Origin("model.input_injection") + ": model.input_injection " +
                      c.GetString("model.input_injection") +
                      " needs model.kind explicit or tied: the fixed point of an " + kind +
                      " model would not depend on its input");
  }
}

TrainSummary Train(Experiment& e, const TrainOptions& options) {
  SetNumThreads(static_cast<int>(e.config.GetInt("threads")));
  CheckTrainingConfig(e.config);  // before the run directory is touched
  const TrainSettings settings = TrainSettings::FromConfig(e.config);
  TrainSummary summary;
  summary.run_dir = RunDirectory(e.config, e.config_path);
  summary.provenance = CollectProvenance(e.config);
  OpenedRunDirectory run_directory(e, options, settings, &summary);
  if (summary.already_complete) return summary;
  StepRegularizers regularizers(settings.regularization, settings.trainer, *e.model);
  TrainSession run(e, settings, options, run_directory, regularizers.task_loss_weight(),
                   &summary);
  while (run.Continues()) {
    run.SetLearningRateAndDepth();
    if (!run.Step(regularizers.At(run.step(), run.rng()))) break;  // a rank failed
    for (TrainHook* hook : run.hooks()) {
      if (!hook->StepEnded(run.state())) break;
    }
  }
  run.Finish();
  if (IsMainRank()) WriteSummaryFiles(summary, e.model->Name());
  return summary;
}

}  // namespace stillpoint
