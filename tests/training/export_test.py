"""`stillpoint export` read back by NumPy, safetensors parsed by hand (or by
the safetensors package when installed), and `model.init_from` loading
both formats: a run initialised from exported weights and trained for 0
steps holds exactly those weights and evaluates exactly like the original.

Usage: /usr/bin/python3 export_test.py STILLPOINT_BINARY
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

BINARY = sys.argv[1]


def run(*args):
    result = subprocess.run([BINARY, *args], capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"FAIL: stillpoint {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
    return result.stdout


def read_safetensors(path):
    """The safetensors format by hand: u64 header size, JSON header, data."""
    with open(path, "rb") as f:
        blob = f.read()
    (size,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + size])
    base = 8 + size
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = {"F32": "<f4", "F64": "<f8"}[info["dtype"]]
        begin, end = info["data_offsets"]
        tensors[name] = np.frombuffer(blob[base + begin:base + end], dtype=dtype).reshape(
            info["shape"])
    return tensors


def main():
    work = tempfile.mkdtemp()
    os.chdir(work)
    with open("tiny.yaml", "w") as f:
        f.write("seed: 4\nthreads: 1\n"
                "task: {kind: reverse, length: 4, vocab_size: 4, train_examples: 64, "
                "test_examples: 32}\n"
                "model: {kind: implicit, dim: 8, heads: 2, hidden: 8, max_length: 4}\n"
                "train: {steps: 12, batch_size: 8, eval_every: 0, checkpoint_every: 0}\n"
                "log: {progress: none, plots: false}\n")
    run("train", "tiny.yaml", "log.dir=a")
    run("export", "a", "--format", "npz")
    run("export", "a", "--format", "safetensors", "--out", "a.safetensors")
    npz = dict(np.load("a/weights.npz"))
    st = read_safetensors("a.safetensors")
    try:
        import safetensors.numpy  # optional: the reference reader agrees
        st_ref = safetensors.numpy.load_file("a.safetensors")
        assert sorted(st_ref) == sorted(st), "safetensors package reads other names"
    except ImportError:
        pass
    assert sorted(npz) == sorted(st), (sorted(npz), sorted(st))
    for name in npz:
        assert npz[name].dtype == np.float32, (name, npz[name].dtype)
        assert np.array_equal(npz[name], st[name]), name
    summary = json.load(open("a/summary.json"))
    total = sum(a.size for a in npz.values())
    assert total == summary["parameters"], (total, summary["parameters"])
    assert any(np.abs(a).max() > 0 for a in npz.values())

    reference = json.loads(run("eval", "a", "--json"))
    # NumPy-written files (stored and deflated) load as the initial weights.
    np.savez("b.npz", **npz)
    np.savez_compressed("c.npz", **npz)
    for source in ("b.npz", "c.npz", "a.safetensors"):
        out = "from_" + source.replace(".", "_")
        run("train", "tiny.yaml", f"model.init_from={source}", "train.steps=0", f"log.dir={out}")
        run("export", out, "--format", "npz")
        again = dict(np.load(f"{out}/weights.npz"))
        for name in npz:
            assert np.array_equal(again[name], npz[name]), (source, name)
        result = json.loads(run("eval", out, "--json"))
        assert result["accuracy"] == reference["accuracy"], (source, result, reference)
        assert result["loss"] == reference["loss"], (source, result, reference)

    # A weights file missing a parameter is bad input (exit 2), naming it.
    partial = dict(npz)
    missing = sorted(partial)[0]
    del partial[missing]
    np.savez("partial.npz", **partial)
    result = subprocess.run([BINARY, "train", "tiny.yaml", "model.init_from=partial.npz",
                             "log.dir=p"], capture_output=True, text=True)
    assert result.returncode == 2, result
    assert missing in result.stderr and "model.init_from" in result.stderr, result.stderr
    print("ok:", len(npz), "tensors,", total, "parameters")


main()
