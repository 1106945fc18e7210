#!/usr/bin/env bash
# Runs the bench/SPEC.md workloads on stillpoint and on the PyTorch peer, side
# by side, and prints per workload the median step times, the ratio
# peer/stillpoint and the peak resident memory of each, then checks that both
# compute the same loss after one step on a shared tiny configuration.
#
#   bench/compare.sh [--reps N] [--steps S] [--warmup W] [--threads 2]
#                    [--w1-shards N] [--only "w1i w2e ..."] [--peers "user tuned"]
#                    [--out DIR] [--no-extras] [--scale]
#
# --w1-shards (default: the thread count) runs stillpoint's W1 steps as that
# many data-parallel shards (`stillpoint bench --shards`, docs/training.md):
# W1's ops are too short to split well over threads, so on W1 each thread
# runs its own share of the batch instead. W2 runs unsharded (its ops are
# long; shards made no measurable difference there).
#
# --scale also runs `stillpoint bench scale` (step time and peak memory
# against sequence length and depth; training/cli/bench_scale.h) with the
# tuned peer beside its softmax points, its table in DIR/scale.txt and its
# JSON, CSV and plots in DIR/scale/ (with --only "" --no-extras: that alone,
# and the loss agreement).
#
# --reps defaults to 5 (about 10 minutes in all on 2 cores): a workload's
# ratio is a median over repetitions, and on a shared machine the peer's
# step time alone moves by tens of percent between repetitions. With --out,
# the records stay in DIR/results.jsonl; bench/pool_runs.py pools the
# repetitions of several runs.
#
# Environment:
#   BUILD_DIR       Release build directory (default: <repo>/build/release)
#   STILLPOINT_BIN  use this `stillpoint` binary instead of building one
#   PEER_CORETYPE   OpenBLAS kernel of the tuned peer (default: SkylakeX when
#                   the CPU has AVX-512, else Haswell, the best AVX2 kernels)
#   PEER_OMP_WAIT_POLICY  if set, passed to the tuned peer as OMP_WAIT_POLICY
#                   (PASSIVE helps torch a lot on a machine loaded by other
#                   work, where spinning OpenMP workers lose their core)
#
# Method: every measurement is its own process; each repetition runs every
# workload on stillpoint and both peer configurations in a rotating order, so
# the two sides see the same machine load; the ratio of a workload is the
# median over repetitions of peer median / stillpoint median within the same
# repetition. Peer configurations:
#   torch-user   the environment as it is ("as a user gets it")
#   torch-tuned  libopenblas0-openmp first on LD_LIBRARY_PATH, OPENBLAS_CORETYPE
#                set, and glibc's malloc told to keep freed blocks
#                (bench/SPEC.md "Running the peer fairly"); set ONLY in the
#                peer's own command.
# Workload keys: w1i w1e w2i w2e (W1/W2 implicit/explicit); w1ir w1er w2ir
# w2er (the same models again, the peer doing only the work stillpoint does:
# a cell's attention at z = 0 as the one row it equals, and the implicit
# solver's last evaluation recorded and used at z*; torch_peer.py
# --zero-state row --record-last; against the tuned peer only: the per-op
# speed alone); w3 (peer iterates the whole batch), w3a (peer with per-query exit); w4
# (the energy-attention step). Extras (stillpoint only
# unless noted): W1 implicit with 64 iterations (memory), W2 implicit and explicit with 1
# thread next to W2 with --threads (scaling, paired per repetition), W2 implicit and
# explicit with --scaling (scaling again: 1-thread and --threads steps alternating in one
# process), float32 GEMM throughput of torch (tuned).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REPS=5
STEPS=20
WARMUP=3
THREADS=2
W1_SHARDS=""
ONLY="w1i w1ir w1e w1er w2i w2ir w2e w2er w3 w3a w4"
PEERS="user tuned"
OUT=""
EXTRAS=1
SCALE=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --reps) REPS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --w1-shards) W1_SHARDS=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    --peers) PEERS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --no-extras) EXTRAS=0; shift ;;
    --scale) SCALE=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;p}' "$0"; exit 0 ;;
    *) echo "compare.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
