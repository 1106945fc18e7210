#!/usr/bin/env python3
"""Names that say one thing: lists the C++ files outside tests/ whose stem
(file name without extension) is shared by files that are not one header
and its implementation, and the headers without an implementation of their
own name: `python3 scripts/stem_collisions.py [--root DIR]`. The exit code
is the number of problems (capped at 100), so a test can gate on it
(tests/walls/house_checks_test.py).

Rules:
- A stem names one thing: all files of a stem must be one `x.h` and its
  `x.cc` in one library. A library is a top-level folder; a library's
  private subfolder that is compiled into it (framework/kernels/) counts as
  the library, so the public face of a private kernel
  (framework/buffer_pool.h, framework/kernels/buffer_pool.cc) is one thing.
  Program entry points (`main`) are exempt: each is its own program.
- A header has an implementation of its name (x.h -> x.cc) unless it is in
  HEADER_ONLY below, each with the reason it has none (templates, inline
  kernels, X-macro lists, interfaces, declarations whose definitions are one
  file per member)."""
import argparse
import collections
import os
import sys

FOLDERS = ["framework", "solvers", "layers", "training", "python", "bench", "examples"]
EXTENSIONS = (".h", ".cc", ".cpp")
# Subfolders compiled into their parent's library (not a library of their own).
MERGED_INTO_PARENT = {"framework/kernels": "framework"}
# Stems that may repeat: one program's entry point each.
PROGRAM_STEMS = {"main"}

HEADER_ONLY = {
    "framework/check.h": "the SP_CHECK macros",
    "framework/ops.h": "declares the ops; defined by section in ops_<section>.cc",
    "framework/option_fields.h": "OptionFields<T>, a template",
    "framework/parallel_loops.h": "inline templates over raw arrays",
    "framework/leaf_gradient_observer.h": "an interface",
    "framework/kernels/elementwise_kernels.h": "inline SIMD kernels",
    "framework/kernels/layer_norm_rows.h": "inline fused rows",
    "framework/kernels/vector_math.h": "inline SIMD maths",
    "solvers/enum_names.h": "the enum name table template",
    "solvers/problem.h": "an interface (the map a solver works on)",
    "solvers/forward_solver_list.h": "an X-macro list (SP_FORWARD_SOLVERS)",
    "solvers/adjoint/method_list.h": "an X-macro list (SP_ADJOINT_SOLVERS)",
    "solvers/adjoint/methods.h": "declarations made from method_list.h; one file per method",
    "solvers/implicit_solve/mode_list.h": "an X-macro list (SP_BACKWARD_MODES)",
    "solvers/implicit_solve/modes.h": "declarations made from mode_list.h; one file per mode",
    "layers/name_registry.h": "Registry<Factory>, a template",
    "layers/energy_block_catalogue.h": "CatalogueBlock<Layer>, a template",
    "layers/energy_block_list.h": "an X-macro list (SP_ENERGY_BLOCKS)",
    "training/config/option_schema.h": "AddOptionKeys / ReadOptionKeys, templates",
    "training/statistics.h": "inline summary statistics",
    "training/data/task.h": "TaskDefinition and the DefineTask templates",
    "training/data/task_list.h": "an X-macro list (SP_TASKS)",
    "training/cli/exit_codes.h": "the exit codes, constants",
    "python/src/py_bindings.h": "declares each py_*.cc's Register function",
}


def library(path):
    folder = os.path.dirname(path)
    for sub, parent in MERGED_INTO_PARENT.items():
        if folder == sub or folder.startswith(sub + "/"):
            return parent
    return folder.split("/")[0]


def sources(root):
    for top in FOLDERS:
        for folder, dirs, files in os.walk(os.path.join(root, top)):
            dirs.sort()
            for name in sorted(files):
                if name.endswith(EXTENSIONS):
                    yield os.path.relpath(os.path.join(folder, name), root)


def problems(root):
    by_stem = collections.defaultdict(list)
    for path in sources(root):
        by_stem[os.path.splitext(os.path.basename(path))[0]].append(path)
    found = []
    for stem, paths in sorted(by_stem.items()):
        if stem in PROGRAM_STEMS:
            continue
        headers = [p for p in paths if p.endswith(".h")]
        others = [p for p in paths if not p.endswith(".h")]
        one_pair = (len(headers) <= 1 and len(others) <= 1 and
                    len({library(p) for p in paths}) == 1)
        if not one_pair:
            found.append("stem '%s' names %d files: %s" % (stem, len(paths), ", ".join(paths)))
        for header in headers:
            implemented = any(library(p) == library(header) for p in others)
            if not implemented and header not in HEADER_ONLY:
                found.append("%s has no %s.cc (add it, rename the implementation, or list "
                             "a header-only file in HEADER_ONLY with its reason)" % (header, stem))
    for header in sorted(HEADER_ONLY):
        if not os.path.exists(os.path.join(root, header)):
            found.append("HEADER_ONLY names %s, which does not exist" % header)
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = parser.parse_args()
    found = problems(args.root)
    for line in found:
        print(line)
    if not found:
        print("no stem collisions; every header has its implementation or a reason")
    return min(len(found), 100)


if __name__ == "__main__":
    sys.exit(main())
