// The tasks' one list (training/data/task_list.h), and the lists of the
// layers' families (energy blocks, attention kinds, model kinds, position
// schemes), each made into everything that names its members:
//   - every task of the list is registered, task.kind accepts exactly the
//     registered names (list order first, its first the default), and a
//     misspelt task gets a did-you-mean;
//   - a key shared by tasks appears once and names the tasks that read it;
//     a key of another task set in a config is refused, naming the task's
//     keys;
//   - the memory estimate follows each task's footprint, not its name;
//   - no file outside the list copies the task names by hand: a line naming
//     three tasks, or a file quoting three task names as string literals,
//     fails the test (docs and tests may list them); the same for the other
//     families (their rules are at their tests below).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "layers/energy_block.h"
#include "layers/models.h"
#include "layers/positions.h"
#include "tests/error_text.h"
#include "training/report/compare.h"
#include "training/config_schema.h"
#include "training/data/dataset_registry.h"
#include "training/memory_estimate.h"

#ifndef STILLPOINT_SOURCE_DIR
#error "STILLPOINT_SOURCE_DIR must name the source tree (set by tests/CMakeLists.txt)"
#endif

namespace stillpoint::task_list_test {
namespace {

namespace fs = std::filesystem;

Config Load(const std::string& yaml) { return Config::FromYaml(StillpointSchema(), yaml, "t.yaml"); }

using testing_support::ErrorOf;

TEST(TaskListTest, TaskKindAcceptsTheRegisteredTasksWithTheFirstAsDefault) {
  const ConfigKey* kind = StillpointSchema().Find("task.kind");
  ASSERT_NE(kind, nullptr);
  EXPECT_EQ(kind->choices, TaskNames());
  EXPECT_EQ(kind->default_value, TaskNames().front());
  for (const std::string& name : TaskNames()) {
    EXPECT_TRUE(DatasetRegistry().Has(name)) << name;
    EXPECT_NE(kind->doc.find(name + ": "), std::string::npos) << name << " is not described";
  }
  const std::string error = ErrorOf([] { Load("task: {kind: prefix_parit}\n"); });
  EXPECT_NE(error.find("did you mean 'prefix_parity'"), std::string::npos) << error;
}

TEST(TaskListTest, ASharedKeyAppearsOnceAndNamesTheTasksThatReadIt) {
  int count = 0;
  for (const ConfigKey& key : StillpointSchema().keys()) count += key.path == "task.length";
  EXPECT_EQ(count, 1);
  const ConfigKey* length = StillpointSchema().Find("task.length");
  ASSERT_NE(length, nullptr);
  EXPECT_NE(length->doc.find("reverse"), std::string::npos) << length->doc;
  EXPECT_NE(length->doc.find("csv"), std::string::npos) << length->doc;
  EXPECT_EQ(length->doc.find("digits"), std::string::npos) << length->doc;
  // Different meanings for different tasks are each given.
  const ConfigKey* path = StillpointSchema().Find("task.path");
  ASSERT_NE(path, nullptr);
  EXPECT_NE(path->doc.find("digits: "), std::string::npos) << path->doc;
  EXPECT_NE(path->doc.find("csv: "), std::string::npos) << path->doc;
}

TEST(TaskListTest, AKeyOfAnotherTaskIsRefusedNamingTheTasksKeys) {
  const Config config = Load("task: {kind: reverse, test_fraction: 0.5}\n");
  DatasetRequest request{&config, "", 0, 0};
  const std::string error = ErrorOf([&] { MakeTaskSplit(request); });
  EXPECT_NE(error.find("t.yaml:1:23: task.test_fraction is not read by task.kind reverse (its "
                       "keys: task.length, task.vocab_size, task.train_examples, "
                       "task.test_examples)"),
            std::string::npos)
      << error;
  // At its default it is no error: a resolved config.yaml sets every key.
  const Config resolved = Load("task: {kind: reverse, test_fraction: 0.2, train_examples: 4}\n");
  DatasetRequest again{&resolved, "", 0, 0};
  EXPECT_EQ(MakeTaskSplit(again).train->size(), 4);
}

TEST(TaskListTest, OverridesATaskCannotUseAreRefused) {
  const Config digits = Load("task: {kind: digits}\n");
  DatasetRequest request{&digits, "", 24, 0};
  std::string error = ErrorOf([&] { MakeTaskSplit(request); });
  EXPECT_NE(error.find("t.yaml: task.kind digits: its examples have one length and size"),
            std::string::npos)
      << error;
  const Config reverse = Load("task: {kind: reverse}\n");
  DatasetRequest sized{&reverse, "", 0, 0, 9};
  error = ErrorOf([&] { MakeTaskSplit(sized); });
  EXPECT_NE(error.find("task.kind reverse: has a length, not a size: use --length"),
            std::string::npos)
      << error;
}

TEST(TaskListTest, TheMemoryEstimateFollowsTheTasksFootprint) {
  // digits: 16 tokens of features, no embedding rows, whatever task.length.
  const MemoryEstimate digits = EstimateMemory(Load("task: {kind: digits}\n"), true);
  const MemoryEstimate digits_long =
      EstimateMemory(Load("task: {kind: digits, length: 64}\n"), true);
  EXPECT_EQ(digits.activations, digits_long.activations);
  EXPECT_EQ(digits.parameters, digits_long.parameters);
  const MemoryEstimate reverse =
      EstimateMemory(Load("task: {kind: reverse, length: 16, vocab_size: 16}\n"), true);
  // The same model with 16 embedding rows more (float32).
  const double dim = static_cast<double>(Load("").GetInt("model.dim"));
  EXPECT_EQ(reverse.parameters - digits.parameters, 16 * dim * 4);
  EXPECT_EQ(reverse.activations, digits.activations);  // both 16 tokens
  const MemoryEstimate longer =
      EstimateMemory(Load("task: {kind: reverse, length: 32, vocab_size: 16}\n"), true);
  EXPECT_EQ(longer.activations, 2 * reverse.activations);
}

// ---- the lists of the layers' families (layers/energy_block_list.h,
// SP_MODEL_KINDS in layers/models.h, SP_POSITION_SCHEMES in
// layers/positions.h): what is made from them

TEST(FamilyListsTest, EveryBuiltinEnergyBlockIsRegisteredAndNamedInTheKeysDocs) {
  ASSERT_FALSE(BuiltinEnergyBlockNames().empty());
  const std::vector<std::string> registered = EnergyBlockRegistry().Names();
  for (const std::string& name : BuiltinEnergyBlockNames()) {
    EXPECT_NE(std::find(registered.begin(), registered.end(), name), registered.end()) << name;
    EXPECT_FALSE(EnergyBlockRegistry().Description(name).empty()) << name;
    // Each builds, as the energy kind's block and as a cell's attention.
    const Config config = Load("model: {kind: energy, attention: " + name + "}\n");
    EXPECT_EQ(ModelOptionsFromConfig(config).cell_options.attention, name);
  }
  const std::string list = BuiltinEnergyBlockList();
  EXPECT_NE(StillpointSchema().Find("model.energy.layer")->doc.find(list), std::string::npos);
  EXPECT_NE(StillpointSchema().Find("model.attention")->doc.find(list), std::string::npos);
}

TEST(FamilyListsTest, AttentionKindsAreSoftmaxThenTheEnergyBlocksWithADidYouMean) {
  std::vector<std::string> expected = {"softmax"};
  for (const std::string& name : EnergyBlockRegistry().Names()) expected.push_back(name);
  EXPECT_EQ(AttentionKindNames(), expected);
  const std::string& block = BuiltinEnergyBlockNames().front();
  const std::string misspelt = block.substr(0, block.size() - 1);
  const std::string error = ErrorOf(
      [&] { ModelOptionsFromConfig(Load("model: {attention: " + misspelt + "}\n")); });
  EXPECT_NE(error.find("did you mean '" + block + "'"), std::string::npos) << error;
}

TEST(FamilyListsTest, ModelKindsMakeTheKeyItsDocAndTheComparisonsKinds) {
  std::vector<std::string> names;
  for (ModelKind kind : AllModelKinds()) {
    ModelKind parsed;
    ASSERT_TRUE(StringToModelKind(ToString(kind), &parsed));
    EXPECT_EQ(parsed, kind);
    names.push_back(ToString(kind));
  }
  EXPECT_EQ(ModelKindNames(), names);
  const ConfigKey* kind = StillpointSchema().Find("model.kind");
  ASSERT_NE(kind, nullptr);
  EXPECT_EQ(kind->choices, names);
  for (const std::string& name : names) {
    EXPECT_NE(kind->doc.find(name + ": "), std::string::npos) << name << " is not described";
    // Every kind is a variant of `stillpoint compare` and a kind of its grid.
    EXPECT_EQ(VariantOverrides(name), std::vector<std::string>{"model.kind=" + name});
  }
  EXPECT_EQ(Load("").GetStringList("compare.kinds"), names);
}

TEST(FamilyListsTest, PositionSchemesMakeTheKey) {
  std::vector<std::string> names;
  for (PositionScheme scheme : AllPositionSchemes()) names.push_back(ToString(scheme));
  const ConfigKey* positions = StillpointSchema().Find("model.positions");
  ASSERT_NE(positions, nullptr);
  EXPECT_EQ(positions->choices, names);
}

// ---- no hand-written copies of the lists

bool IsSourceFile(const fs::path& path) {
  static const std::set<std::string> extensions = {".cc", ".h", ".py", ".sh", ".cmake", ".bash",
                                                   ".txt"};
  return extensions.count(path.extension().string()) > 0;
}

// A family's names and what counts as a copy of them outside its list.
struct Family {
  std::vector<std::string> names;
  std::string list;              // the list's file, relative to the source tree
  std::size_t line_names = 0;    // a line naming this many as words
  std::size_t line_quotes = 0;   // a line quoting this many as "name" (0: no rule)
  std::size_t file_quotes = 0;   // a file quoting this many (0: no rule)
  // Files with lists of their own, relative to the source tree.
  std::set<std::string> exempt;
};

// The copies of the family's names in the project's sources (docs and tests
// may list them), as "file:line: text" or "file: quotes ...".
std::vector<std::string> HandCopies(const Family& family, int* files) {
  const fs::path root = STILLPOINT_SOURCE_DIR;
  std::vector<std::string> offenders;
  std::vector<std::pair<std::string, std::regex>> words;
  for (const std::string& name : family.names) words.emplace_back(name, "\\b" + name + "\\b");
  *files = 0;
  for (const char* folder : {"framework", "solvers", "layers", "training", "python", "scripts",
                             "bench", "examples", "cmake"}) {
    if (!fs::exists(root / folder)) continue;
    for (const auto& entry : fs::recursive_directory_iterator(root / folder)) {
      if (!entry.is_regular_file() || !IsSourceFile(entry.path())) continue;
      const std::string relative = fs::relative(entry.path(), root).string();
      if (relative == family.list || family.exempt.count(relative) > 0) continue;
      ++*files;
      std::ifstream in(entry.path());
      std::string line;
      int line_number = 0;
      std::set<std::string> quoted_in_file;
      while (std::getline(in, line)) {
        ++line_number;
        std::set<std::string> named, quoted;
        for (const auto& [name, word] : words) {
          if (line.find(name) == std::string::npos) continue;
          if (std::regex_search(line, word)) named.insert(name);
          if (line.find("\"" + name + "\"") != std::string::npos) quoted.insert(name);
        }
        quoted_in_file.insert(quoted.begin(), quoted.end());
        if (named.size() >= family.line_names ||
            (family.line_quotes > 0 && quoted.size() >= family.line_quotes)) {
          offenders.push_back(relative + ":" + std::to_string(line_number) + ": " + line);
        }
      }
      if (family.file_quotes > 0 && quoted_in_file.size() >= family.file_quotes) {
        offenders.push_back(relative + ": quotes the names " +
                            std::to_string(quoted_in_file.size()) + " times");
      }
    }
  }
  return offenders;
}

void ExpectNoHandCopies(const Family& family, const std::string& make_them_from) {
  int files = 0;
  const std::vector<std::string> offenders = HandCopies(family, &files);
  EXPECT_GT(files, 100);  // the walk found the sources
  std::ostringstream message;
  for (const std::string& offender : offenders) message << "\n  " << offender;
  EXPECT_TRUE(offenders.empty()) << "names copied by hand (make them from " << make_them_from
                                 << "):" << message.str();
}

TEST(TaskListTest, NoFileCopiesTheTaskNamesByHand) {
  ExpectNoHandCopies({TaskNames(), "training/data/task_list.h", 3, 0, 3, {}},
                     "SP_TASKS, training/data/task_list.h");
}

// A line naming every built-in block (or attention, or kind), or quoting
// three of them, is a copy. Lines that say which of the members an option
// concerns name fewer (EnergyBlockOptions::Fields() quotes each block once
// or more in its AppliesWhen, so a file quoting them all is no copy).
TEST(FamilyListsTest, NoFileCopiesTheEnergyBlocksByHand) {
  const std::vector<std::string>& names = BuiltinEnergyBlockNames();
  ExpectNoHandCopies({names, "layers/energy_block_list.h", names.size(), 3, 0, {}},
                     "SP_ENERGY_BLOCKS, layers/energy_block_list.h: BuiltinEnergyBlockNames(), "
                     "BuiltinEnergyBlockList()");
}

TEST(FamilyListsTest, NoFileCopiesTheAttentionKindsByHand) {
  std::vector<std::string> names = {"softmax"};
  for (const std::string& name : BuiltinEnergyBlockNames()) names.push_back(name);
  ExpectNoHandCopies({names, "layers/energy_block_list.h", names.size(), 3, 0, {}},
                     "AttentionKindNames(), layers/energy_block.h");
}

TEST(FamilyListsTest, NoFileCopiesTheModelKindsByHand) {
  // The PyTorch peer of `stillpoint bench` implements three models of its own.
  ExpectNoHandCopies({ModelKindNames(), "layers/models.h", ModelKindNames().size(), 3, 0,
                      {"bench/torch_peer.py"}},
                     "SP_MODEL_KINDS, layers/models.h: AllModelKinds(), ModelKindNames()");
}

TEST(FamilyListsTest, NoFileCopiesThePositionSchemesByHand) {
  std::vector<std::string> names;
  for (PositionScheme scheme : AllPositionSchemes()) names.push_back(ToString(scheme));
  ExpectNoHandCopies({names, "layers/positions.h", 4, 4, 4, {}},
                     "SP_POSITION_SCHEMES, layers/positions.h: AllPositionSchemes()");
}

}  // namespace
}  // namespace stillpoint::task_list_test