W1_SHARDS=${W1_SHARDS:-$THREADS}
[[ "$W1_SHARDS" =~ ^[1-9][0-9]*$ ]] || { echo "compare.sh: --w1-shards must be a positive integer, got '$W1_SHARDS'" >&2; exit 2; }
OUT=${OUT:-$(mktemp -d /tmp/stillpoint-compare.XXXXXX)}
mkdir -p "$OUT"
RESULTS=$OUT/results.jsonl
: > "$RESULTS"

# ---- stillpoint, Release with -march=native
if [[ -n "${STILLPOINT_BIN:-}" ]]; then
  SP=$STILLPOINT_BIN
else
  BUILD_DIR=${BUILD_DIR:-$ROOT/build/release}
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTILLPOINT_NATIVE=ON \
    -DSTILLPOINT_BUILD_TESTS=OFF -DSTILLPOINT_BUILD_EXAMPLES=OFF -DSTILLPOINT_BUILD_BENCH=OFF \
    > "$OUT/cmake.log"
  cmake --build "$BUILD_DIR" --target stillpoint_cli -j2 > "$OUT/build.log"
  SP=$BUILD_DIR/bin/stillpoint
fi

# ---- the peer
PY=/usr/bin/python3
PEER=$ROOT/bench/torch_peer.py
OPENBLAS_DIR=/usr/lib/x86_64-linux-gnu/openblas-openmp
if [[ -z "${PEER_CORETYPE:-}" ]]; then
  if grep -qw avx512f /proc/cpuinfo; then PEER_CORETYPE=SkylakeX; else PEER_CORETYPE=Haswell; fi
fi
TUNABLES=glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=1073741824

# (Both are called through `run`.)
# shellcheck disable=SC2317
peer_user() { "$PY" "$PEER" "$@"; }
# shellcheck disable=SC2317
peer_tuned() {
  env -u OPENBLAS_L2_SIZE LD_LIBRARY_PATH="$OPENBLAS_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    OPENBLAS_CORETYPE="$PEER_CORETYPE" GLIBC_TUNABLES="$TUNABLES" \
    ${PEER_OMP_WAIT_POLICY:+OMP_WAIT_POLICY=$PEER_OMP_WAIT_POLICY} "$PY" "$PEER" "$@"
}

# Arguments of a workload key (the same for both sides, plus the peer's mode).
workload_args() {
  case "$1" in
    w1i|w1ir) echo "w1 --model implicit" ;;
    w1e|w1er) echo "w1 --model explicit" ;;
    w2i|w2ir) echo "w2 --model implicit" ;;
    w2e|w2er) echo "w2 --model explicit" ;;
    w3|w3a) echo "w3" ;;
    w4) echo "w4" ;;
    *) echo "compare.sh: unknown workload key $1" >&2; exit 2 ;;
  esac
}
# stillpoint's own options for a workload key.
sp_extra() {
  case "$1" in
    w1*) echo "--shards $W1_SHARDS" ;;
  esac
}

peer_extra() {
  case "$1" in
    w3) echo "--w3-mode batch" ;;
    w3a) echo "--w3-mode active" ;;
    w1er|w2er) echo "--zero-state row" ;;
    w1ir|w2ir) echo "--zero-state row --record-last" ;;
  esac
}

# The peer configurations a workload key runs against.
peers_of() {
  case "$1" in
    w1ir|w1er|w2ir|w2er) [[ " $PEERS " == *" tuned "* ]] && echo tuned ;;
    *) echo "$PEERS" ;;
  esac
  return 0
}

# run KEY CONFIG REP COMMAND...: one process, its JSON line tagged and kept.
run() {
  local key=$1 config=$2 rep=$3
  shift 3
  local line
  if ! line=$("$@" --json 2> "$OUT/last_stderr.txt" | tail -n 1); then
    echo "compare.sh: $config $key failed:" >&2
    cat "$OUT/last_stderr.txt" >&2
    exit 1
  fi
  printf '{"key": "%s", "config": "%s", "rep": %s, "load1": "%s", "result": %s}\n' \
    "$key" "$config" "$rep" "$(cut -d' ' -f1 /proc/loadavg)" "$line" >> "$RESULTS"
  printf '  %-5s %-12s rep %s: %s ms\n' "$key" "$config" "$rep" \
    "$(sed -n 's/.*"median_ms": \([0-9.]*\).*/\1/p' <<< "$line")"
}

