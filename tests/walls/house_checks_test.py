#!/usr/bin/env python3
"""The house's name and room checks: scripts/stem_collisions.py (no stem
collision, every header with its implementation or a reason) and
scripts/room_arrows.py (the rooms inside training/ include only their own
room and the rooms below), each on the source tree and on small trees
written here, which they must refuse; and that every test file of a folder
executable keeps its code in a namespace named for the file, which the
folder's unity build relies on (tests/CMakeLists.txt).

    python3 tests/walls/house_checks_test.py SOURCE_DIR
"""
import glob
import os
import re
import subprocess
import sys
import tempfile
import unittest

ROOT = None


def run(script, root):
    result = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", script), "--root", root],
                            capture_output=True, text=True)
    return result.returncode, result.stdout + result.stderr


def write(root, files):
    for path, text in files.items():
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as out:
            out.write(text)


class StemCollisionsTest(unittest.TestCase):
    def test_source_tree_has_none(self):
        code, out = run("stem_collisions.py", ROOT)
        self.assertEqual(code, 0, out)

    def test_same_stem_in_two_libraries_is_refused(self):
        with tempfile.TemporaryDirectory() as root:
            write(root, {"framework/hopfield.h": "", "framework/ops_hopfield.cc": "",
                         "layers/hopfield.h": "", "layers/hopfield.cc": ""})
            code, out = run("stem_collisions.py", root)
            self.assertIn("stem 'hopfield' names 3 files", out)
            self.assertIn("framework/hopfield.h has no hopfield.cc", out)
            self.assertGreaterEqual(code, 2)

    def test_two_implementations_of_one_stem_are_refused(self):
        with tempfile.TemporaryDirectory() as root:
            write(root, {"solvers/options.h": "", "solvers/options.cc": "",
                         "solvers/adjoint/options.h": "", "solvers/adjoint/options.cc": ""})
            code, out = run("stem_collisions.py", root)
            self.assertIn("stem 'options' names 4 files", out)
            self.assertGreaterEqual(code, 1)

    def test_header_and_implementation_pass(self):
        with tempfile.TemporaryDirectory() as root:
            # The tree must hold the allowlisted headers, or the check says
            # the allowlist names a file that is gone.
            allowlisted = subprocess.run(
                [sys.executable, "-c",
                 "import sys; sys.path.insert(0, %r); import stem_collisions as s; "
                 "print('\\n'.join(s.HEADER_ONLY))" % os.path.join(ROOT, "scripts")],
                capture_output=True, text=True, check=True).stdout.split()
            files = {path: "" for path in allowlisted}
            files.update({"layers/linear.h": "", "layers/linear.cc": "",
                          "framework/buffer_pool.h": "",
                          "framework/kernels/buffer_pool.cc": "",
                          "training/cli/main.cc": "", "examples/demo/main.cc": ""})
            write(root, files)
            code, out = run("stem_collisions.py", root)
            self.assertEqual(code, 0, out)


class RoomArrowsTest(unittest.TestCase):
    def test_source_tree_points_down(self):
        code, out = run("room_arrows.py", ROOT)
        self.assertEqual(code, 0, out)

    def test_data_including_the_core_is_refused(self):
        with tempfile.TemporaryDirectory() as root:
            write(root, {"training/data/dataset.h": '#include "training/trainer.h"\n',
                         "training/trainer.h": '#include "training/data/dataset.h"\n'})
            code, out = run("room_arrows.py", root)
            self.assertEqual(code, 1, out)
            self.assertIn("training/data/dataset.h (room training/data/) includes "
                          "training/trainer.h (room training/, above it)", out)

    def test_core_including_the_report_is_refused(self):
        with tempfile.TemporaryDirectory() as root:
            write(root, {"training/trainer.cc": '#include "training/report/compare.h"\n'
                                                '#include "training/config/config.h"\n',
                         "training/config/config.h": '#include "training/data/task.h"\n'})
            code, out = run("room_arrows.py", root)
            self.assertEqual(code, 2, out)
            self.assertIn("training/trainer.cc (room training/) includes "
                          "training/report/compare.h", out)
            self.assertIn("training/config/config.h (room training/config/) includes "
                          "training/data/task.h", out)

    def test_downward_includes_pass(self):
        with tempfile.TemporaryDirectory() as root:
            write(root, {"training/cli/main.cc": '#include "training/report/compare.h"\n',
                         "training/report/compare.cc": '#include "training/trainer.h"\n',
                         "training/trainer.cc": '#include "training/data/dataset.h"\n'
                                                '#  include "training/trainer.h"\n',
                         "training/data/dataset.cc": '#include "training/config/config.h"\n'})
            code, out = run("room_arrows.py", root)
            self.assertEqual(code, 0, out)


class TestFileNamespacesTest(unittest.TestCase):
    """tests/<folder>/<stem>_test.cc are compiled several to a translation
    unit, so each must open `namespace stillpoint::<stem>` (or
    `stillpoint::internal::<stem>`) around its helpers and tests: helpers of
    the same name in two files (a `Random`, a `kF64`) then cannot collide."""

    def test_every_test_file_has_a_namespace_of_its_own(self):
        files = sorted(glob.glob(os.path.join(ROOT, "tests", "*", "*_test.cc")))
        self.assertGreater(len(files), 50)
        missing = []
        for path in files:
            stem = os.path.basename(path)[:-len(".cc")]
            with open(path, encoding="utf-8") as source:
                text = source.read()
            if not re.search(r"^namespace stillpoint(::internal)?::%s \{$" % re.escape(stem),
                             text, re.MULTILINE):
                missing.append(os.path.relpath(path, ROOT))
        self.assertEqual(missing, [], "test files without `namespace stillpoint::<file stem> {`")


if __name__ == "__main__":
    ROOT = os.path.abspath(sys.argv.pop(1))
    unittest.main()
