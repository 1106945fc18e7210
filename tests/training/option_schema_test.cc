// Options that describe themselves (framework/option_fields.h,
// training/option_schema.h): the config keys of the forward solver, the
// trainer, evaluation, logging and regularisation are made from the
// structs' own field declarations, so a key's default, range and choices
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
#include "solvers/options.h"
#include "training/config_schema.h"
#include "training/option_schema.h"
#include "training/trainer_options.h"

namespace stillpoint {
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
  ExpectSchemaMatchesFields<BackwardOptions>("model.solver.backward.", ImplicitOptions{}.backward,
                                             valid);
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
  ExpectSchemaMatchesFields<RegularizationOptions>(
      "model.regularization.", RegularizationOptions{},
      [](const RegularizationOptions& o) { return RegularizationOptions::Fields().Check(o).empty(); });
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
}  // namespace stillpoint