echo "stillpoint: $SP"
echo "peer: $PY $PEER"
echo "  tuned: OPENBLAS_CORETYPE=$PEER_CORETYPE, LD_LIBRARY_PATH=$OPENBLAS_DIR,"
echo "  GLIBC_TUNABLES=$TUNABLES${PEER_OMP_WAIT_POLICY:+, OMP_WAIT_POLICY=$PEER_OMP_WAIT_POLICY}"
CPU_NAME=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
echo "machine: $CPU_NAME, $(nproc) cores; load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "results: $RESULTS"
echo "stillpoint W1 steps: $W1_SHARDS data-parallel shard(s)"

COMMON="--steps $STEPS --warmup $WARMUP --threads $THREADS"
for rep in $(seq 1 "$REPS"); do
  echo "repetition $rep of $REPS (load $(cut -d' ' -f1 /proc/loadavg))"
  for key in $ONLY; do
    args=$(workload_args "$key")
    # shellcheck disable=SC2207
    order=(sp $(peers_of "$key"))
    # Rotate which side goes first, so neither always runs on a warmer or
    # quieter machine.
    shift_by=$(( (rep - 1) % ${#order[@]} ))
    order=("${order[@]:$shift_by}" "${order[@]:0:$shift_by}")
    for side in "${order[@]}"; do
      # (Word splitting of $args, $COMMON and the extras is intended.)
      # shellcheck disable=SC2046,SC2086
      case $side in
        sp) run "$key" stillpoint "$rep" "$SP" bench $args $COMMON $(sp_extra "$key") ;;
        user) run "$key" torch-user "$rep" peer_user $args $COMMON $(peer_extra "$key") ;;
        tuned) run "$key" torch-tuned "$rep" peer_tuned $args $COMMON $(peer_extra "$key") ;;
      esac
    done
  done
  if [[ $EXTRAS == 1 ]]; then
    SHORT="--steps 3 --warmup 1 --threads $THREADS"
    # shellcheck disable=SC2086
    run w1i-k64 stillpoint "$rep" "$SP" bench w1 --model implicit --iters 64 $SHORT --shards "$W1_SHARDS"
    # shellcheck disable=SC2086
    run w1i-k16 stillpoint "$rep" "$SP" bench w1 --model implicit --iters 16 $SHORT --shards "$W1_SHARDS"
    if [[ $THREADS != 1 ]]; then
      # Scaling: each 1-thread run next to a $THREADS-thread run of the same
      # workload, so both see the same machine (its speed drifts by minutes).
      ONE="--steps $STEPS --warmup $WARMUP --threads 1"
      for model in implicit explicit; do
        key=w2${model:0:1}
        # shellcheck disable=SC2086
        run "$key-t1" stillpoint "$rep" "$SP" bench w2 --model $model $ONE
        # shellcheck disable=SC2086
        run "$key-tN" stillpoint "$rep" "$SP" bench w2 --model $model $COMMON
        # The same ratio from steps alternating in one process, so both
        # thread counts see the machine in the same state.
        # shellcheck disable=SC2086
        run "$key-rounds" stillpoint "$rep" "$SP" bench w2 --model $model $COMMON --scaling
      done
    fi
  fi
done

# ---- float32 GEMM throughput of the tuned peer (1024^2, 2 threads)
if [[ $EXTRAS == 1 ]]; then
  env -u OPENBLAS_L2_SIZE LD_LIBRARY_PATH="$OPENBLAS_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    OPENBLAS_CORETYPE="$PEER_CORETYPE" "$PY" - >> "$OUT/gemm.txt" <<'EOF'
import time, torch
for threads in (1, 2):
    torch.set_num_threads(threads)
    n = 1024
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(5):
        a @ b
    times = []
    for _ in range(30):
        t = time.perf_counter(); a @ b; times.append(time.perf_counter() - t)
    times.sort()
    print(f"torch.mm float32 {n}^3, {threads} thread(s): best {2 * n**3 / times[0] / 1e9:.1f} "
          f"GFLOP/s, median {2 * n**3 / times[len(times) // 2] / 1e9:.1f} GFLOP/s")
EOF
  cat "$OUT/gemm.txt"
fi

