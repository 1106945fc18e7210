// Runs from Python: train, compare and evaluate call the CLI's own command
// functions (training/cli/cli_commands.h), so a config means the same thing and
// bad input fails with the same message; the readers behind load_run read a
// run directory's files with the library's readers. The pure-Python layer
// (python/stillpoint/runs.py) turns exit codes into exceptions.
#include <pybind11/stl.h>

#include <functional>
#include <sstream>
#include <streambuf>

#include "python/src/py_bindings.h"
#include "training/checkpoint.h"
#include "training/cli/cli_commands.h"
#include "training/cli/generate_command.h"
#include "training/report/compare.h"
#include "training/config_schema.h"
#include "training/data/dataset.h"
#include "training/data/dataset_registry.h"
#include "training/metrics.h"
#include "training/trainer.h"

namespace stillpoint::python {
namespace {

// A stream buffer that writes whole lines to Python's sys.stderr. Training
// runs with the GIL released, so each write takes it.
class PythonStderrBuffer : public std::streambuf {
 public:
  ~PythonStderrBuffer() override { Flush(); }

 protected:
  int_type overflow(int_type ch) override {
    if (ch == traits_type::eof()) return traits_type::not_eof(ch);
    pending_ += static_cast<char>(ch);
    if (ch == '\n') Flush();
    return ch;
  }
  std::streamsize xsputn(const char* text, std::streamsize count) override {
    pending_.append(text, static_cast<std::size_t>(count));
    if (pending_.find('\n') != std::string::npos) Flush();
    return count;
  }
  int sync() override {
    Flush();
    return 0;
  }

