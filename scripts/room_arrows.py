#!/usr/bin/env python3
"""The rooms inside training/ and the one way their arrows point:
`python3 scripts/room_arrows.py [--root DIR]` lists every `#include
"training/..."` in training/ that runs from a room to a room above it, and
exits with their number (capped at 100), so a test can gate on it
(tests/walls/house_checks_test.py).

The rooms, bottom to top (a file may include its own room and the rooms
below it, never one above):

  training/config/   the YAML document (Config) and the option-key templates
  training/data/     datasets, readers and the tasks of task.kind
  training/          the trainer core: step, loop, hooks, optimizers,
                     schedules, checkpoints, evaluation, data parallelism,
                     the run's own files (metrics.csv, summary, plots)
  training/report/   `stillpoint compare` and its comparison report
  training/demos/    the seed papers' demos
  training/cli/      the `stillpoint` program

The library targets' walls (cmake/stillpoint_headers.cmake) already keep
training/ from including training/cli/; this check orders the rooms inside
the one training library, where every header is on the include path."""
import argparse
import os
import re
import sys

ROOMS = ["training/config", "training/data", "training", "training/report", "training/demos",
         "training/cli"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"(training/[^"]+)"', re.MULTILINE)


def room_of(path):
    """The deepest room whose folder holds `path` (a path relative to the root)."""
    folder = os.path.dirname(path)
    best = None
    for room in ROOMS:
        if folder == room or folder.startswith(room + "/"):
            if best is None or len(room) > len(best):
                best = room
    return best


def arrows_up(root):
    found = []
    for folder, dirs, files in os.walk(os.path.join(root, "training")):
        dirs.sort()
        for name in sorted(files):
            if not name.endswith((".h", ".cc")):
                continue
            path = os.path.relpath(os.path.join(folder, name), root)
            source_room = room_of(path)
            with open(os.path.join(root, path), encoding="utf-8") as f:
                text = f.read()
            for included in INCLUDE.findall(text):
                target_room = room_of(included)
                if target_room is None or source_room is None:
                    continue
                if ROOMS.index(target_room) > ROOMS.index(source_room):
                    found.append("%s (room %s/) includes %s (room %s/, above it)" %
                                 (path, source_room, included, target_room))
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = parser.parse_args()
    found = arrows_up(args.root)
    for line in found:
        print(line)
    if not found:
        print("every include in training/ points to its own room or one below")
    return min(len(found), 100)


if __name__ == "__main__":
    sys.exit(main())
