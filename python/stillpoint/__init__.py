"""stillpoint from Python: runs, NumPy arrays, and energy attention for PyTorch.

    import stillpoint
    summary = stillpoint.train("examples/configs/quickstart.yaml",
                               ["model.kind=energy", "train.steps=100"])
    run = stillpoint.load_run(summary["run_dir"])
    run.metrics["loss"]                      # a NumPy array per metrics column
    result = stillpoint.retrieve(patterns, queries, beta=8.0)
    stillpoint.generate(run_dir, "hacker: ", tokens=200)["text"]   # task.kind text runs

    import stillpoint.torch                  # needs PyTorch
    attention = stillpoint.torch.EnergyAttention("probabilistic", dim=64, heads=4)

The guide, with every function's shapes and dtypes, is docs/python.md.
"""
import os as _os

# OpenBLAS (linked by the extension and by Ceres' LAPACK) sizes a buffer per
# core as it loads, and under a small address-space limit (`ulimit -v`) it
# retries that allocation for ever: `import stillpoint` never returned.
# stillpoint calls BLAS from one thread, so the extension loads it with one
# thread unless the environment already chooses; the variables are taken
# back after the load, so programs this process starts do not inherit them.
_BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")
_set_for_load = [name for name in _BLAS_THREAD_VARIABLES if name not in _os.environ]
for _name in _set_for_load:
    _os.environ[_name] = "1"
try:
    from stillpoint._stillpoint import (
        Tensor,
        __version__,
        num_threads,
        retrieve,
        sequence_task,
        set_num_threads,
    )
finally:
    for _name in _set_for_load:
        _os.environ.pop(_name, None)
from stillpoint.runs import Run, compare, evaluate, generate, load_run, train
# The families' names, made from the C++ lists (no copy of them in Python).
from stillpoint._stillpoint import attention_kinds, energy_blocks, model_kinds, position_schemes

__all__ = [
    "Run",
    "Tensor",
    "attention_kinds",
    "compare",
    "energy_blocks",
    "evaluate",
    "generate",
    "load_run",
    "model_kinds",
    "num_threads",
    "position_schemes",
    "retrieve",
    "sequence_task",
    "set_num_threads",
    "train",
]
