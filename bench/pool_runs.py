#!/usr/bin/env python3
"""Pools the repetitions of several bench/compare.sh runs.

    /usr/bin/python3 bench/pool_runs.py [--peer tuned|user] DIR [DIR ...]

Each DIR is the --out directory of one compare.sh run (its results.jsonl).
Within a run, compare.sh pairs every stillpoint measurement with the peer's
measurement of the same repetition and reports the median of those
per-repetition ratios (peer / stillpoint). On a shared machine that median
moves a lot from run to run, so this script puts the per-repetition ratios of
all the given runs together and prints, per workload: the number of runs and
repetitions, the median of all the ratios with their quartiles and range, and
in how many runs the run's own median met the target of bench/RESULTS.md.
The W2 scaling ratios (stillpoint's 1-thread step over its multi-thread step)
are pooled the same way, both as compare.sh measures them: adjacent processes
(keys w2i-t1 / w2i-tN, per repetition) and steps alternating in one process
(key w2i-rounds: that process's median over its rounds).

Exit status: 0, or 2 with a message naming the file and line when a
directory has no results.jsonl or a line of it is not a compare.sh record.
"""
import argparse
import collections
import json
import os
import statistics
import sys

# Workload keys of compare.sh, their names and the step-time targets of the
# bench/RESULTS.md tables (peer / stillpoint at least this).
WORKLOADS = [
    ("w1i", "W1 implicit step", 3.0),
    ("w1ir", "W1 implicit step (peer: stillpoint's work only)", 3.0),
    ("w1e", "W1 explicit step", 3.0),
    ("w1er", "W1 explicit step (peer: stillpoint's work only)", 3.0),
    ("w2i", "W2 implicit step", 3.0),
    ("w2ir", "W2 implicit step (peer: stillpoint's work only)", 3.0),
    ("w2e", "W2 explicit step", 2.5),
    ("w2er", "W2 explicit step (peer: stillpoint's work only)", 2.5),
    ("w3", "W3 retrieval (peer: whole batch)", 1.2),
    ("w3a", "W3 retrieval (peer: per-query exit)", 1.2),
    ("w4", "W4 energy-attention step", 3.0),
]
# W2 scaling: (model key, name, target) for 1 thread / multi-thread steps.
SCALING = [
    ("w2i", "W2 implicit", 1.7),
    ("w2e", "W2 explicit", 1.7),
]


class InputError(Exception):
    pass


def read_run(directory):
    """{(key, rep): {config: result}} of one run (result: the record's "result")."""
    path = os.path.join(directory, "results.jsonl")
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such file (is {directory} a compare.sh --out directory?)")
    cells = collections.defaultdict(dict)
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            where = f"{path} line {number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise InputError(f"{where}: not JSON ({error.msg})") from None
            try:
                key, rep, config = record["key"], record["rep"], record["config"]
                result = record["result"]
                fields = ["median_ms"] + (["scaling_median"] if key.endswith("-rounds") else [])
                for field in fields:
                    value = float(result[field])
                    if not value > 0:
                        raise InputError(f"{where}: {field} must be positive, got {value}")
            except (KeyError, TypeError, ValueError) as error:
                raise InputError(f"{where}: not a compare.sh record (missing or bad {error})") from None
            cells[(key, rep)][config] = result
    return cells


def ratios_of_run(cells, key, peer):
    """Per-repetition ratios peer / stillpoint of one workload in one run."""
    return [c[peer]["median_ms"] / c["stillpoint"]["median_ms"]
            for (k, _), c in sorted(cells.items(), key=lambda item: str(item[0]))
            if k == key and "stillpoint" in c and peer in c]


def adjacent_scaling_of_run(cells, model):
    """Per repetition, stillpoint's 1-thread median over the multi-thread one."""
    ratios = []
    for (key, rep), c in sorted(cells.items(), key=lambda item: str(item[0])):
        other = cells.get((model + "-tN", rep), {})
        if key == model + "-t1" and "stillpoint" in c and "stillpoint" in other:
            ratios.append(c["stillpoint"]["median_ms"] / other["stillpoint"]["median_ms"])
    return ratios


def rounds_scaling_of_run(cells, model):
    """Per repetition, the median ratio of the alternating rounds of one process."""
    return [float(c["stillpoint"]["scaling_median"])
            for (key, _), c in sorted(cells.items(), key=lambda item: str(item[0]))
            if key == model + "-rounds" and "stillpoint" in c]


def print_row(name, target, per_run):
    """A table row: pooled ratios of the runs that have any, or nothing."""
    per_run = [r for r in per_run if r]
    if not per_run:
        return
    pooled = sorted(r for run in per_run for r in run)
    if len(pooled) >= 2:
        q1, _, q3 = statistics.quantiles(pooled, n=4, method="inclusive")
    else:
        q1 = q3 = pooled[0]
    met = sum(1 for run in per_run if statistics.median(run) >= target)
    print(f"| {name} | >= {target:g}x | {len(per_run)} | {len(pooled)} | "
          f"{statistics.median(pooled):.2f}x | {q1:.2f}-{q3:.2f} | "
          f"{pooled[0]:.2f}-{pooled[-1]:.2f} | {met} of {len(per_run)} |")


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", choices=["tuned", "user"], default="tuned",
                        help="peer configuration to compare against (default: tuned)")
    parser.add_argument("dirs", nargs="+", metavar="DIR", help="compare.sh --out directories")
    args = parser.parse_args(argv)
    peer = "torch-" + args.peer
    try:
        runs = [(os.path.basename(os.path.normpath(d)), read_run(d)) for d in args.dirs]
    except InputError as error:
        print(f"pool_runs.py: {error}", file=sys.stderr)
        return 2

    print(f"{len(runs)} runs ({', '.join(name for name, _ in runs)}), peer {peer}")
    print("| workload | target | runs | repetitions | pooled median ratio | quartiles | "
          "min-max | runs whose median met the target |")
    print("|---|---|---|---|---|---|---|---|")
    for key, name, target in WORKLOADS:
        print_row(name, target, [ratios_of_run(cells, key, peer) for _, cells in runs])
    for model, name, target in SCALING:
        print_row(f"{name}, 2 threads vs 1 (adjacent processes)", target,
                  [adjacent_scaling_of_run(cells, model) for _, cells in runs])
        print_row(f"{name}, 2 threads vs 1 (alternating steps in one process)", target,
                  [rounds_scaling_of_run(cells, model) for _, cells in runs])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
