"""Shared fixtures of the Python tests (run by ctest: python/CMakeLists.txt sets
PYTHONPATH to the build tree's package and STILLPOINT_SOURCE_DIR)."""
import os
import pathlib

import pytest

SOURCE_DIR = pathlib.Path(os.environ.get("STILLPOINT_SOURCE_DIR",
                                         pathlib.Path(__file__).resolve().parents[2]))

# A run of well under a second: 6 steps of a tiny tied model on the reverse task.
TINY_CONFIG = """\
seed: 1
threads: 1
task: {kind: reverse, length: 4, vocab_size: 4, train_examples: 32, test_examples: 16}
model: {kind: tied, dim: 8, heads: 2, hidden: 8, max_length: 8, unroll_steps: 2}
train: {steps: 6, batch_size: 4, eval_every: 3, checkpoint_every: 3, log_every: 1}
log: {progress: lines, plots: false}
"""


@pytest.fixture
def tiny_config(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_CONFIG)
    return path


@pytest.fixture
def source_dir():
    return SOURCE_DIR
