// Options that describe themselves (framework/option_fields.h,
// training/config/option_schema.h): the config keys of the forward and backward
// solvers, the model (with its cell and energy block), the optimizer, the
// schedule, the trainer, evaluation, logging and regularisation are made
// from the structs' own field declarations, so a key's default, range and choices
// are the struct's, and a value the schema refuses is one the struct's own
// check refuses (the schema and IsValid once disagreed: anderson_memory
// 1-1024 against 1-64, broyden_memory 1024 against 256, gmres_restart 4096
// against 512).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "solvers/adjoint.h"
#include "solvers/forward_options.h"
#include "layers/models.h"
#include "training/config_schema.h"
#include "training/optimizer.h"
#include "training/config/option_schema.h"
#include "training/schedule.h"
#include "training/trainer_options.h"

namespace stillpoint::option_schema_test {
namespace {

// For every config field of Options: the schema key prefix + name exists
// with the field's default, bounds and choices; a value just outside a
// bound is refused by the schema and by `check`, and the bound itself (when
// closed) by neither.
template <typename Options>
void ExpectSchemaMatchesFields(const std::string& prefix, const Options& defaults,
                               const std::function<bool(const Options&)>& valid) {
  const ConfigSchema& schema = StillpointSchema();
  int compared = 0;
  for (const auto& field : Options::Fields().fields()) {
    if (!field.in_config) {
      EXPECT_EQ(schema.Find(prefix + field.name), nullptr) << field.name;
      continue;
    }
    SCOPED_TRACE(prefix + field.name);
    const ConfigKey* key = schema.Find(prefix + field.name);
    ASSERT_NE(key, nullptr);
    ++compared;
    const Config config = Config::FromYaml(schema, "", "defaults");
    EXPECT_EQ(config.ValueText(key->path), field.Text(defaults));
    if (field.kind == OptionKind::kEnum || field.kind == OptionKind::kStringList) {
      EXPECT_EQ(key->choices, field.choices);
    }
    if (field.kind != OptionKind::kInt && field.kind != OptionKind::kDouble) continue;
    const OptionBounds& b = field.bounds;
    EXPECT_EQ(key->min, b.min);
    EXPECT_EQ(key->max, b.max);
    EXPECT_EQ(key->min_open, b.min_open);
    EXPECT_EQ(key->max_open, b.max_open);
    EXPECT_EQ(key->zero_allowed, b.zero_allowed);
    // Below the lower bound (an integer one less; a number a little less).
    double below = field.kind == OptionKind::kInt ? b.min - 1 : b.min - 0.25 * (std::abs(b.min) + 1);
    if (b.min_open) below = b.min;
    if (b.zero_allowed && below == 0) continue;
    std::ostringstream text;
    text.precision(17);
    text << key->path << "=" << below;
    EXPECT_THROW(Config::FromYaml(schema, "", "probe", {text.str()}), ConfigError) << text.str();
    Options options = defaults;
    field.set_number(options, below);
    EXPECT_FALSE(valid(options)) << text.str();
    if (!b.min_open && !(b.zero_allowed && b.min == 0)) {
      Options at_min = defaults;
      field.set_number(at_min, b.min);
      EXPECT_TRUE(Options::Fields().Check(at_min).empty()) << Options::Fields().Check(at_min);
    }
  }
  EXPECT_GE(compared, 3);
}

TEST(OptionSchemaTest, ForwardSolverKeysAreTheOptionsOwnFields) {
  const auto valid = [](const ForwardSolverOptions& o) { return o.IsValid(nullptr); };
  ExpectSchemaMatchesFields<ForwardSolverOptions>("model.solver.forward.",
                                                  ImplicitOptions{}.forward, valid);
}

TEST(OptionSchemaTest, BackwardKeysAreTheOptionsOwnFields) {
  const auto valid = [](const BackwardOptions& o) { return o.IsValid(nullptr); };
  // A config's model solve differs from ImplicitOptions{} in its adjoint
  // solver only (Anderson).
  const BackwardOptions defaults = DefaultModelSolverOptions().backward;
  EXPECT_EQ(defaults.solver, AdjointSolverType::kAnderson);
  BackwardOptions struct_defaults = ImplicitOptions{}.backward;
  struct_defaults.solver = AdjointSolverType::kAnderson;
  for (const auto& field : BackwardOptions::Fields().fields()) {
    EXPECT_EQ(field.Text(defaults), field.Text(struct_defaults)) << field.name;
  }
  ExpectSchemaMatchesFields<BackwardOptions>("model.solver.backward.", defaults, valid);
}

// A setting that does not apply to the chosen solver or mode is reported,
// from the same declaration: Anderson's memory under Picard, GMRES's restart
// under the fixed-point adjoint.
TEST(OptionSchemaTest, SettingsThatDoNotApplyAreFoundFromTheDeclaration) {
  ForwardSolverOptions forward;
  forward.type = ForwardSolverType::kPicard;
  forward.anderson_memory = 3;
  forward.picard_damping = 0.5;
  const auto unused = ForwardSolverOptions::Fields().Unused(forward);
  ASSERT_EQ(unused.size(), 1u);
  EXPECT_EQ(unused[0]->name, "anderson_memory");
  forward.fallback_chain = {ForwardSolverType::kAnderson};
  EXPECT_TRUE(ForwardSolverOptions::Fields().Unused(forward).empty());

  BackwardOptions backward;
  backward.gmres_restart = 7;
  backward.phantom_steps = 3;
  std::vector<std::string> names;
  for (const auto* field : BackwardOptions::Fields().Unused(backward)) names.push_back(field->name);
  EXPECT_EQ(names, (std::vector<std::string>{"gmres_restart", "phantom_steps"}));
}

TEST(OptionSchemaTest, TrainerEvalLogAndRegularizationKeysAreTheirOptionsFields) {
  ExpectSchemaMatchesFields<TrainerOptions>(
      "train.", TrainerOptions{},
      [](const TrainerOptions& o) { return TrainerOptions::Fields().Check(o).empty(); });
  ExpectSchemaMatchesFields<EvalOptions>(
      "eval.", EvalOptions{},
      [](const EvalOptions& o) { return EvalOptions::Fields().Check(o).empty(); });
  // A config's defaults are those of model.kind implicit, the default kind:
  // the struct's (all off) with ImplicitModelRegularization over them.
  RegularizationOptions implicit_defaults;
  int set = 0;
  for (const auto& [name, value] : ImplicitModelRegularization()) {
    for (const auto& field : RegularizationOptions::Fields().fields()) {
      if (field.name != name) continue;
      field.set_number(implicit_defaults, std::stod(value));
      ++set;
    }
  }
  EXPECT_EQ(set, 4);
  EXPECT_EQ(implicit_defaults.spectral_radius_weight, 100.0);
  ExpectSchemaMatchesFields<RegularizationOptions>(
      "model.regularization.", implicit_defaults,
      [](const RegularizationOptions& o) { return RegularizationOptions::Fields().Check(o).empty(); });
}

// model.* (ModelOptions with the cell's fields and model.energy.*),
// model.energy.* and its key_adaptation.* on their own, train.optimizer.*
// and train.schedule.*: each key's default, bounds and choices are its
// field's, and a value below a bound is refused by the schema and by the
// struct's IsValid.
TEST(OptionSchemaTest, ModelEnergyOptimizerAndScheduleKeysAreTheirOptionsFields) {
  ExpectSchemaMatchesFields<ModelOptions>(
      "model.", ConfigModelDefaults(),
      [](const ModelOptions& o) { return o.IsValid(nullptr); });
  ExpectSchemaMatchesFields<EnergyBlockOptions>(
      "model.energy.", EnergyBlockOptions{},
      [](const EnergyBlockOptions& o) { return o.IsValid(nullptr); });
  ExpectSchemaMatchesFields<KeyAdaptationOptions>(
      "model.energy.key_adaptation.", KeyAdaptationOptions{},
      [](const KeyAdaptationOptions& o) { return o.IsValid(nullptr); });
  ExpectSchemaMatchesFields<OptimizerOptions>(
      "train.optimizer.", OptimizerOptions{},
      [](const OptimizerOptions& o) { return o.IsValid(nullptr); });
  ExpectSchemaMatchesFields<ScheduleOptions>(
      "train.schedule.", ScheduleOptions{},
      [](const ScheduleOptions& o) { return o.IsValid(nullptr); });
}

// The model's keys land in the struct members they name, the cell's and the
// energy block's nested ones included, and the defaults a config gets are
// the structs' (the positional table's 64 rows the one exception).
TEST(OptionSchemaTest, ModelKeysAreReadIntoTheirMembers) {
  const Config defaults = Config::FromYaml(StillpointSchema(), "", "defaults");
  const ModelOptions d = ModelOptionsFromConfig(defaults);
  EXPECT_EQ(d.max_length, 64);
  EXPECT_EQ(ModelOptions{}.max_length, 32);
  EXPECT_EQ(d.cell_options.heads, CellOptions{}.heads);
  EXPECT_EQ(d.energy.key_adaptation.key_prior_precision,
            KeyAdaptationOptions{}.key_prior_precision);
  EXPECT_EQ(ScheduleOptionsFromConfig(defaults).warmup_steps, ScheduleOptions{}.warmup_steps);
  EXPECT_EQ(ScheduleOptionsFromConfig(defaults).min_ratio, ScheduleOptions{}.min_ratio);

  const Config config = Config::FromYaml(
      StillpointSchema(), "", "probe",
      {"model.heads=8", "model.ln_eps=0.001", "model.dropout=0.25", "model.kind=energy",
       "model.energy.layer=energy_transformer", "model.energy.memories=7",
       "model.energy.dynamics=non_leaky", "train.optimizer.lr=0.5",
       "train.optimizer.no_weight_decay=[.w]", "train.schedule.type=step",
       "train.schedule.warmup_steps=0"});
  const ModelOptions m = ModelOptionsFromConfig(config);
  EXPECT_EQ(m.kind, ModelKind::kEnergy);
  EXPECT_EQ(m.cell_options.heads, 8);
  EXPECT_EQ(m.energy.heads, 8);
  EXPECT_EQ(m.cell_options.ln_eps, 0.001);
  EXPECT_EQ(m.head_ln_eps, 0.001);
  EXPECT_EQ(m.cell_options.dropout, 0.25);
  EXPECT_EQ(m.energy.memories, 7);
  EXPECT_EQ(m.energy.dynamics, EnergyTransformerDynamics::kNonLeaky);
  const OptimizerOptions o = OptimizerOptionsFromConfig(config);
  EXPECT_EQ(o.learning_rate, 0.5);
  EXPECT_EQ(o.no_weight_decay_suffixes, std::vector<std::string>{".w"});
  const ScheduleOptions schedule = ScheduleOptionsFromConfig(config);
  EXPECT_EQ(schedule.type, ScheduleType::kStep);
  EXPECT_EQ(schedule.warmup_steps, 0);
}

// Which energy block reads a model.energy.* key is its field's AppliesWhen:
// a key set for a block the config does not use names the one that reads it.
TEST(OptionSchemaTest, EnergyKeysOfAnotherBlockAreFoundFromTheDeclaration) {
  EnergyBlockOptions options;
  options.layer = "hopfield";
  options.memories = 8;
  options.key_adaptation.iterations = 2;
  std::vector<std::string> names;
  for (const auto* field : EnergyBlockOptions::Fields().Unused(options)) {
    names.push_back(field->name);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"memories", "key_adaptation.iterations"}));
  options.layer = "probabilistic";
  ASSERT_EQ(EnergyBlockOptions::Fields().Unused(options).size(), 1u);
  try {
    ModelOptionsFromConfig(Config::FromYaml(
        StillpointSchema(), "", "probe",
        {"model.kind=energy", "model.energy.layer=hopfield", "model.energy.components=3"}));
    ADD_FAILURE() << "model.energy.components under hopfield was accepted";
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("read only by the expfam energy attention"),
              std::string::npos)
        << error.what();
  }
}

