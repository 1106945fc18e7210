#include "training/config.h"

#include <gtest/gtest.h>

#include <functional>

namespace stillpoint {
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

}  // namespace
}  // namespace stillpoint
