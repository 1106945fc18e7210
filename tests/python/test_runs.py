"""train / evaluate / compare / load_run: the CLI's commands, called in-process."""
import importlib.util
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import stillpoint

BUILD_DIR = pathlib.Path(stillpoint.__file__).resolve().parents[2]
CLI = BUILD_DIR / "bin" / "stillpoint"


def test_train_returns_the_summary_and_load_run_reads_the_run(tiny_config, tmp_path, capsys):
    run_dir = tmp_path / "run"
    summary = stillpoint.train(tiny_config, ["train.optimizer.lr=0.003"], log_dir=run_dir)
    assert summary["run_dir"] == str(run_dir)
    assert summary["steps"] == 6
    assert summary["test_examples"] == 16
    err = capsys.readouterr().err
    assert "training " in err and "step 6/6" in err   # progress went to sys.stderr

    run = stillpoint.load_run(run_dir)
    assert run.config["model"]["dim"] == 8                   # typed, nested
    assert run.config["train"]["optimizer"]["lr"] == 0.003   # the override
    assert run.config["log"]["dir"] == str(run_dir)
    assert run.summary["steps"] == 6
    assert run.summary["test_accuracy"] == summary["test_accuracy"]
    steps = run.metrics["step"]
    assert steps.dtype == np.float64
    assert sorted(set(steps.tolist())) == [1, 2, 3, 4, 5, 6]
    assert all(len(column) == len(steps) for column in run.metrics.values())
    parameters = run.parameters()
    assert sum(array.size for array in parameters.values()) == summary["parameters"]
    assert all(array.dtype == np.float32 for array in parameters.values())


def test_evaluate_matches_the_runs_final_evaluation(tiny_config, tmp_path):
    summary = stillpoint.train(tiny_config, log_dir=tmp_path / "run")
    result = stillpoint.evaluate(tmp_path / "run")
    assert result["accuracy"] == summary["test_accuracy"]
    assert result["loss"] == pytest.approx(summary["test_loss"], rel=1e-12)
    assert result["examples"] == 16 and result["length"] == 4
    longer = stillpoint.evaluate(tmp_path / "run", iters=1, length=6)
    assert longer["length"] == 6 and longer["examples"] == 16
    with pytest.raises(ValueError, match="iters: expected a positive int or None, got 0"):
        stillpoint.evaluate(tmp_path / "run", iters=0)
    with pytest.raises(ValueError, match="missing"):
        stillpoint.evaluate(tmp_path / "missing")


def cli_error(args):
    """The CLI's stderr without its 'error: ' prefix, and its exit code."""
    process = subprocess.run([str(CLI)] + args, capture_output=True, text=True)
    return process.returncode, process.stderr.strip().removeprefix("error: ")


@pytest.mark.skipif(not CLI.exists(), reason=f"the stillpoint program is not built ({CLI})")
def test_a_config_error_is_a_value_error_with_the_clis_message(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("seed: 1\nmodel:\n  dim: 8\n  hedas: 2\n")
    with pytest.raises(ValueError) as error:
        stillpoint.train(config, log_dir=tmp_path / "run")
    message = str(error.value)
    assert f"{config}:4:3" in message and "hedas" in message and "heads" in message
    code, cli_message = cli_error(["train", str(config), f"log.dir={tmp_path / 'run'}"])
    assert code == 2
    assert message == cli_message

    with pytest.raises(ValueError) as error:
        stillpoint.train(str(config).replace("bad", "absent"))
    assert "absent.yaml" in str(error.value)
    with pytest.raises(TypeError, match="overrides: expected a list"):
        stillpoint.train(config, "seed=2")
    with pytest.raises(TypeError, match="config: expected a path"):
        stillpoint.train(3)


def test_an_existing_run_is_kept_unless_overwrite(tiny_config, tmp_path):
    stillpoint.train(tiny_config, log_dir=tmp_path / "run")
    with pytest.raises(ValueError, match="--overwrite"):
        stillpoint.train(tiny_config, log_dir=tmp_path / "run")
    again = stillpoint.train(tiny_config, ["train.steps=4"], log_dir=tmp_path / "run",
                             overwrite=True)
    assert again["steps"] == 4


def test_compare_trains_every_variant_and_writes_the_report(tiny_config, tmp_path):
    report = stillpoint.compare(tiny_config, ["compare.variants=[explicit, tied]",
                                              "eval.iterations_sweep=[]"],
                                log_dir=tmp_path / "cmp")
    assert [v["name"] for v in report["variants"]] == ["explicit", "tied"]
    assert os.path.isfile(report["report"]) and os.path.isfile(report["html"])
    for variant in report["variants"]:
        run = stillpoint.load_run(variant["run_dir"])
        assert run.summary["test_accuracy"] == variant["test_accuracy"]
    assert "explicit" in report["table"] and "tied" in report["table"]


def test_metrics_frame_needs_pandas(tiny_config, tmp_path):
    stillpoint.train(tiny_config, log_dir=tmp_path / "run")
    run = stillpoint.load_run(tmp_path / "run")
    if importlib.util.find_spec("pandas") is None:
        with pytest.raises(ImportError, match="needs pandas"):
            run.metrics_frame()
    else:
        frame = run.metrics_frame()
        assert list(frame["step"]) == list(run.metrics["step"])


def test_load_run_of_a_missing_or_foreign_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        stillpoint.load_run(tmp_path / "nothing")
    with pytest.raises(FileNotFoundError, match="holds no config.yaml"):
        stillpoint.load_run(tmp_path)


# The child trains a run that would last for hours; SIGINT must stop it after
# the step in flight, with a checkpoint of the step reached, then raise
# KeyboardInterrupt in Python.
CHILD = """
import sys, stillpoint
try:
    stillpoint.train(sys.argv[1], log_dir=sys.argv[2])
except KeyboardInterrupt as stop:
    print("KeyboardInterrupt:", stop, flush=True)
    sys.exit(7)
print("no interrupt", flush=True)
"""


def test_ctrl_c_stops_cleanly_and_raises_keyboard_interrupt(tmp_path):
    config = tmp_path / "long.yaml"
    config.write_text(
        "seed: 1\nthreads: 1\n"
        "task: {kind: reverse, length: 8, vocab_size: 8, train_examples: 512, test_examples: 64}\n"
        "model: {kind: implicit, dim: 32, heads: 2, hidden: 64, max_length: 8}\n"
        "train: {steps: 100000, batch_size: 64, eval_every: 0, log_every: 1, "
        "checkpoint_every: 1000}\n"
        "log: {progress: none, plots: false}\n")
    run_dir = tmp_path / "run"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(config), str(run_dir)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = run_dir / "metrics.csv"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.01)
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 7, (out, err)
    assert "KeyboardInterrupt: stopped by SIGINT at step" in out
    assert "Resume with:" in err
    run = stillpoint.load_run(run_dir)
    rows = len(metrics.read_text().splitlines()) - 1
    assert run.summary["steps"] == rows >= 2
    state = json.loads((run_dir / "summary.json").read_text())
    assert state["steps"] == rows
    assert len(run.parameters()) > 0
