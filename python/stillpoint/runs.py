"""Runs from Python: train, compare and evaluate, as the stillpoint program does them.

Each calls the program's own command (training/cli/cli_commands.h) in this
process: the same config checks, run directories, checkpoints and files.
Progress goes to sys.stderr. A bad config or argument raises ValueError with
the program's message (file:line:col for a config error); a failure while
running raises RuntimeError; Ctrl-C stops after the step in flight, writes a
checkpoint and the summary as the program does, then raises
KeyboardInterrupt (SIGTERM the same, then SystemExit(143)).
"""
import json
import os
import sys

from stillpoint import _stillpoint as _core

_BAD_INPUT = 2
_SIGINT_EXIT = 130
_SIGTERM_EXIT = 143


def _path(value, argument):
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{argument}: expected a path (str or os.PathLike), "
                        f"got {type(value).__name__}")
    return os.fspath(value)


def _overrides(overrides):
    if not isinstance(overrides, (list, tuple)) or not all(isinstance(o, str) for o in overrides):
        raise TypeError("overrides: expected a list of 'key.path=value' strings, "
                        f"got {overrides!r}")
    return list(overrides)


def _yaml_quoted(text):
    return "'" + text.replace("'", "''") + "'"


def _with_log_dir(overrides, log_dir):
    if log_dir is None:
        return overrides
    return overrides + ["log.dir=" + _yaml_quoted(_path(log_dir, "log_dir"))]


def _raise_for_exit(code, err):
    """Turns the program's exit code and error text into Python's outcome."""
    message = "\n".join(line[len("error: "):] if line.startswith("error: ") else line
                        for line in err.strip().splitlines())
    if code == 0:
        if err:
            sys.stderr.write(err)
        return
    if code == _BAD_INPUT:
        raise ValueError(message)
    if code == _SIGINT_EXIT:
        sys.stderr.write(err)
        raise KeyboardInterrupt(message)
    if code == _SIGTERM_EXIT:
        sys.stderr.write(err)
        raise SystemExit(code)
    raise RuntimeError(message)


def _read_json(path):
    with open(path, encoding="utf-8") as file:
        return json.load(file)


def train(config, overrides=(), log_dir=None, *, resume=False, overwrite=False, force=False,
          stop_after_steps=0):
    """Trains the model a YAML config describes, as `stillpoint train`.

    config: the YAML file; overrides: "key.path=value" strings, as on the
    command line; log_dir: the run directory (default: the config's log.dir,
    else the first free runs/<config name>[-N]); resume / overwrite / force
    / stop_after_steps: as --resume, --overwrite, --force, --stop-after.

    Returns the run's summary (RUN_DIR/summary.json) as a dict, with
    "run_dir" added.
    """
    args = (_path(config, "config"), _with_log_dir(_overrides(overrides), log_dir),
            bool(resume), bool(force), bool(overwrite), int(stop_after_steps))
    code, err, run_dir = _core._train(*args)
    _raise_for_exit(code, err)
    summary = _read_json(os.path.join(run_dir, "summary.json"))
    summary["run_dir"] = run_dir
    return summary


def compare(config, overrides=(), log_dir=None, *, overwrite=False):
    """Trains every variant of a config and writes the report, as `stillpoint compare`.

    Returns a dict: "report" and "html" (the report's paths), "table" and
    "grid" (the tables as printed), and "variants", one dict per variant
    (name, run_dir, test_accuracy, test_loss, seconds_per_step,
    steps_to_target, gradient_cosine_vs_ift, ...).
    """
    code, err, report = _core._compare(_path(config, "config"),
                                       _with_log_dir(_overrides(overrides), log_dir),
                                       bool(overwrite))
    _raise_for_exit(code, err)
    return report


def _positive_or_none(value, argument):
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{argument}: expected a positive int or None, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{argument}: expected a positive int or None, got {value}")
    return value