# ---- step time and memory against length and depth, the tuned peer beside
if [[ $SCALE == 1 ]]; then
  echo
  echo "bench scale (the tuned peer beside the softmax points):"
  "$SP" bench scale --threads "$THREADS" --repeats 5 --warmup 1 --peer "$PEER" --python "$PY" \
    --peer-env "LD_LIBRARY_PATH=$OPENBLAS_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} OPENBLAS_CORETYPE=$PEER_CORETYPE GLIBC_TUNABLES=$TUNABLES${PEER_OMP_WAIT_POLICY:+ OMP_WAIT_POLICY=$PEER_OMP_WAIT_POLICY}" \
    --out "$OUT/scale" 2> "$OUT/scale_progress.txt" | tee "$OUT/scale.txt"
fi

# ---- loss agreement on the shared tiny configuration
echo
echo "loss after one step, shared tiny configuration (weights exported by the peer):"
"$PY" "$PEER" export "$OUT/tiny.json" > "$OUT/tiny_peer.json"
AGREE=0
# agree MODEL DTYPE LABEL LINE: LINE's losses (a --json result labelled LABEL)
# against the peer's exported ones; sets AGREE=1 if they differ.
agree() {
  if ! "$PY" - "$OUT/tiny.json" "$@" <<'EOF'; then AGREE=1; fi
import json, sys
path, model, dtype, label, line = sys.argv[1:6]
peer = json.load(open(path))["peer"][f"{model}_{dtype}"]
ours = json.loads(line)
# float32: a few ulps of the loss after 16 solver iterations and an AdamW
# step; float64: the two implementations run the same algorithm.
tol = 1e-5 if dtype == "float32" else 1e-10
ok = True
for key in ("loss_first", "loss_after_one_step"):
    a, b = ours[key], peer[key]
    rel = abs(a - b) / abs(b)
    ok &= rel <= tol
    print(f"  {'OK    ' if rel <= tol else 'NOT OK'} {model:8s} {dtype} {key:20s} {label} "
          f"{a:.10f}  torch {b:.10f}  rel diff {rel:.1e} (tol {tol:g})")
sys.exit(0 if ok else 1)
EOF
}
for model in implicit explicit; do
  for dtype in float32 float64; do
    line=$("$SP" bench w1 --weights "$OUT/tiny.json" --model "$model" --dtype "$dtype" \
             --steps 1 --warmup 1 --threads 1 --json)
    agree "$model" "$dtype" stillpoint "$line"
  done
done
# The peer doing only stillpoint's work (w1ir, w1er, w2ir, w2er) computes the
# same models.
line=$("$PY" "$PEER" w1 --weights "$OUT/tiny.json" --model explicit --dtype float64 \
         --zero-state row --steps 1 --warmup 1 --threads 1 --json | tail -n 1)
agree explicit float64 "torch, zero state as one row," "$line"
line=$("$PY" "$PEER" w1 --weights "$OUT/tiny.json" --model implicit --dtype float64 \
         --zero-state row --record-last --steps 1 --warmup 1 --threads 1 --json | tail -n 1)
agree implicit float64 "torch, zero state as one row, last evaluation recorded," "$line"

# ---- summary
echo
"$PY" - "$RESULTS" "$OUT/gemm.txt" "$ROOT/bench" <<'EOF'
import collections, json, statistics, sys
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, sys.argv[3])
from pool_runs import WORKLOADS  # the workload keys and their names
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = collections.defaultdict(list)
for r in rows:
    by[(r["key"], r["config"])].append(r)

def med(key, config, field="median_ms"):
    values = [r["result"][field] for r in by.get((key, config), [])]
    return statistics.median(values) if values else None

def ratio(key, config, field="median_ms"):
    sp = {r["rep"]: r["result"][field] for r in by.get((key, "stillpoint"), [])}
    peer = {r["rep"]: r["result"][field] for r in by.get((key, config), [])}
    values = [peer[k] / sp[k] for k in sp if k in peer]
    return (statistics.median(values), min(values), max(values)) if values else None

names = {key: name for key, name, _ in WORKLOADS}
print("| workload | stillpoint ms | torch user ms | torch tuned ms | ratio user/sp | "
      "ratio tuned/sp (min-max) | CPU-time ratio tuned/sp | RSS sp MiB | RSS tuned MiB | "
      "RSS ratio |")
