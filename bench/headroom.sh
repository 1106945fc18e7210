#!/usr/bin/env bash
# How much of a machine's second core the two-thread step uses, per workload.
#
#   bench/headroom.sh [--reps N] [--steps S] [--only "w1e w2i ..."]
#
# Each repetition runs, one after the other:
#   - one process with --threads 2 (every op split over both threads),
#   - one process with --threads 2 --shards 2 (each thread runs half of the
#     batch on its own replica of the model, training/data_parallel.h), and
#   - two processes with --threads 1 at the same time, each on the whole
#     batch (both cores busy with no sharing between them at all).
# Two concurrent one-thread steps finish two steps in the time they take, so
# half of their step time is what a step would take if its batch were split
# between the threads and each half ran on its own, synchronising only once
# per step (the gradient sum). The script prints, per workload, the median
# over repetitions of the two-thread step, of the sharded two-thread step and
# of half the concurrent one-thread step, and the ratios of the first to the
# other two: what the shards gained, and what a batch-split step could gain
# at best.
#
# Environment: STILLPOINT_BIN, the `stillpoint` binary to time (default: the
# Release build in build/release/bin).
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
bin="${STILLPOINT_BIN:-$repo/build/release/bin/stillpoint}"
reps=5
steps=40
only="w1i w1e w2i w2e"

while [[ $# -gt 0 ]]; do
  case "$1" in
    --reps) reps="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --only) only="$2"; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "headroom.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$reps" =~ ^[1-9][0-9]*$ ]] || { echo "headroom.sh: --reps must be a positive integer, got '$reps'" >&2; exit 2; }
[[ "$steps" =~ ^[1-9][0-9]*$ ]] || { echo "headroom.sh: --steps must be a positive integer, got '$steps'" >&2; exit 2; }
[[ -x "$bin" ]] || { echo "headroom.sh: no stillpoint binary at $bin (set STILLPOINT_BIN)" >&2; exit 2; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# Median step time (ms) of one `stillpoint bench --json` output file.
median_of() { /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["median_ms"])' "$1"; }

args_of() {
  case "$1" in
    w1i) echo "w1 --model implicit" ;;
    w1e) echo "w1 --model explicit" ;;
    w2i) echo "w2 --model implicit" ;;
    w2e) echo "w2 --model explicit" ;;
    *) echo "headroom.sh: unknown workload '$1' (w1i w1e w2i w2e)" >&2; return 2 ;;
  esac
}

for key in $only; do args_of "$key" > /dev/null; done

for key in $only; do
  read -r -a args <<< "$(args_of "$key")"
  : > "$tmp/$key"
  for ((r = 1; r <= reps; ++r)); do
    "$bin" bench "${args[@]}" --threads 2 --steps "$steps" --json > "$tmp/two.json"
    "$bin" bench "${args[@]}" --threads 2 --shards 2 --steps "$steps" --json > "$tmp/sharded.json"
    "$bin" bench "${args[@]}" --threads 1 --steps "$steps" --json > "$tmp/one_a.json" &
    pid=$!
    "$bin" bench "${args[@]}" --threads 1 --steps "$steps" --json > "$tmp/one_b.json"
    wait "$pid"
    echo "$(median_of "$tmp/two.json") $(median_of "$tmp/sharded.json") $(median_of "$tmp/one_a.json") $(median_of "$tmp/one_b.json")" >> "$tmp/$key"
  done
done

/usr/bin/python3 - "$tmp" $only <<'PY'
import statistics, sys
tmp, keys = sys.argv[1], sys.argv[2:]
print(f"{'workload':8} {'2 threads ms':>13} {'2 shards ms':>12} {'half of 2 x 1 thread ms':>24} "
      f"{'shards gain':>12} {'headroom':>9}")
for key in keys:
    rows = [list(map(float, line.split())) for line in open(f"{tmp}/{key}")]
    two = statistics.median(r[0] for r in rows)
    sharded = statistics.median(r[1] for r in rows)
    # Each repetition: the slower of the two concurrent processes bounds the pair.
    split = statistics.median(max(r[2], r[3]) / 2 for r in rows)
    print(f"{key:8} {two:13.2f} {sharded:12.2f} {split:24.2f} {two / sharded:11.2f}x "
          f"{two / split:8.2f}x")
PY