def evaluate(run_dir, iters=None, length=None, *, overrides=(), gradient_check=False):
    """Evaluates a trained run on its held-out set, as `stillpoint eval --json`.

    run_dir: a run directory (or a checkpoint file); iters: the test-time
    solver iterations (or unroll depth) instead of the trained setting;
    length: regenerate the held-out set at this sequence length.

    Returns a dict: loss, accuracy, examples, length, forward_iterations_mean,
    forward_iterations_max, forward_residual_max, unconverged_samples (None
    for an explicit or tied model, which has no forward solve) (and
    gradient_check with gradient_check=True).
    """
    code, err, out = _core._evaluate(_path(run_dir, "run_dir"), _overrides(overrides),
                                     _positive_or_none(iters, "iters"),
                                     _positive_or_none(length, "length"), bool(gradient_check))
    _raise_for_exit(code, err)
    return json.loads(out)


def generate(run_dir, prompt, tokens=200, *, temperature=1.0, top_k=0, seed=0,
             warm_start=True, incremental=True, keep=0):
    """Continues prompt with a trained character-level model (task.kind text),
    as `stillpoint generate RUN --prompt TEXT --tokens N --json`.

    temperature (> 0) divides the logits; top_k > 0 samples among the k most
    likely characters; warm_start=False starts an implicit model's every
    solve from zero instead of the previous position's fixed point.
    incremental=False reads the whole window again for every character (the
    reference path) instead of each character once; keep (incremental) is
    how many characters a new window starts from when the window is full (0:
    half of it; task.context - 1: the reference path's windows).

    Returns a dict: prompt, text (the continuation), tokens, prompt_unknown
    (prompt characters outside the vocabulary, read as unknown),
    prompt_dropped (prompt characters before the model's context window),
    iterations_per_token (implicit models; None otherwise), mode
    ("incremental" or "full_window"), full_window_reason (why not
    incremental, "" when it is), positions (positions the model computed),
    restarts (windows restarted from the last keep characters), seconds. Bad
    input (tokens < 1, an empty prompt, a run that is not a text task)
    raises ValueError.
    """
    code, err, out = _core._generate(_path(run_dir, "run_dir"), str(prompt), int(tokens),
                                     float(temperature), int(top_k), int(seed), bool(warm_start),
                                     bool(incremental), int(keep))
    _raise_for_exit(code, err)
    return json.loads(out)


class Run:
    """A run directory read back: .config, .summary, .metrics, .parameters().

    config: the resolved config (RUN_DIR/config.yaml) as nested dicts of
    typed values; summary: RUN_DIR/summary.json as a dict (None when the run
    has not written it yet); metrics: one float64 NumPy array per metrics
    column (NaN where a row has no value), {} before the first logged step.
    """

    def __init__(self, run_dir):
        self.run_dir = _path(run_dir, "run_dir")
        if not os.path.isdir(self.run_dir):
            raise FileNotFoundError(f"run_dir: '{self.run_dir}' is not a directory")
        config_path = os.path.join(self.run_dir, "config.yaml")
        if not os.path.isfile(config_path):
            raise FileNotFoundError(f"run_dir: '{self.run_dir}' holds no config.yaml "
                                    "(not a stillpoint run directory)")
        self.config = _core._read_config(config_path)
        summary_path = os.path.join(self.run_dir, "summary.json")
        self.summary = _read_json(summary_path) if os.path.isfile(summary_path) else None
        has_metrics = any(os.path.isfile(os.path.join(self.run_dir, name))
                          for name in ("metrics.csv", "metrics.jsonl"))
        self.metrics = _core._read_metrics(self.run_dir) if has_metrics else {}

    def metrics_frame(self):
        """The metrics as a pandas DataFrame (needs pandas)."""
        try:
            import pandas
        except ImportError as error:
            raise ImportError("Run.metrics_frame needs pandas (apt-get install python3-pandas, "
                              "or pip install pandas); Run.metrics holds the same columns as "
                              "NumPy arrays") from error
        return pandas.DataFrame(self.metrics)

    def parameters(self):
        """The model's parameters in RUN_DIR/checkpoint.ckpt: dotted name -> ndarray."""
        path = os.path.join(self.run_dir, "checkpoint.ckpt")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"run_dir: '{self.run_dir}' holds no checkpoint.ckpt")
        return _core._read_parameters(path)

    def __repr__(self):
        steps = self.summary.get("steps") if self.summary else None
        return f"Run({self.run_dir!r}, steps={steps})"


def load_run(run_dir):
    """Reads a run directory written by train (or a comparison's variant)."""
    return Run(run_dir)