TEST(OptionSchemaTest, TheSchemaAndTheSolverAgreeWhereTheyOnceDisagreed) {
  for (const char* probe : {"model.solver.forward.anderson_memory=65",
                            "model.solver.forward.broyden_memory=257",
                            "model.solver.forward.gmres_restart=513"}) {
    EXPECT_THROW(Config::FromYaml(StillpointSchema(), "", "probe", {probe}), ConfigError) << probe;
  }
  ForwardSolverOptions options;
  options.anderson_memory = 64;
  options.broyden_memory = 256;
  options.gmres_restart = 512;
  EXPECT_TRUE(options.IsValid(nullptr));
  const Config config = Config::FromYaml(
      StillpointSchema(), "", "probe",
      {"model.solver.forward.anderson_memory=64", "model.solver.forward.broyden_memory=256",
       "model.solver.forward.gmres_restart=512", "train.clip_norm=0.25", "log.plots=false"});
  const ImplicitOptions read = ImplicitOptionsFromConfig(config);
  EXPECT_EQ(read.forward.anderson_memory, 64);
  EXPECT_EQ(read.forward.broyden_memory, 256);
  EXPECT_EQ(read.forward.gmres_restart, 512);
  EXPECT_EQ(TrainerOptions::FromConfig(config).clip_norm, 0.25);
  EXPECT_FALSE(LogOptions::FromConfig(config).plots);
}

}  // namespace
}  // namespace stillpoint::option_schema_test
