#include "training/demos/trained_run.h"

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <vector>

#include "framework/check.h"
#include "training/checkpoint.h"
#include "training/config_schema.h"

namespace stillpoint {
namespace {

Experiment Load(const std::string& run) {
  SP_CHECK(!run.empty(), "the run must name a run directory or a checkpoint file");
  SP_CHECK(std::filesystem::exists(run), "run '", run, "' does not exist");
  const std::string path = std::filesystem::is_directory(run)
                               ? (std::filesystem::path(run) / "checkpoint.ckpt").string()
                               : run;
  SP_CHECK(std::filesystem::is_regular_file(path), "run '", run, "' has no checkpoint (", path,
           ")");
  const CheckpointState state = LoadCheckpoint(path);
  const Config config =
      Config::FromYaml(StillpointSchema(), state.config_yaml, path + " (stored config)", {});
  Experiment experiment = BuildExperiment(config, "");
  experiment.model->LoadParameters(state.model);
  experiment.model->Eval();
  return experiment;
}

}  // namespace

Experiment LoadTrainedRun(const std::string& run) {
  try {
    return Load(run);
  } catch (const ConfigError&) {
    throw;
  } catch (const std::exception& e) {
    throw ConfigError(e.what());
  }
}

Batch FirstTestExamples(const Experiment& experiment, int64_t count) {
  std::vector<int64_t> indices(std::min(count, experiment.test->size()));
  std::iota(indices.begin(), indices.end(), 0);
  return MakeBatch(*experiment.test, indices, experiment.dtype);
}

}  // namespace stillpoint
