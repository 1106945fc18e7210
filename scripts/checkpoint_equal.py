#!/usr/bin/env python3
"""Whether two stillpoint checkpoints hold the same training state, bit for bit.

    python3 scripts/checkpoint_equal.py A.ckpt B.ckpt

Compares everything a resume continues from (training/checkpoint.h): the
step, data position, RNG state, random streams and every record (model
parameters, optimizer state, solver warm starts) byte by byte; of the stored
config only log.dir may differ (it names where each run was written).
Exit 0 when equal, 1 (naming the first difference) when not, 2 for a file
that is not a checkpoint.
"""
import struct
import sys

MAGIC = b"STILLCKP"


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 32 or data[:8] != MAGIC:
        sys.exit(f"checkpoint_equal: {path}: not a stillpoint checkpoint")
    (length,) = struct.unpack("<Q", data[12:20])
    if length != len(data):
        sys.exit(f"checkpoint_equal: {path}: {len(data)} bytes, header says {length}")
    (meta_length,) = struct.unpack("<I", data[20:24])
    meta = data[24:24 + meta_length].decode()
    records = data[24 + meta_length:-8]  # the checksum covers the metadata too
    return meta, records


def meta_lines(meta):
    # The run directory is where the run was written, not what it learned.
    return [line for line in meta.splitlines() if not line.strip().startswith("dir:")]


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    (meta_a, records_a), (meta_b, records_b) = read(sys.argv[1]), read(sys.argv[2])
    lines_a, lines_b = meta_lines(meta_a), meta_lines(meta_b)
    for k, (a, b) in enumerate(zip(lines_a, lines_b)):
        if a != b:
            print(f"metadata line {k + 1} differs:\n  {a[:200]}\n  {b[:200]}")
            return 1
    if len(lines_a) != len(lines_b):
        print(f"metadata: {len(lines_a)} lines against {len(lines_b)}")
        return 1
    if records_a != records_b:
        first = next((i for i, (a, b) in enumerate(zip(records_a, records_b)) if a != b),
                     min(len(records_a), len(records_b)))
        print(f"records differ (model, optimizer or solver state) from byte {first} "
              f"({len(records_a)} and {len(records_b)} bytes)")
        return 1
    print(f"equal: {sys.argv[1]} and {sys.argv[2]} ({len(records_a)} bytes of state)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