 private:
  void Flush() {
    if (pending_.empty()) return;
    py::gil_scoped_acquire gil;
    try {
      py::object stderr_stream = py::module_::import("sys").attr("stderr");
      if (!stderr_stream.is_none()) {
        stderr_stream.attr("write")(pending_);
        stderr_stream.attr("flush")();
      }
    } catch (py::error_already_set&) {
      // A closed or replaced sys.stderr must not stop the run.
    }
    pending_.clear();
  }
  std::string pending_;
};

py::object ConfigValue(const Config& config, const ConfigKey& key) {
  switch (key.type) {
    case ConfigType::kBool:
      return py::bool_(config.GetBool(key.path));
    case ConfigType::kInt:
      return py::int_(config.GetInt(key.path));
    case ConfigType::kDouble:
      return py::float_(config.GetDouble(key.path));
    case ConfigType::kStringList:
      return py::cast(config.GetStringList(key.path));
    case ConfigType::kDoubleList:
      return py::cast(config.GetDoubleList(key.path));
    case ConfigType::kString:
    case ConfigType::kEnum:
      break;
  }
  return py::str(config.GetString(key.path));
}

// A config file as nested dicts of typed values ({"model": {"dim": 64, ...}}),
// every schema key present.
py::dict ReadConfig(const std::string& path) {
  const Config config = Config::FromFile(StillpointSchema(), path);
  py::dict root;
  for (const ConfigKey& key : StillpointSchema().keys()) {
    py::dict node = root;
    std::string rest = key.path;
    for (std::size_t dot = rest.find('.'); dot != std::string::npos; dot = rest.find('.')) {
      const py::str section(rest.substr(0, dot));
      if (!node.contains(section)) node[section] = py::dict();
      node = node[section].cast<py::dict>();
      rest = rest.substr(dot + 1);
    }
    node[py::str(rest)] = ConfigValue(config, key);
  }
  return root;
}

py::dict ReadMetrics(const std::string& run_dir) {
  std::map<std::string, std::vector<double>> columns;
  {
    py::gil_scoped_release release;
    columns = ReadRunMetrics(run_dir);
  }
  py::dict metrics;
  for (const auto& column : columns) {
    py::array_t<double> values(static_cast<py::ssize_t>(column.second.size()));
    std::copy(column.second.begin(), column.second.end(), values.mutable_data());
    metrics[py::str(column.first)] = values;
  }
  return metrics;
}

py::dict ReadParameters(const std::string& checkpoint_path) {
  CheckpointState state;
  {
    py::gil_scoped_release release;
    state = LoadCheckpoint(checkpoint_path);
  }
  py::dict parameters;
  for (const auto& entry : state.model)
    parameters[py::str(entry.first)] = ArrayFromTensor(entry.second);
  return parameters;
}

py::dict VariantDict(const VariantResult& v) {
  py::dict d;
  d["name"] = v.name;
  d["run_dir"] = v.train.run_dir;
  d["overrides"] = v.overrides;
  d["steps"] = v.train.steps;
  // None when no evaluation ran.
  const bool evaluated = v.train.final_eval.examples > 0;
  d["test_accuracy"] = evaluated ? py::object(py::float_(v.train.final_eval.accuracy)) : py::none();
  d["test_loss"] = evaluated ? py::object(py::float_(v.train.final_eval.loss)) : py::none();
  d["stopped_early"] = v.train.stopped_early;
  d["equilibrium"] = v.train.equilibrium.applies ? py::object(py::str(v.train.equilibrium.verdict))
                                                 : py::none();
  d["train_accuracy"] = v.train.final_train_accuracy;
  d["train_loss"] = v.train.final_train_loss;
  d["seconds_per_step"] = v.train.seconds_per_step;
  d["parameters"] = v.train.num_parameters;
  d["steps_to_target"] = v.steps_to_target;
  d["seconds_to_target"] = v.seconds_to_target;
  d["gradient_cosine_vs_ift"] = v.gradient_cosine_vs_ift;
  d["gradient_relative_error_vs_ift"] = v.gradient_relative_error_vs_ift;
  d["accuracy_vs_depth"] = v.accuracy_vs_depth;
  d["accuracy_vs_length"] = v.accuracy_vs_length;
  return d;
}

// Runs a command without the GIL, its progress output (`out`) written to
// sys.stderr as it comes.
int RunWithProgressToStderr(const std::function<int(std::ostream& out)>& command) {
  py::gil_scoped_release release;
  PythonStderrBuffer buffer;
  std::ostream out(&buffer);
  return command(out);
}

// stillpoint.train: `stillpoint train` in-process; progress to sys.stderr.
py::tuple TrainRun(const std::string& config_path,
                   const std::vector<std::string>& overrides,
                   bool resume,
                   bool force,
                   bool overwrite,
                   int64_t stop_after_steps) {
  TrainArgs args;
  args.config_path = config_path;
  args.overrides = overrides;
  args.resume = resume;
  args.force = force;
  args.overwrite = overwrite;
  args.stop_after_steps = stop_after_steps;
  std::ostringstream err;
  TrainSummary summary;
  const int code = RunWithProgressToStderr(
      [&](std::ostream& out) { return RunTrain(args, out, err, &summary); });
  return py::make_tuple(code, err.str(), summary.run_dir);
}

// stillpoint.compare: `stillpoint compare` in-process, and its report as a dict.
py::tuple CompareRuns(const std::string& config_path,
                      const std::vector<std::string>& overrides,
                      bool overwrite) {
  CompareArgs args;
  args.config_path = config_path;
  args.overrides = overrides;
  args.overwrite = overwrite;
  std::ostringstream err;
  CompareReport report;
  const int code = RunWithProgressToStderr(
      [&](std::ostream& out) { return RunCompare(args, out, err, &report); });
  py::dict result;
  result["report"] = report.markdown_path;
  result["html"] = report.html_path;
  result["table"] = report.table;
  result["grid"] = report.grid;
  py::list variants;
  for (const VariantResult& v : report.variants) variants.append(VariantDict(v));
  result["variants"] = variants;
  return py::make_tuple(code, err.str(), result);
}

// stillpoint.evaluate: `stillpoint eval --json` in-process.
py::tuple EvaluateRun(const std::string& run,
                      const std::vector<std::string>& overrides,
                      int64_t iterations,
                      int64_t length,
                      bool gradient_check) {
  EvalArgs args;
  args.run = run;
  args.overrides = overrides;
  args.iterations = iterations;
  args.length = length;
  args.gradient_check = gradient_check;
  args.json = true;
  std::ostringstream out, err;
  int code;
  {
    py::gil_scoped_release release;
    code = RunEval(args, out, err);
  }
  return py::make_tuple(code, err.str(), out.str());
}

// stillpoint.generate: `stillpoint generate --json` in-process.
py::tuple GenerateText(const std::string& run,
                       const std::string& prompt,
                       int64_t tokens,
                       double temperature,
                       int64_t top_k,
                       int64_t seed,
                       bool warm_start,
                       bool incremental,
                       int64_t keep) {
  GenerateArgs args;
  args.run = run;
  args.prompt = prompt;
  args.tokens = tokens;
  args.temperature = temperature;
  args.top_k = top_k;
  args.seed = seed;
  args.no_warm_start = !warm_start;
  args.full_window = !incremental;
  args.keep = keep;
  args.json = true;
  std::ostringstream out, err;
  int code;
  {
    py::gil_scoped_release release;
    code = RunGenerate(args, out, err);
  }
  return py::make_tuple(code, err.str(), out.str());
}

// stillpoint.sequence_task: a synthetic task of the trainer as arrays.
py::tuple SequenceTask(
    const std::string& kind, int64_t length, int64_t vocab_size, int64_t examples, uint64_t seed) {
  // The synthetic tasks of the trainer's list (training/data/task_list.h).
  std::string known;
  for (const std::string& name : TaskNames()) {
    if (DatasetRegistry().Get(name).generate) known += (known.empty() ? "" : ", ") + name;
  }
  if (!DatasetRegistry().Has(kind) || !DatasetRegistry().Get(kind).generate) {
    throw py::value_error("kind: unknown sequence task '" + kind + "' (known: " + known + ")");
  }
  if (examples < 1) throw py::value_error("sequence_task: examples must be >= 1");
  std::unique_ptr<InMemoryDataset> data;
  try {
    const Config config =
        Config::FromYaml(StillpointSchema(), "", "sequence_task",
                         {"task.kind=" + kind, "task.length=" + std::to_string(length),
                          "task.vocab_size=" + std::to_string(vocab_size)});
    data = GenerateTaskExamples(config, examples, seed);
  } catch (const ConfigError& error) {
    throw py::value_error(std::string("sequence_task: ") + error.what());
  }
  py::array_t<int64_t> tokens({examples, length}), targets({examples, length});
  int64_t* x = tokens.mutable_data();
  int64_t* y = targets.mutable_data();
  for (int64_t i = 0; i < examples; ++i) {
    const Example& example = data->Get(i);
    std::copy(example.tokens.begin(), example.tokens.end(), x + i * length);
    std::copy(example.targets.begin(), example.targets.end(), y + i * length);
  }
  return py::make_tuple(tokens, targets);
}

}  // namespace

void RegisterRuns(py::module_& m) {
  // Each returns (exit code as the CLI's, what the CLI writes to stderr,
  // result); progress goes to sys.stderr as it happens.
  m.def("_train", &TrainRun, py::arg("config"), py::arg("overrides"), py::arg("resume"),
        py::arg("force"), py::arg("overwrite"), py::arg("stop_after_steps"));

  m.def("_compare", &CompareRuns, py::arg("config"), py::arg("overrides"), py::arg("overwrite"));

  m.def("_evaluate", &EvaluateRun, py::arg("run"), py::arg("overrides"), py::arg("iterations"),
        py::arg("length"), py::arg("gradient_check"));

  m.def("_generate", &GenerateText, py::arg("run"), py::arg("prompt"), py::arg("tokens"),
        py::arg("temperature"), py::arg("top_k"), py::arg("seed"), py::arg("warm_start"),
        py::arg("incremental"), py::arg("keep"));

  m.def("_read_config", &ReadConfig, py::arg("path"));
  m.def("_read_metrics", &ReadMetrics, py::arg("run_dir"));
  m.def("_read_parameters", &ReadParameters, py::arg("checkpoint_path"));

  m.def("sequence_task", &SequenceTask, py::arg("kind"), py::arg("length") = 16,
        py::arg("vocab_size") = 16, py::arg("examples") = 4096, py::arg("seed") = 0, R"doc(
A synthetic sequence task of the trainer (task.kind), as the trainer
generates it: (tokens, targets), int64 arrays of shape [examples, length].
Targets the task ignores are -1. A config's training set uses seed
2 * seed + 1 and its held-out set 2 * seed + 2.)doc");
}

}  // namespace stillpoint::python
