// `stillpoint config`: the resolved config, the plain and Markdown
// references, the JSON Schema (checked by validating every example config
// against it), shortest round-trip numbers and did-you-mean for values.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/scratch_path.h"
#include "training/cli/cli_commands.h"
#include "training/config_reference.h"
#include "training/config_schema.h"

namespace stillpoint::config_cli_test {
namespace {

namespace fs = std::filesystem;

std::string RunConfigCommand(const ConfigArgs& args, int* code = nullptr) {
  std::ostringstream out, err;
  const int status = RunConfig(args, out, err);
  if (code) *code = status;
  return status == 0 ? out.str() : err.str();
}

// The part of JSON Schema ConfigJsonSchema uses: type, enum, minimum,
// maximum, items, properties, additionalProperties, required. Returns the
// first violation ("" when the value conforms).
std::string Validate(const YAML::Node& value, const YAML::Node& schema, const std::string& at) {
  auto has_type = [&](const std::string& type) {
    const YAML::Node t = schema["type"];
    if (t.IsSequence()) {
      for (const auto& item : t) {
        if (item.as<std::string>() == type) return true;
      }
      return false;
    }
    return t.as<std::string>() == type;
  };
  if (schema["properties"]) {
    if (!value.IsMap()) return at + ": not a mapping";
    for (const auto& entry : value) {
      const std::string name = entry.first.as<std::string>();
      if (!schema["properties"][name]) return at + "." + name + ": not allowed";
      const std::string error =
          Validate(entry.second, schema["properties"][name], at + "." + name);
      if (!error.empty()) return error;
    }
    for (const auto& name : schema["required"]) {
      if (!value[name.as<std::string>()]) return at + ": lacks " + name.as<std::string>();
    }
    return "";
  }
  if (value.IsNull()) return has_type("null") ? "" : at + ": null";
  if (value.IsSequence()) {
    if (!has_type("array")) return at + ": a list";
    for (std::size_t i = 0; i < value.size(); ++i) {
      const std::string error = Validate(value[i], schema["items"], at + "[" + std::to_string(i) + "]");
      if (!error.empty()) return error;
    }
    return "";
  }
  const std::string text = value.Scalar();
  if (schema["enum"]) {
    bool found = false;
    for (const auto& choice : schema["enum"]) found = found || choice.as<std::string>() == text;
    if (!found) return at + ": '" + text + "' not in the enum";
  }
  if (has_type("number") || has_type("integer")) {
    double number = 0;
    try {
      number = value.as<double>();
    } catch (const YAML::Exception&) {
      return at + ": not a number";
    }
    if (schema["minimum"] && number < schema["minimum"].as<double>()) return at + ": below minimum";
    if (schema["maximum"] && number > schema["maximum"].as<double>()) return at + ": above maximum";
  }
  if (has_type("boolean") && text != "true" && text != "false") return at + ": not a boolean";
  return "";
}

TEST(ConfigCommandTest, JsonSchemaAcceptsEveryExampleConfigAndRefusesMistakes) {
  ConfigArgs args;
  args.json_schema = true;
  int code = -1;
  const std::string text = RunConfigCommand(args, &code);
  ASSERT_EQ(code, 0) << text;
  const YAML::Node schema = YAML::Load(text);
  EXPECT_EQ(schema["$schema"].as<std::string>(), "http://json-schema.org/draft-07/schema#");
  EXPECT_FALSE(schema["additionalProperties"].as<bool>());
  EXPECT_EQ(schema["properties"]["task"]["properties"]["test_fraction"]["default"].as<std::string>(),
            "0.2");
  int checked = 0;
  for (const auto& entry :
       fs::directory_iterator(fs::path(STILLPOINT_SOURCE_DIR) / "examples" / "configs")) {
    if (entry.path().extension() != ".yaml") continue;
    EXPECT_EQ(Validate(YAML::LoadFile(entry.path().string()), schema, "config"), "")
        << entry.path();
    ++checked;
  }
  EXPECT_GE(checked, 5);
  // The defaults conform too: the resolved default config.
  EXPECT_EQ(Validate(YAML::Load(Config::FromYaml(StillpointSchema(), "task: {kind: reverse}",
                                                 "inline")
                                    .ToYaml()),
                     schema, "config"),
            "");
  EXPECT_NE(Validate(YAML::Load("model: {kidn: implicit}"), schema, "config"), "");
  EXPECT_NE(Validate(YAML::Load("model: {kind: implicitt}"), schema, "config"), "");
  EXPECT_NE(Validate(YAML::Load("train: {steps: -1}"), schema, "config"), "");
}

TEST(ConfigCommandTest, ResolvedConfigAndReferences) {
  const fs::path dir = testing_support::ScratchPathForThisTest("config_cli");
  fs::create_directories(dir);
  const std::string path = (dir / "c.yaml").string();
  std::ofstream(path) << "task: {kind: reverse}\nmodel: {dropout: 0.1}\n";
  ConfigArgs args;
  args.config_path = path;
  args.overrides = {"train.steps=7"};
  args.resolved = true;
  int code = -1;
  const std::string resolved = RunConfigCommand(args, &code);
  ASSERT_EQ(code, 0) << resolved;
  const YAML::Node node = YAML::Load(resolved);
  EXPECT_EQ(node["train"]["steps"].as<int>(), 7);
  // Shortest round-trip numbers, not 0.10000000000000001.
  EXPECT_NE(resolved.find("dropout: 0.1\n"), std::string::npos) << resolved;
  EXPECT_NE(resolved.find("test_fraction: 0.2\n"), std::string::npos) << resolved;
  EXPECT_EQ(resolved.find("0000000000"), std::string::npos) << resolved;
  // Loading the printed config gives the same config.
  EXPECT_EQ(Config::FromYaml(StillpointSchema(), resolved, "printed").ToYaml(), resolved);

  // A mistyped value: did you mean.
  args.overrides = {"model.kind=implicitt"};
  const std::string error = RunConfigCommand(args, &code);
  EXPECT_EQ(code, 2);
  EXPECT_NE(error.find("did you mean 'implicit'?"), std::string::npos) << error;
  args.overrides = {"log.formats=[csv, jsnl]"};
  EXPECT_NE(RunConfigCommand(args, &code).find("did you mean 'jsonl'?"), std::string::npos);

  // The references: plain text and Markdown differ; --keys lists paths.
  ConfigArgs plain;
  const std::string text = RunConfigCommand(plain);
  ConfigArgs doc;
  doc.doc = true;
  const std::string markdown = RunConfigCommand(doc);
  EXPECT_NE(text, markdown);
  EXPECT_NE(text.find("  model.kind = implicit  (explicit | tied | implicit | energy)"),
            std::string::npos)
      << text;
  EXPECT_NE(markdown.find("| `model.kind` |"), std::string::npos);
  ConfigArgs keys;
  keys.keys = true;
  const std::string key_list = RunConfigCommand(keys);
  EXPECT_NE(key_list.find("\ntrain.optimizer.lr\n"), std::string::npos);
  // --resolved without a file, or two forms at once: bad input.
  ConfigArgs bad;
  bad.resolved = true;
  RunConfigCommand(bad, &code);
  EXPECT_EQ(code, 2);
  bad.resolved = false;
  bad.doc = bad.keys = true;
  RunConfigCommand(bad, &code);
  EXPECT_EQ(code, 2);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace stillpoint::config_cli_test
