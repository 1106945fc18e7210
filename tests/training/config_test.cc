#include "training/config/config.h"

#include <gtest/gtest.h>

#include <algorithm>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "training/report/compare.h"
#include "training/config_schema.h"
#include "training/trainer.h"
#include "training/trainer_options.h"
#include "tests/scratch_path.h"

namespace stillpoint::config_test {
namespace {

ConfigSchema TestSchema() {
  ConfigSchema schema;
  schema.Int("seed", 0, "random seed", 0, 1000000)
      .RequiredString("task.kind", "which task")
      .Int("task.length", 16, "tokens per example", 2, 4096)
      .Enum("model.kind", "implicit", {"explicit", "tied", "implicit"}, "model kind")
      .Double("train.lr", 1e-3, "learning rate", 0.0, 10.0)
      .Bool("train.clip", true, "clip gradients")
      .StringList("compare.variants", {"explicit", "implicit"}, {"explicit", "tied", "implicit"},
                  "variants to compare")
      .DoubleList("eval.lengths", {16, 32}, "lengths", 1, 4096);
  return schema;
}

std::string ErrorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

TEST(ConfigTest, DefaultsAreFilledAndValuesParsed) {
  Config c = Config::FromYaml(TestSchema(), "task:\n  kind: reverse\ntrain:\n  lr: 3e-4\n",
                              "a.yaml");
  EXPECT_EQ(c.GetString("task.kind"), "reverse");
  EXPECT_DOUBLE_EQ(c.GetDouble("train.lr"), 3e-4);
  EXPECT_EQ(c.GetInt("task.length"), 16);
  EXPECT_TRUE(c.GetBool("train.clip"));
  EXPECT_EQ(c.GetStringList("compare.variants"), (std::vector<std::string>{"explicit", "implicit"}));
  EXPECT_EQ(c.GetDoubleList("eval.lengths"), (std::vector<double>{16, 32}));
  EXPECT_EQ(c.Origin("train.lr"), "a.yaml:4:3");
  EXPECT_EQ(c.Origin("seed"), "default");
}

TEST(ConfigTest, UnknownKeyNamesFileLineColumnAndSuggests) {
  const std::string message = ErrorOf([] {
    Config::FromYaml(TestSchema(), "task:\n  kind: reverse\n  lenght: 8\n", "b.yaml");
  });
  EXPECT_NE(message.find("b.yaml:3:3"), std::string::npos) << message;
  EXPECT_NE(message.find("unknown key 'task.lenght'"), std::string::npos) << message;
  EXPECT_NE(message.find("did you mean 'task.length'"), std::string::npos) << message;
}

TEST(ConfigTest, UnknownSectionIsSuggestedToo) {
  const std::string message =
      ErrorOf([] { Config::FromYaml(TestSchema(), "task: {kind: r}\nmodle:\n  kind: tied\n", "c"); });
  EXPECT_NE(message.find("unknown key 'modle'"), std::string::npos) << message;
  EXPECT_NE(message.find("did you mean 'model'"), std::string::npos) << message;
}

TEST(ConfigTest, WrongTypesAndRangesAreRejected) {
  auto load = [](const std::string& yaml) {
    return ErrorOf([&] { Config::FromYaml(TestSchema(), "task: {kind: r}\n" + yaml, "d.yaml"); });
  };
  std::string m = load("seed: many\n");
  EXPECT_NE(m.find("d.yaml:2:1"), std::string::npos) << m;
  EXPECT_NE(m.find("'seed': expected an integer, got 'many'"), std::string::npos) << m;
  m = load("seed: -4\n");
  EXPECT_NE(m.find("out of range [0, 1000000]"), std::string::npos) << m;
  m = load("train:\n  clip: maybe\n");
  EXPECT_NE(m.find("expected true or false"), std::string::npos) << m;
  m = load("model:\n  kind: recurrent\n");
  EXPECT_NE(m.find("'recurrent' is not one of 'explicit', 'tied', 'implicit'"), std::string::npos)
      << m;
  m = load("train: 5\n");
  EXPECT_NE(m.find("'train' is a section"), std::string::npos) << m;
  m = load("compare:\n  variants: [explicit, lstm]\n");
  EXPECT_NE(m.find("'lstm' is not one of"), std::string::npos) << m;
  m = load("train:\n  lr: .nan\n");
  EXPECT_NE(m.find("finite number"), std::string::npos) << m;
}

TEST(ConfigTest, MissingRequiredKeyAndMalformedYamlAreErrors) {
  std::string m = ErrorOf([] { Config::FromYaml(TestSchema(), "seed: 1\n", "e.yaml"); });
  EXPECT_NE(m.find("e.yaml: missing required key 'task.kind'"), std::string::npos) << m;
  m = ErrorOf([] { Config::FromYaml(TestSchema(), "task: [unclosed\n", "f.yaml"); });
  EXPECT_NE(m.find("f.yaml:"), std::string::npos) << m;
  EXPECT_NE(m.find("malformed YAML"), std::string::npos) << m;
  m = ErrorOf([] { Config::FromFile(TestSchema(), "/no/such/config.yaml"); });
  EXPECT_NE(m.find("/no/such/config.yaml"), std::string::npos) << m;
}

// A directory opens as an empty stream, which used to read as an empty
// config (every default) and train.
TEST(ConfigTest, DirectoryGivenAsTheConfigIsRefused) {
  const std::filesystem::path dir = testing_support::ScratchPathForThisTest("config");
  std::filesystem::create_directories(dir);
  const std::string m = ErrorOf([&] { Config::FromFile(TestSchema(), dir.string()); });
  EXPECT_NE(m.find(dir.string() + ": is a directory"), std::string::npos) << m;
  std::filesystem::remove_all(dir);
}

// An endless source is cut at the cap instead of being read into memory.
TEST(ConfigTest, ConfigLargerThanTheCapIsRefused) {
  const std::string m = ErrorOf([] { Config::FromFile(TestSchema(), "/dev/zero"); });
  EXPECT_NE(m.find("/dev/zero: larger than 1 MiB"), std::string::npos) << m;
}

TEST(ConfigTest, DuplicateKeysAreRefusedNamingBothPlaces) {
  std::string m = ErrorOf([] {
    Config::FromYaml(TestSchema(), "task:\n  kind: reverse\n  kind: sort\n", "d.yaml");
  });
  EXPECT_NE(m.find("d.yaml:3:3: duplicate key 'task.kind' (first given at d.yaml:2:3)"),
            std::string::npos)
      << m;
  m = ErrorOf([] {
    Config::FromYaml(TestSchema(), "task: {kind: reverse}\nseed: 1\ntask: {length: 8}\n",
                     "d.yaml");
  });
  EXPECT_NE(m.find("d.yaml:3:1: duplicate key 'task'"), std::string::npos) << m;
}

// yaml-cpp accepts a sequence or a mapping as a key; reading it as a name
// threw a conversion error that named no place.
TEST(ConfigTest, AKeyThatIsNotANameIsRefusedWithItsPlace) {
  const std::string m = ErrorOf([] {
    Config::FromYaml(TestSchema(), "task: {kind: reverse}\n[a, b]: 1\n", "key.yaml");
  });
  EXPECT_NE(m.find("key.yaml:2:1: a key must be a plain name"), std::string::npos) << m;
}

TEST(ConfigTest, SecondYamlDocumentIsRefused) {
  const std::string m = ErrorOf([] {
    Config::FromYaml(TestSchema(), "task: {kind: reverse}\n---\nseed: 5\n", "two.yaml");
  });
  EXPECT_NE(m.find("two.yaml:"), std::string::npos) << m;
  EXPECT_NE(m.find("a second YAML document"), std::string::npos) << m;
}

// yaml-cpp's LoadAll never returned on this text (tests/fuzz/config_fuzz.cc
// found it): its parser reports empty documents without end.
TEST(ConfigTest, TextThatLoopedTheYamlParserIsAnError) {
  const std::string m = ErrorOf([] {
    Config::FromYaml(TestSchema(),
                     "# All_steps: 2}\n, eval_every: 0, checkpoine_rtvey: 0, log_every: 2}\n"
                     "log: {progress: auto, plots: false}\n",
                     "loop.yaml");
  });
  EXPECT_NE(m.find("loop.yaml"), std::string::npos) << m;
}

TEST(ConfigTest, DeepNestingSaysWhatIsWrong) {
  const std::string m = ErrorOf([] {
    Config::FromYaml(TestSchema(), "task: " + std::string(5000, '[') + "\n", "deep.yaml");
  });
  EXPECT_NE(m.find("deep.yaml"), std::string::npos) << m;
  EXPECT_NE(m.find("nested too deeply"), std::string::npos) << m;
}

// Models compute in float32: 1e39 is finite as a double and inf there.
TEST(ConfigTest, NumbersBeyondFloat32AreRefused) {
  const std::string m = ErrorOf([] {
    Config::FromYaml(StillpointSchema(),
                     "task: {kind: reverse}\nmodel:\n  energy: {beta: 1e39}\n", "big.yaml");
  });
  EXPECT_NE(m.find("big.yaml:3:"), std::string::npos) << m;
  EXPECT_NE(m.find("model.energy.beta"), std::string::npos) << m;
  EXPECT_NE(m.find("does not fit in float32"), std::string::npos) << m;
  const std::string o = ErrorOf([] {
    Config::FromYaml(StillpointSchema(), "task: {kind: reverse}\n", "big.yaml",
                     {"train.optimizer.lr=-1e39"});
  });
  EXPECT_NE(o.find("does not fit in float32"), std::string::npos) << o;
}

TEST(ConfigTest, UnknownCellNamesTheKeyAndWhereItWasSet) {
  const std::string m = ErrorOf([] {
    ModelOptionsFromConfig(Config::FromYaml(
        StillpointSchema(), "task: {kind: reverse}\nmodel:\n  cell: nope\n", "cell.yaml"));
  });
  EXPECT_NE(m.find("cell.yaml:3:3: unknown cell 'nope' in model.cell (known: "), std::string::npos)
      << m;
}

TEST(ConfigTest, OverridesReplaceValuesAndAreCheckedLikeTheFile) {
  Config c = Config::FromYaml(TestSchema(), "task: {kind: reverse}\n", "g.yaml",
                              {"train.lr=0.01", "compare.variants=[tied]", "model.kind=tied"});
  EXPECT_DOUBLE_EQ(c.GetDouble("train.lr"), 0.01);
  EXPECT_EQ(c.GetStringList("compare.variants"), (std::vector<std::string>{"tied"}));
  EXPECT_EQ(c.Origin("model.kind"), "override 'model.kind=tied'");
  std::string m = ErrorOf([&] { c.Set("train.lrr=1"); });
  EXPECT_NE(m.find("did you mean 'train.lr'"), std::string::npos) << m;
  m = ErrorOf([&] { c.Set("train.lr=-1"); });
  EXPECT_NE(m.find("override 'train.lr=-1'"), std::string::npos) << m;
  m = ErrorOf([&] { c.Set("no-equals-sign"); });
  EXPECT_NE(m.find("expected key.path=value"), std::string::npos) << m;
}

TEST(ConfigTest, ResolvedYamlRoundTrips) {
  Config c = Config::FromYaml(TestSchema(), "task: {kind: sort}\nseed: 7\n", "h.yaml");
  const std::string yaml = c.ToYaml();
  Config again = Config::FromYaml(TestSchema(), yaml, "resolved.yaml");
  EXPECT_EQ(again.ToYaml(), yaml);
  EXPECT_EQ(again.GetInt("seed"), 7);
  EXPECT_EQ(again.GetString("task.kind"), "sort");
  EXPECT_NE(yaml.find("lengths: [16, 32]"), std::string::npos) << yaml;
}

TEST(ConfigTest, SchemaMarkdownListsEveryKey) {
  const ConfigSchema schema = TestSchema();
  const std::string md = schema.ToMarkdown();
  for (const ConfigKey& key : schema.keys()) {
    EXPECT_NE(md.find("`" + key.path + "`"), std::string::npos) << key.path;
  }
}


// ---- the energy model kind: model.energy.*

Config EnergyConfig(const std::string& extra) {
  return Config::FromYaml(StillpointSchema(),
                          "task: {kind: reverse}\nmodel:\n  kind: energy\n" + extra,
                          "energy.yaml");
}

TEST(EnergyConfigTest, UnknownLayerNamesTheKeyAndTheKnownLayers) {
  const std::string m =
      ErrorOf([] { ModelOptionsFromConfig(EnergyConfig("  energy: {layer: hopfeld}\n")); });
  EXPECT_NE(m.find("energy.yaml"), std::string::npos) << m;
  EXPECT_NE(m.find("model.energy.layer"), std::string::npos) << m;
  EXPECT_NE(m.find("'hopfeld'"), std::string::npos) << m;
  EXPECT_NE(m.find("energy_transformer, expfam, hopfield, probabilistic"), std::string::npos)
      << m;
}

Config AttentionConfig(const std::string& extra) {
  return Config::FromYaml(StillpointSchema(), "task: {kind: reverse}\n" + extra, "grid.yaml");
}

TEST(AttentionConfigTest, ModelAttentionReachesTheCellAndAnUnknownOneIsNamed) {
  const ModelOptions m =
      ModelOptionsFromConfig(AttentionConfig("model:\n  attention: hopfield\n  attention_solver:\n"
                                             "    forward: {max_iterations: 7}\n"));
  EXPECT_EQ(m.cell_options.attention, "hopfield");
  ASSERT_TRUE(m.cell_options.attention_solver.has_value());
  EXPECT_EQ(m.cell_options.attention_solver->forward.max_iterations, 7);
  EXPECT_EQ(ModelOptionsFromConfig(AttentionConfig("")).cell_options.attention, "softmax");
  const std::string error =
      ErrorOf([] { ModelOptionsFromConfig(AttentionConfig("model: {attention: probabilstic}\n")); });
  EXPECT_NE(error.find("grid.yaml:2:"), std::string::npos) << error;
  EXPECT_NE(error.find("unknown attention 'probabilstic' in model.attention"), std::string::npos)
      << error;
  EXPECT_NE(error.find("did you mean 'probabilistic'?"), std::string::npos) << error;
  // The inner solve has no warm start (one call site serves every evaluation).
  EXPECT_NE(ErrorOf([] {
              AttentionConfig("model: {attention_solver: {backward: {warm_start: true}}}\n");
            }).find("unknown key 'model.attention_solver.backward.warm_start'"),
            std::string::npos);
}

TEST(AttentionConfigTest, TheGridCrossesAttentionsWithKindsAndIsCheckedBeforeTraining) {
  const Config grid = AttentionConfig(
      "compare: {attention: [softmax, probabilistic], kinds: [explicit, implicit, energy]}\n");
  EXPECT_EQ(CompareVariants(grid),
            (std::vector<std::string>{"softmax/explicit", "softmax/implicit",
                                      "probabilistic/explicit", "probabilistic/implicit",
                                      "probabilistic/energy"}));
  EXPECT_NO_THROW(ValidateCompareVariants(grid));
  EXPECT_EQ(VariantOverrides("probabilistic/implicit"),
            (std::vector<std::string>{"model.kind=implicit", "model.attention=probabilistic"}));
  EXPECT_EQ(VariantOverrides("hopfield/energy"),
            (std::vector<std::string>{"model.kind=energy", "model.attention=hopfield"}));
  EXPECT_TRUE(VariantOverrides("softmax/energy").empty());
  EXPECT_TRUE(VariantOverrides("nope/explicit").empty());
  std::string error = ErrorOf(
      [] { ValidateCompareVariants(AttentionConfig("compare: {attention: [softmaxx]}\n")); });
  EXPECT_NE(error.find("unknown attention 'softmaxx' in compare.attention"), std::string::npos)
      << error;
  EXPECT_NE(error.find("did you mean 'softmax'?"), std::string::npos) << error;
  error = ErrorOf([] {
    ValidateCompareVariants(
        AttentionConfig("compare: {attention: [softmax], kinds: [explicit, explicit]}\n"));
  });
  EXPECT_NE(error.find("'softmax/explicit' appears twice in compare.kinds"), std::string::npos)
      << error;
  error = ErrorOf([] {
    ValidateCompareVariants(AttentionConfig("compare: {attention: [softmax], kinds: [sideways]}\n"));
  });
  EXPECT_NE(error.find("unknown kind in variant 'softmax/sideways'"), std::string::npos) << error;
}

TEST(AttentionConfigTest, ABlockKeyNoModelReadsIsAnError) {
  // value_precision is read only by the probabilistic block.
  std::string error = ErrorOf([] {
    ModelOptionsFromConfig(
        AttentionConfig("model:\n  attention: hopfield\n  energy: {value_precision: 3}\n"));
  });
  EXPECT_NE(error.find("grid.yaml:4:"), std::string::npos) << error;
  EXPECT_NE(error.find("model.energy.value_precision is read only by the probabilistic energy "
                       "attention, and this config uses hopfield"),
            std::string::npos)
      << error;
  error = ErrorOf(
      [] { ModelOptionsFromConfig(AttentionConfig("model: {energy: {memories: 7}}\n")); });
  EXPECT_NE(error.find("this config uses no energy attention"), std::string::npos) << error;
  // Read by some variant of a comparison: not an error for the others.
  const Config grid = AttentionConfig(
      "model: {energy: {value_precision: 3, key_adaptation: {iterations: 2}}}\n"
      "compare: {attention: [softmax, probabilistic]}\n");
  const ModelOptions m = ModelOptionsFromConfig(grid);
  EXPECT_EQ(m.energy.value_precision, 3.0);
  EXPECT_EQ(m.energy.key_adaptation.iterations, 2);
  EXPECT_NO_THROW(ModelOptionsFromConfig(
      AttentionConfig("model: {attention: expfam, energy: {measure: mixture, components: 3}}\n")));
}

TEST(EnergyConfigTest, BadValuesAreErrorsNamingTheKey) {
  for (const std::string& yaml :
       {std::string("  energy: {dynamics: sideways}\n"), std::string("  energy: {key_grad: half}\n"),
        std::string("  energy: {memory: lstm}\n"), std::string("  energy: {beta: -1}\n"),
        std::string("  energy: {memories: 0}\n"), std::string("  energy: {step: -1}\n"),
        std::string("  energy: {value_precision: -0.5}\n"), std::string("  energy: {layers: x}\n")}) {
    const std::string m = ErrorOf([&] { ModelOptionsFromConfig(EnergyConfig(yaml)); });
    EXPECT_NE(m.find("model.energy."), std::string::npos) << yaml << " -> " << m;
  }
}

// The correction loss is taken on an implicit solve's iterates: other model
// kinds are refused before a run starts, naming the key.
TEST(ConfigTest, TheCorrectionLossNeedsAnImplicitModel) {
  const auto config = [](const std::string& kind) {
    return Config::FromYaml(StillpointSchema(),
                            "model:\n  kind: " + kind +
                                "\n  regularization: {correction_weight: 0.5}\n",
                            "correction.yaml");
  };
  for (const std::string kind : {"explicit", "tied", "energy"}) {
    const std::string m = ErrorOf([&] { CheckTrainingConfig(config(kind)); });
    EXPECT_NE(m.find("correction.yaml:"), std::string::npos) << m;
    EXPECT_NE(m.find("model.regularization.correction_weight needs model.kind implicit"),
              std::string::npos)
        << m;
  }
  EXPECT_NO_THROW(CheckTrainingConfig(config("implicit")));
  const ModelOptions options = ModelOptionsFromConfig(config("implicit"));
  EXPECT_EQ(options.implicit.sampled_iterates, 2);  // correction_iterates' default
  Config off = config("implicit");
  off.Set("model.regularization.correction_weight=0");
  EXPECT_EQ(ModelOptionsFromConfig(off).implicit.sampled_iterates, 0);
}

// The Jacobian and spectral-radius penalties are taken at the model's own
// fixed point: implicit and energy kinds; explicit and tied are refused.
TEST(ConfigTest, FixedPointPenaltiesNeedAFixedPoint) {
  for (const std::string key : {"jacobian_weight", "spectral_radius_weight"}) {
    const auto config = [&](const std::string& kind) {
      return Config::FromYaml(StillpointSchema(),
                              "model:\n  kind: " + kind + "\n  regularization: {" + key +
                                  ": 0.5}\n",
                              "penalty.yaml");
    };
    for (const std::string kind : {"explicit", "tied"}) {
      const std::string m = ErrorOf([&] { CheckTrainingConfig(config(kind)); });
      EXPECT_NE(m.find("penalty.yaml:"), std::string::npos) << m;
      EXPECT_NE(m.find("model.regularization." + key + " needs model.kind implicit or energy"),
                std::string::npos)
          << m;
    }
    EXPECT_NO_THROW(CheckTrainingConfig(config("implicit")));
    EXPECT_NO_THROW(CheckTrainingConfig(config("energy")));
  }
}

// Every key of model.regularization.* set away from its default (a weight,
// and as much a probe count, frequency, ramp, target or damping) is refused
// by name for a model without a fixed point of its own, and the correction
// loss's keys for the energy kind (it has no solved cell); exit 2 through
// ConfigError. A key left at its default value is accepted everywhere.
// The attention penalty is taken at the inner solves of the cells' energy
// attentions: refused for softmax attention and for the energy kind (whose
// block is the model's own fixed point), naming the key and the reason.
TEST(ConfigTest, AttentionRegularizationKeysNeedAnEnergyAttentionInTheCells) {
  const auto config = [](const std::string& kind, const std::string& attention) {
    return Config::FromYaml(StillpointSchema(),
                            "model:\n  kind: " + kind + "\n  attention: " + attention +
                                "\n  regularization: {attention_spectral_radius_weight: 3}\n",
                            "keys.yaml");
  };
  for (const std::string kind : {"explicit", "tied", "implicit"}) {
    EXPECT_NO_THROW(CheckTrainingConfig(config(kind, "energy_transformer"))) << kind;
    const std::string m = ErrorOf([&] { CheckTrainingConfig(config(kind, "softmax")); });
    EXPECT_NE(m.find("keys.yaml:"), std::string::npos) << m;
    EXPECT_NE(m.find("model.regularization.attention_spectral_radius_weight needs an energy "
                     "attention"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("not model.attention softmax"), std::string::npos) << m;
  }
  const std::string m = ErrorOf([&] { CheckTrainingConfig(config("energy", "hopfield")); });
  EXPECT_NE(m.find("not model.kind energy"), std::string::npos) << m;
  EXPECT_NE(m.find("spectral_radius_*"), std::string::npos) << m;
  // Off (weight 0, the default) is accepted anywhere.
  EXPECT_NO_THROW(CheckTrainingConfig(Config::FromYaml(
      StillpointSchema(), "model:\n  kind: energy\n  regularization: {attention_spectral_radius_target: 0.8}\n",
      "keys.yaml")));
}

// model.attention energy_transformer gives its cells the attention penalty,
// 40 inner iterations and a GMRES inner adjoint by default; a value the file
// sets wins, an earlier rule (dtype float64's budget) wins over it, the
// default is ignored by the energy kind rather than refused, and another
// attention keeps the plain defaults.
TEST(ConfigTest, EnergyTransformerDefaultsFollowModelAttention) {
  const auto config = [](const std::string& yaml) {
    return Config::FromYaml(StillpointSchema(), yaml, "keys.yaml");
  };
  const Config et = config("model:\n  kind: explicit\n  attention: energy_transformer\n");
  EXPECT_EQ(et.GetDouble("model.regularization.attention_spectral_radius_weight"), 30.0);
  EXPECT_EQ(et.GetString("model.attention_solver.backward.solver"), "gmres");
  EXPECT_EQ(et.GetInt("model.attention_solver.backward.max_iterations"), 40);
  EXPECT_EQ(et.GetInt("model.attention_solver.forward.max_iterations"), 40);
  EXPECT_NO_THROW(CheckTrainingConfig(et));

  const Config hopfield = config("model:\n  kind: explicit\n  attention: hopfield\n");
  EXPECT_EQ(hopfield.GetDouble("model.regularization.attention_spectral_radius_weight"), 0.0);
  EXPECT_EQ(hopfield.GetString("model.attention_solver.backward.solver"), "fixed_point");
  EXPECT_EQ(hopfield.GetInt("model.attention_solver.forward.max_iterations"), 16);

  const Config set = config(
      "model:\n  attention: energy_transformer\n  attention_solver: {backward: {solver: anderson}}\n"
      "  regularization: {attention_spectral_radius_weight: 5}\n");
  EXPECT_EQ(set.GetString("model.attention_solver.backward.solver"), "anderson");
  EXPECT_EQ(set.GetDouble("model.regularization.attention_spectral_radius_weight"), 5.0);

  const Config float64 = config("dtype: float64\nmodel:\n  attention: energy_transformer\n");
  EXPECT_EQ(float64.GetInt("model.attention_solver.forward.max_iterations"), 100);

  Config energy = config("model:\n  kind: energy\n  attention: energy_transformer\n");
  EXPECT_NO_THROW(CheckTrainingConfig(energy));
  energy.Set("model.regularization.attention_spectral_radius_weight=5");  // given: refused
  EXPECT_NE(ErrorOf([&] { CheckTrainingConfig(energy); }).find("not model.kind energy"),
            std::string::npos);
  // The default follows a later change of model.attention (Config::Set).
  Config changed = config("model:\n  kind: explicit\n");
  changed.Set("model.attention=energy_transformer");
  EXPECT_EQ(changed.GetString("model.attention_solver.backward.solver"), "gmres");
}

TEST(ConfigTest, EveryRegularizationKeyNeedsAFixedPoint) {
  const RegularizationOptions defaults;
  for (const auto& field : RegularizationOptions::Fields().fields()) {
    if (!field.in_config) continue;
    const std::string key = "model.regularization." + field.name;
    // A valid value other than the default: another choice, or a number.
    RegularizationOptions other = defaults;
    if (!field.choices.empty()) {
      for (const std::string& choice : field.choices) {
        if (choice != field.Text(defaults)) field.set_text(other, choice);
      }
    } else {
      const double value = field.get_number(defaults);
      const double changed = field.kind == OptionKind::kInt ? value + 1
                             : value >= 1.0                ? value / 2
                                                            : (value + 1.0) / 2;
      field.set_number(other, changed);
    }
    ASSERT_NE(field.Text(other), field.Text(defaults)) << key;
    const auto config = [&](const std::string& kind, const std::string& text) {
      return Config::FromYaml(StillpointSchema(),
                              "model:\n  kind: " + kind + "\n  regularization: {" +
                                  field.name + ": " + text + "}\n",
                              "keys.yaml");
    };
    const bool correction = field.name.rfind("correction_", 0) == 0;
    // The attention penalty's keys have their own rule (below).
    if (field.name.rfind("attention_", 0) == 0) continue;
    for (const std::string kind : {"explicit", "tied", "energy"}) {
      if (kind == "energy" && !correction) {
        EXPECT_NO_THROW(CheckTrainingConfig(config(kind, field.Text(other)))) << key;
        continue;
      }
      const std::string m = ErrorOf([&] { CheckTrainingConfig(config(kind, field.Text(other))); });
      EXPECT_NE(m.find("keys.yaml:"), std::string::npos) << key << ": " << m;
      EXPECT_NE(m.find(key + " needs model.kind implicit"), std::string::npos) << m;
      EXPECT_NE(m.find("not " + kind), std::string::npos) << m;
      // Its default value changes nothing and is accepted.
      EXPECT_NO_THROW(CheckTrainingConfig(config(kind, field.Text(defaults)))) << key;
    }
    EXPECT_NO_THROW(CheckTrainingConfig(config("implicit", field.Text(other)))) << key;
  }
}

// A comparison's regularisers and solve start apply to the variants that
// solve a fixed point, and its progressive loss to those that run a cell
// for any number of steps; the other variants get them set back to their
// defaults, so the comparison is valid and those variants train without
// them.
TEST(ConfigTest, CompareKeepsRegularizersToTheVariantsWithAFixedPoint) {
  const Config c = Config::FromYaml(
      StillpointSchema(),
      "model:\n  regularization: {jacobian_weight: 0.5, jacobian_ramp_steps: 20}\n"
      "  solver: {init: mixed}\n"
      "train: {progressive_loss: {weight: 0.5, steps: 2}}\n"
      "compare: {variants: [explicit, tied, implicit]}\n",
      "compare.yaml");
  EXPECT_NO_THROW(ValidateCompareVariants(c));
  EXPECT_EQ(VariantConfigOverrides(c, "implicit"),
            (std::vector<std::string>{"model.kind=implicit"}));
  // The tied variant keeps the progressive loss (a cell run any number of
  // steps), the explicit one trains without it.
  EXPECT_EQ(VariantConfigOverrides(c, "tied"),
            (std::vector<std::string>{"model.kind=tied", "model.solver.init=zeros",
                                      "model.regularization.jacobian_weight=0",
                                      "model.regularization.jacobian_ramp_steps=0"}));
  EXPECT_EQ(VariantConfigOverrides(c, "explicit"),
            (std::vector<std::string>{"model.kind=explicit", "model.solver.init=zeros",
                                      "model.regularization.jacobian_weight=0",
                                      "model.regularization.jacobian_ramp_steps=0",
                                      "train.progressive_loss.weight=0"}));
}

// The attention penalty applies to the variants with an energy attention
// inside their cells: an attention grid's softmax variants and its energy
// kind get it set back, the others keep it.
TEST(ConfigTest, CompareKeepsTheAttentionPenaltyToCellsWithEnergyAttention) {
  const Config c = Config::FromYaml(
      StillpointSchema(),
      "model:\n  regularization: {attention_spectral_radius_weight: 3}\n"
      "compare: {attention: [softmax, hopfield], kinds: [explicit, implicit, energy]}\n",
      "compare.yaml");
  EXPECT_NO_THROW(ValidateCompareVariants(c));
  const std::string reset = "model.regularization.attention_spectral_radius_weight=0";
  const auto resets = [&](const std::string& variant) {
    const std::vector<std::string> o = VariantConfigOverrides(c, variant);
    return std::find(o.begin(), o.end(), reset) != o.end();
  };
  EXPECT_TRUE(resets("softmax/explicit"));
  EXPECT_TRUE(resets("softmax/implicit"));
  EXPECT_FALSE(resets("hopfield/explicit"));
  EXPECT_FALSE(resets("hopfield/implicit"));
  EXPECT_TRUE(resets("hopfield/energy"));
}

// compare.overrides: a setting of one variant, after the variant's own, and
// nothing for the others; an entry that is not VARIANT:KEY=VALUE, names a
// variant the comparison does not train, or sets an unknown key is refused
// before any training, naming the entry.
TEST(ConfigTest, CompareOverridesSetOneVariant) {
  const auto config = [](const std::string& entries) {
    return Config::FromYaml(StillpointSchema(),
                            "compare:\n  variants: [explicit, implicit]\n  overrides: [" +
                                entries + "]\n",
                            "compare.yaml");
  };
  const Config c = config("'implicit: train.optimizer.lr=2.0e-3', implicit:model.hidden=48");
  EXPECT_NO_THROW(ValidateCompareVariants(c));
  EXPECT_EQ(VariantConfigOverrides(c, "implicit"),
            (std::vector<std::string>{"model.kind=implicit", "train.optimizer.lr=2.0e-3",
                                      "model.hidden=48"}));
  EXPECT_EQ(VariantConfigOverrides(c, "explicit"),
            (std::vector<std::string>{"model.kind=explicit"}));

  const std::string no_colon = ErrorOf([&] { ValidateCompareVariants(config("model.dim=8")); });
  EXPECT_NE(no_colon.find("'model.dim=8' is not VARIANT:KEY=VALUE"), std::string::npos)
      << no_colon;
  const std::string untrained =
      ErrorOf([&] { ValidateCompareVariants(config("tied:model.dim=8")); });
  EXPECT_NE(untrained.find("names variant 'tied'"), std::string::npos) << untrained;
  EXPECT_NE(untrained.find("explicit, implicit"), std::string::npos) << untrained;
  const std::string unknown_key =
      ErrorOf([&] { ValidateCompareVariants(config("implicit:model.dimm=8")); });
  EXPECT_NE(unknown_key.find("variant 'implicit'"), std::string::npos) << unknown_key;
  EXPECT_NE(unknown_key.find("model.dimm"), std::string::npos) << unknown_key;
}

// Rules that tie solver keys together are checked with the solvers' own
// validation when the model options are made, before any work, as config
// errors naming the file and the field.
TEST(ConfigTest, SolverOptionsAreValidatedAsAWhole) {
  // A range the schema takes from the options' own declaration.
  std::string m = ErrorOf([] {
    ModelOptionsFromConfig(Config::FromYaml(
        StillpointSchema(), "model:\n  solver:\n    forward: {divergence_factor: 0.5}\n",
        "solver.yaml"));
  });
  EXPECT_NE(m.find("solver.yaml"), std::string::npos) << m;
  EXPECT_NE(m.find("model.solver.forward.divergence_factor"), std::string::npos) << m;
  EXPECT_NE(m.find("0 or (1, "), std::string::npos) << m;
  EXPECT_NO_THROW(ModelOptionsFromConfig(Config::FromYaml(
      StillpointSchema(), "model:\n  solver:\n    forward: {divergence_factor: 0}\n", "ok")));
  // A rule between keys: the solvers' own check, before any work.
  m = ErrorOf([] {
    ModelOptionsFromConfig(Config::FromYaml(
        StillpointSchema(), "model:\n  solver:\n    forward: {fallback_chain: [anderson]}\n",
        "solver.yaml"));
  });
  // Named by the user's key, not by the struct that holds it (issue 48:
  // "ForwardSolverOptions: ..." named no key).
  EXPECT_NE(m.find("solver.yaml: model.solver.forward.fallback_chain holds anderson"),
            std::string::npos)
      << m;
  EXPECT_EQ(m.find("Options"), std::string::npos) << m;
}

// Every model.energy key reaches the block options (flip one, the options
// change in that field only).
TEST(EnergyConfigTest, EveryKeyChangesTheBlockOptions) {
  const ModelOptions base = ModelOptionsFromConfig(EnergyConfig(""));
  EXPECT_EQ(base.kind, ModelKind::kEnergy);
  EXPECT_EQ(base.energy.layer, "probabilistic");
  EXPECT_EQ(base.energy.heads, base.cell_options.heads);
  EXPECT_EQ(base.energy.dim, base.dim);
  struct Flip {
    std::string yaml;
    std::function<bool(const EnergyBlockOptions&)> changed;
  };
  const EnergyBlockOptions& b = base.energy;
  const std::vector<Flip> flips = {
      {"layer: hopfield", [&](const EnergyBlockOptions& e) { return e.layer != b.layer; }},
      {"beta: 3.5", [&](const EnergyBlockOptions& e) { return e.beta != b.beta; }},
      {"value_precision: 0.25",
       [&](const EnergyBlockOptions& e) { return e.value_precision != b.value_precision; }},
      {"layer: energy_transformer, key_grad: stop",
       [&](const EnergyBlockOptions& e) { return e.key_grad != b.key_grad; }},
      {"layer: energy_transformer, dynamics: non_leaky",
       [&](const EnergyBlockOptions& e) { return e.dynamics != b.dynamics; }},
      {"layer: energy_transformer, memory: softmax",
       [&](const EnergyBlockOptions& e) { return e.memory != b.memory; }},
      {"layer: energy_transformer, memories: 7",
       [&](const EnergyBlockOptions& e) { return e.memories != b.memories; }},
      {"layer: energy_transformer, step: 0.05",
       [&](const EnergyBlockOptions& e) { return e.step != b.step; }},
      {"layer: energy_transformer, readout: move",
       [&](const EnergyBlockOptions& e) { return e.readout != b.readout; }},
      {"key_adaptation: {iterations: 3}",
       [&](const EnergyBlockOptions& e) {
         return e.key_adaptation.iterations != b.key_adaptation.iterations;
       }},
      {"layer: expfam, measure: mixture",
       [&](const EnergyBlockOptions& e) { return e.measure != b.measure; }},
      {"layer: expfam, components: 2",
       [&](const EnergyBlockOptions& e) { return e.components != b.components; }}};
  for (const Flip& flip : flips) {
    const ModelOptions m = ModelOptionsFromConfig(EnergyConfig("  energy: {" + flip.yaml + "}\n"));
    EXPECT_TRUE(flip.changed(m.energy)) << flip.yaml;
  }
}

TEST(EnergyConfigTest, CompareKnowsTheEnergyVariants) {
  Config c = Config::FromYaml(StillpointSchema(),
                              "task: {kind: reverse}\ncompare:\n  variants: [energy, "
                              "energy_hopfield, energy_energy_transformer]\n",
                              "cmp.yaml");
  EXPECT_NO_THROW(ValidateCompareVariants(c));
  EXPECT_EQ(VariantOverrides("energy_expfam"),
            (std::vector<std::string>{"model.kind=energy", "model.energy.layer=expfam"}));
  EXPECT_EQ(VariantOverrides("energy"), (std::vector<std::string>{"model.kind=energy"}));
  const Config bad = Config::FromYaml(
      StillpointSchema(), "task: {kind: reverse}\ncompare: {variants: [energy_hopfeld]}\n",
      "cmp.yaml");
  const std::string m = ErrorOf([&] { ValidateCompareVariants(bad); });
  EXPECT_NE(m.find("energy_hopfeld"), std::string::npos) << m;
  EXPECT_NE(m.find("energy_probabilistic"), std::string::npos) << m;
}

}  // namespace
}  // namespace stillpoint::config_test
