// The schema of stillpoint's YAML configs (every key, its type, default,
// range and meaning), and the conversions from a loaded Config to the
// options structs of the layers, solvers and trainer. Solver keys use the
// same names and defaults as ForwardSolverOptions and BackwardOptions (the
// defaults are read from default-constructed structs, so they cannot drift).
//
// docs/config.md is generated from this schema (`stillpoint config --doc`),
// and a test keeps the two identical.
#pragma once

#include <string>

#include "layers/models.h"
#include "training/config/config.h"
#include "training/optimizer.h"
#include "training/schedule.h"

namespace stillpoint {

const ConfigSchema& StillpointSchema();

// The model.* keys' defaults: ModelOptions' own, except max_length 64
// (the struct's 32 serve models built by hand).
ModelOptions ConfigModelDefaults();

// The model's own solve (model.solver.*) as a config declares it by default
// for model.kind implicit (the default kind): ImplicitOptions' defaults with
// an Anderson adjoint. Other kinds keep ImplicitOptions' fixed-point adjoint.
ImplicitOptions DefaultModelSolverOptions();

// Model options for a dataset with the given vocabulary/classes (the task
// decides vocab_size and num_classes; the config decides the rest).
ModelOptions ModelOptionsFromConfig(const Config& config);
ImplicitOptions ImplicitOptionsFromConfig(const Config& config);
// The same for the keys under prefix (e.g. "model.attention_solver.").
ImplicitOptions ImplicitOptionsFromConfig(const Config& config, const std::string& prefix);
// model.energy.* (dim, heads and dtype are left at their defaults; the model
// options set them). An unknown model.energy.layer is a ConfigError naming
// the key and the registered layers.
EnergyBlockOptions EnergyBlockOptionsFromConfig(const Config& config);
OptimizerOptions OptimizerOptionsFromConfig(const Config& config);
ScheduleOptions ScheduleOptionsFromConfig(const Config& config);

// docs/config.md's text.
std::string ConfigReferenceMarkdown();

}  // namespace stillpoint