print("|---|---|---|---|---|---|---|---|---|---|")
for key, name in names.items():
    sp = med(key, "stillpoint")
    if sp is None:
        continue
    user, tuned = med(key, "torch-user"), med(key, "torch-tuned")
    ru, rt = ratio(key, "torch-user"), ratio(key, "torch-tuned")
    rc = ratio(key, "torch-tuned", "cpu_median_ms")
    m_sp = med(key, "stillpoint", "peak_rss_mb")
    m_t = med(key, "torch-tuned", "peak_rss_mb")
    fmt = lambda v: "-" if v is None else f"{v:.2f}"
    print(f"| {name} | {sp:.2f} | {fmt(user)} | {fmt(tuned)} | "
          f"{'-' if ru is None else f'{ru[0]:.2f}x'} | "
          f"{'-' if rt is None else f'{rt[0]:.2f}x ({rt[1]:.2f}-{rt[2]:.2f})'} | "
          f"{'-' if rc is None else f'{rc[0]:.2f}x'} | {m_sp:.1f} | {fmt(m_t)} | "
          f"{'-' if m_t is None else f'1/{m_t / m_sp:.1f}'} |")
for key in ("w3", "w3a"):
    for config in ("stillpoint", "torch-tuned"):
        acc = med(key, config, "accuracy")
        if acc is not None:
            it = med(key, config, "iterations_mean")
            ev = med(key, config, "evaluations")
            print(f"{key} {config}: accuracy {acc:.4f}, iterations mean {it:.2f}, "
                  f"query evaluations {ev:.0f}")
k64, k16 = med("w1i-k64", "stillpoint", "peak_rss_mb"), med("w1i-k16", "stillpoint", "peak_rss_mb")
if k64 and k16:
    print(f"W1 implicit peak RSS: 64 iterations {k64:.1f} MiB vs 16 iterations {k16:.1f} MiB "
          f"({100 * (k64 / k16 - 1):+.1f}%)")
for key in ("w2i", "w2e"):
    # Per repetition, the 1-thread run over the multi-thread run made right
    # after it; the median of those ratios.
    t1 = {r["rep"]: r["result"]["median_ms"] for r in by.get((key + "-t1", "stillpoint"), [])}
    tn = {r["rep"]: (r["result"]["median_ms"], r["result"]["threads"])
          for r in by.get((key + "-tN", "stillpoint"), [])}
    pairs = [(t1[k], tn[k][0], tn[k][1]) for k in t1 if k in tn]
    if pairs:
        ratios = [a / b for a, b, _ in pairs]
        print(f"{key}: 1 thread {statistics.median([p[0] for p in pairs]):.1f} ms, "
              f"{pairs[0][2]} threads {statistics.median([p[1] for p in pairs]):.1f} ms "
              f"(adjacent runs): {statistics.median(ratios):.2f}x "
              f"({min(ratios):.2f}-{max(ratios):.2f})")
    # Per process, the median over its rounds of 1-thread step / multi-thread
    # step; the median of those over the repetitions.
    rounds = [r["result"] for r in by.get((key + "-rounds", "stillpoint"), [])]
    if rounds:
        per_process = [r["scaling_median"] for r in rounds]
        print(f"{key}: 1 thread {statistics.median([r['one_thread_median_ms'] for r in rounds]):.1f} ms, "
              f"{rounds[0]['threads']} threads {statistics.median([r['median_ms'] for r in rounds]):.1f} ms "
              f"(alternating steps in one process): {statistics.median(per_process):.2f}x "
              f"({min(per_process):.2f}-{max(per_process):.2f})")
for key in ("w1i", "w1e", "w2i", "w2e"):
    g = med(key, "stillpoint", "gflops_per_s")
    gt = med(key, "torch-tuned", "gflops_per_s")
    if g:
        print(f"{key}: stillpoint {g:.1f} GFLOP/s, torch tuned {gt:.1f} GFLOP/s (analytic FLOPs)")
loads = [float(r["load1"]) for r in rows]
print(f"load average (1 min) during the runs: min {min(loads):.2f}, median "
      f"{statistics.median(loads):.2f}, max {max(loads):.2f}")
EOF
exit $AGREE
