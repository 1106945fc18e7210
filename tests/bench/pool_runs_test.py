#!/usr/bin/env python3
"""Tests of bench/pool_runs.py on compare.sh records written here.

    python3 tests/bench/pool_runs_test.py PATH/TO/bench/pool_runs.py
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = None


def record(key, config, rep, median_ms):
    return {"key": key, "config": config, "rep": rep, "load1": "1.0",
            "result": {"median_ms": median_ms}}


def write_run(root, name, records, raw_lines=()):
    directory = os.path.join(root, name)
    os.makedirs(directory)
    with open(os.path.join(directory, "results.jsonl"), "w", encoding="utf-8") as out:
        for r in records:
            out.write(json.dumps(r) + "\n")
        for line in raw_lines:
            out.write(line + "\n")
    return directory


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


def row(output, name):
    lines = [line for line in output.splitlines() if line.startswith(f"| {name} |")]
    return [cell.strip() for cell in lines[0].strip("|").split("|")] if lines else None


class PoolRunsTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = self.tmp.name
        # Run A: W2 explicit ratios 2.0, 2.5, 3.0 (median 2.5, meets 2.5x);
        # run B: 2.1, 2.3, 2.75 (median 2.3, misses). A peer-only repetition
        # in A and a stillpoint-only one in B have no pair and must not count.
        self.a = write_run(self.root, "A", [
            record("w2e", "stillpoint", 1, 50.0), record("w2e", "torch-tuned", 1, 100.0),
            record("w2e", "stillpoint", 2, 50.0), record("w2e", "torch-tuned", 2, 125.0),
            record("w2e", "stillpoint", 3, 50.0), record("w2e", "torch-tuned", 3, 150.0),
            record("w2e", "torch-user", 1, 200.0), record("w2e", "torch-tuned", 9, 80.0),
        ])
        self.b = write_run(self.root, "B", [
            record("w2e", "stillpoint", 1, 40.0), record("w2e", "torch-tuned", 1, 84.0),
            record("w2e", "stillpoint", 2, 40.0), record("w2e", "torch-tuned", 2, 92.0),
            record("w2e", "stillpoint", 3, 40.0), record("w2e", "torch-tuned", 3, 110.0),
            record("w2e", "stillpoint", 4, 40.0),
        ])

    def tearDown(self):
        self.tmp.cleanup()

    def test_pools_the_paired_repetitions_of_all_runs(self):
        result = run(self.a, self.b)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("2 runs (A, B), peer torch-tuned", result.stdout)
        # Pooled: 2.0 2.1 2.3 2.5 2.75 3.0 (mean 2.44, median 2.4).
        self.assertEqual(row(result.stdout, "W2 explicit step"),
                         ["W2 explicit step", ">= 2.5x", "2", "6", "2.40x", "2.15-2.69",
                          "2.00-3.00", "1 of 2"])
        # Workloads without records are left out.
        self.assertIsNone(row(result.stdout, "W1 implicit step"))

    def test_the_user_peer_is_paired_only_where_it_was_measured(self):
        result = run("--peer", "user", self.a, self.b)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(row(result.stdout, "W2 explicit step"),
                         ["W2 explicit step", ">= 2.5x", "1", "1", "4.00x", "4.00-4.00",
                          "4.00-4.00", "1 of 1"])

    def test_pools_the_scaling_ratios_both_ways(self):
        # Adjacent processes: run C 80/40 = 2.0 and 90/60 = 1.5 (median 1.75,
        # meets 1.7x), run D 70/50 = 1.4 (misses); a 1-thread process without
        # its multi-thread partner does not count. Alternating steps: each
        # process's own median ratio, C 1.9 and 1.8, D 1.6.
        def rounds(rep, scaling_median):
            r = record("w2e-rounds", "stillpoint", rep, 45.0)
            r["result"]["scaling_median"] = scaling_median
            return r
        c = write_run(self.root, "C", [
            record("w2e-t1", "stillpoint", 1, 80.0), record("w2e-tN", "stillpoint", 1, 40.0),
            record("w2e-t1", "stillpoint", 2, 90.0), record("w2e-tN", "stillpoint", 2, 60.0),
            record("w2e-t1", "stillpoint", 3, 99.0), rounds(1, 1.9), rounds(2, 1.8),
        ])
        d = write_run(self.root, "D", [
            record("w2e-t1", "stillpoint", 1, 70.0), record("w2e-tN", "stillpoint", 1, 50.0),
            rounds(1, 1.6),
        ])
        result = run(c, d)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(row(result.stdout, "W2 explicit, 2 threads vs 1 (adjacent processes)"),
                         ["W2 explicit, 2 threads vs 1 (adjacent processes)", ">= 1.7x", "2",
                          "3", "1.50x", "1.45-1.75", "1.40-2.00", "1 of 2"])
        self.assertEqual(
            row(result.stdout, "W2 explicit, 2 threads vs 1 (alternating steps in one process)"),
            ["W2 explicit, 2 threads vs 1 (alternating steps in one process)", ">= 1.7x", "2",
             "3", "1.80x", "1.70-1.85", "1.60-1.90", "1 of 2"])
        self.assertIsNone(row(result.stdout, "W2 implicit, 2 threads vs 1 (adjacent processes)"))

    def test_a_rounds_record_without_its_ratio_is_named(self):
        bad = write_run(self.root, "bad", [record("w2i-rounds", "stillpoint", 1, 120.0)])
        result = run(bad)
        self.assertEqual(result.returncode, 2)
        self.assertIn("results.jsonl line 1: not a compare.sh record", result.stderr)
        self.assertIn("scaling_median", result.stderr)

    def test_a_directory_without_results_is_named(self):
        missing = os.path.join(self.root, "nothing here")
        result = run(self.a, missing)
        self.assertEqual(result.returncode, 2)
        self.assertIn(os.path.join(missing, "results.jsonl"), result.stderr)
        self.assertEqual(result.stdout, "")

    def test_a_line_that_is_not_json_is_named_with_its_number(self):
        bad = write_run(self.root, "bad", [record("w2e", "stillpoint", 1, 50.0)],
                        raw_lines=['{"key": "w2e", "config"'])
        result = run(bad)
        self.assertEqual(result.returncode, 2)
        self.assertIn("results.jsonl line 2: not JSON", result.stderr)

    def test_a_record_without_a_median_is_named(self):
        bad = write_run(self.root, "bad", [{"key": "w2e", "config": "stillpoint", "rep": 1,
                                            "result": {"min_ms": 3.0}}])
        result = run(bad)
        self.assertEqual(result.returncode, 2)
        self.assertIn("results.jsonl line 1: not a compare.sh record", result.stderr)
        self.assertIn("median_ms", result.stderr)

    def test_a_non_positive_time_is_refused(self):
        bad = write_run(self.root, "bad", [record("w2e", "stillpoint", 1, 0.0)])
        result = run(bad)
        self.assertEqual(result.returncode, 2)
        self.assertIn("median_ms must be positive", result.stderr)


if __name__ == "__main__":
    SCRIPT = sys.argv.pop(1)
    unittest.main()
