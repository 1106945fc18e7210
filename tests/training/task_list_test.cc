// The tasks' one list (training/data/task_list.h):
//   - every task of the list is registered, task.kind accepts exactly the
//     registered names (list order first, its first the default), and a
//     misspelt task gets a did-you-mean;
//   - a key shared by tasks appears once and names the tasks that read it;
//     a key of another task set in a config is refused, naming the task's
//     keys;
//   - the memory estimate follows each task's footprint, not its name;
//   - no file outside the list copies the task names by hand: a line naming
//     three tasks, or a file quoting three task names as string literals,
//     fails the test (docs and tests may list them).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/error_text.h"
#include "training/config_schema.h"
#include "training/dataset_registry.h"
#include "training/memory_estimate.h"

#ifndef STILLPOINT_SOURCE_DIR
#error "STILLPOINT_SOURCE_DIR must name the source tree (set by tests/CMakeLists.txt)"
#endif

namespace stillpoint {
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

// ---- no hand-written copies of the list

bool IsSourceFile(const fs::path& path) {
  static const std::set<std::string> extensions = {".cc", ".h", ".py", ".sh", ".cmake", ".bash",
                                                   ".txt"};
  return extensions.count(path.extension().string()) > 0;
}

TEST(TaskListTest, NoFileCopiesTheTaskNamesByHand) {
  const fs::path root = STILLPOINT_SOURCE_DIR;
  const fs::path list = root / "training" / "data" / "task_list.h";
  std::vector<std::string> offenders;
  std::vector<std::pair<std::string, std::regex>> words;
  for (const std::string& name : TaskNames()) words.emplace_back(name, "\\b" + name + "\\b");
  int files = 0;
  for (const char* folder : {"framework", "solvers", "layers", "training", "python", "scripts",
                             "bench", "examples", "cmake"}) {
    if (!fs::exists(root / folder)) continue;
    for (const auto& entry : fs::recursive_directory_iterator(root / folder)) {
      if (!entry.is_regular_file() || !IsSourceFile(entry.path())) continue;
      if (fs::equivalent(entry.path(), list)) continue;
      ++files;
      std::ifstream in(entry.path());
      std::string line;
      int line_number = 0;
      std::set<std::string> quoted;
      while (std::getline(in, line)) {
        ++line_number;
        std::set<std::string> named;
        for (const auto& [name, word] : words) {
          if (line.find(name) == std::string::npos) continue;
          if (std::regex_search(line, word)) named.insert(name);
          if (line.find("\"" + name + "\"") != std::string::npos) quoted.insert(name);
        }
        if (named.size() >= 3) {
          offenders.push_back(fs::relative(entry.path(), root).string() + ":" +
                              std::to_string(line_number) + ": " + line);
        }
      }
      if (quoted.size() >= 3) {
        offenders.push_back(fs::relative(entry.path(), root).string() +
                            ": quotes the task names " + std::to_string(quoted.size()) + " times");
      }
    }
  }
  EXPECT_GT(files, 100);  // the walk found the sources
  std::ostringstream message;
  for (const std::string& offender : offenders) message << "\n  " << offender;
  EXPECT_TRUE(offenders.empty())
      << "task names copied by hand (make them from SP_TASKS, training/data/task_list.h):"
      << message.str();
}

}  // namespace
}  // namespace stillpoint
