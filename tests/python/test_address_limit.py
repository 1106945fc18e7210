"""`import stillpoint` under a small address-space limit (issue 48, item 11's
sibling): the OpenBLAS the extension loads sized a buffer per core and
retried its allocation for ever under `ulimit -v 300000`."""
import os
import resource
import subprocess
import sys

LIMIT_BYTES = 300000 << 10  # ulimit -v 300000 (KiB)


def _limit_address_space():
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_BYTES, LIMIT_BYTES))


def test_import_returns_under_an_address_space_limit():
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    script = ("import os, stillpoint\n"
              "print(stillpoint.__version__)\n"
              # The one-thread setting was for the load only.
              "print(os.environ.get('OPENBLAS_NUM_THREADS'), os.environ.get('OMP_NUM_THREADS'))\n"
              "print(float(stillpoint.Tensor.zeros([2, 3]).numpy().sum()))\n")
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                            text=True, timeout=120, preexec_fn=_limit_address_space)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1] == "None None"
    assert lines[2] == "0.0"


def test_a_choice_in_the_environment_is_kept():
    env = dict(os.environ, OPENBLAS_NUM_THREADS="2")
    env.pop("OMP_NUM_THREADS", None)
    script = ("import os, stillpoint\n"
              "print(os.environ.get('OPENBLAS_NUM_THREADS'), os.environ.get('OMP_NUM_THREADS'))\n")
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "2 None"
