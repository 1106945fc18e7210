#!/usr/bin/env bash
# The tests of training across processes (docs/scale.md), run with mpirun on
# this machine: 2 ranks, and 3 ranks, which cut 32-row batches unevenly
# (11, 11, 10 rows). Needs a build with MPI (STILLPOINT_MPI, on when Open MPI
# is installed: scripts/setup.sh).
#
#   bash scripts/mpi_test.sh              # build dir: build/ (or $BUILD_DIR)
#
# Checks, each of which fails the script:
#   1. the reducer tests (tests/training/gradient_reducer_test.cc) under
#      -np 2 and -np 3;
#   2. the checkpoint of `mpirun -np P stillpoint train ... train.shards=S`
#      is bitwise that of one process with train.shards=P*S (P 2 and 3; with
#      dropout and adjoint warm starts; an explicit model), and differs from
#      one with another shard count (so the comparison can fail);
#   3. a run stopped under -np 2 and resumed in one process with the same
#      total shards (and the reverse) ends bitwise as the straight run;
#   4. eval under -np 2 and -np 3 prints what one process prints; compare
#      under -np 2 trains each variant bitwise as one process;
#   5. faults: an error and a non-finite loss on one rank stop every rank
#      (exit non-zero) naming the rank, with the summary written; a killed
#      rank ends the job within the time limit; SIGINT to mpirun stops every
#      rank after the same step with a checkpoint and the summary;
#   6. bad input: more ranks than batch rows is exit 2 with one message and
#      no run directory.
# Every rank runs one thread (the machine has 2 cores: --oversubscribe).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${BUILD_DIR:-build}
cd "$root"
stillpoint="$root/$build_dir/bin/stillpoint"
reducer_test="$root/$build_dir/tests/training_gradient_reducer_test"
if ! command -v mpirun >/dev/null 2>&1; then
  echo "mpi_test.sh: mpirun not found (bash scripts/setup.sh installs Open MPI)" >&2
  exit 1
fi
if [[ ! -x "$stillpoint" ]] || ! grep -q '^STILLPOINT_MPI:BOOL=ON' "$build_dir/CMakeCache.txt"; then
  echo "mpi_test.sh: $build_dir is not a build with MPI (STILLPOINT_MPI=ON)" >&2
  exit 1
fi
cmake --build "$build_dir" --target stillpoint_cli training_gradient_reducer_test >/dev/null

work=$(mktemp -d "${TMPDIR:-/tmp}/stillpoint-mpi.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"

mpi=(mpirun --allow-run-as-root --oversubscribe)
config="$root/examples/configs/quickstart.yaml"
common=(model.kind=implicit train.steps=4 train.eval_every=2 train.checkpoint_every=2
  threads=1 log.progress=none task.train_examples=256 task.test_examples=64)
passed=0
failed=0
pass() { echo "ok: $*"; passed=$((passed + 1)); }
fail() { echo "FAILED: $*"; failed=$((failed + 1)); }
equal() { python3 "$root/scripts/checkpoint_equal.py" "$1/checkpoint.ckpt" "$2/checkpoint.ckpt" >/dev/null; }
# Runs "$@" and fails the check if it does not end within $1 seconds.
within() { local seconds=$1; shift; timeout --kill-after=10 "$seconds" "$@"; }

# 1. The reducer's tests under 2 and 3 ranks.
for ranks in 2 3; do
  if within 120 "${mpi[@]}" -np "$ranks" "$reducer_test" >"reducer$ranks.log" 2>&1; then
    pass "gradient_reducer_test under -np $ranks"
  else
    fail "gradient_reducer_test under -np $ranks"; tail -30 "reducer$ranks.log"
  fi
done

# 2. Ranks x shards against one process with the same total.
check_bitwise() {  # name ranks shards_per_rank extra...
  local name=$1 ranks=$2 shards=$3; shift 3
  "$stillpoint" train "$config" "${common[@]}" "$@" train.shards=$((ranks * shards)) \
    log.dir="$name-one" >"$name-one.log" 2>&1
  within 300 "${mpi[@]}" -np "$ranks" "$stillpoint" train "$config" "${common[@]}" "$@" \
    train.shards="$shards" log.dir="$name-ranks" >"$name-ranks.log" 2>&1
  if equal "$name-one" "$name-ranks"; then
    pass "$name: -np $ranks train.shards=$shards is bitwise one process with train.shards=$((ranks * shards))"
  else
    fail "$name: checkpoints differ"; python3 "$root/scripts/checkpoint_equal.py" \
      "$name-one/checkpoint.ckpt" "$name-ranks/checkpoint.ckpt" || true
  fi
}
check_bitwise np2 2 1
check_bitwise np3 3 1
check_bitwise np2x2 2 2
check_bitwise dropout 2 1 model.dropout=0.1 model.solver.backward.warm_start=true
check_bitwise explicit 3 1 model.kind=explicit
# The comparison can fail: 2 shards and 3 shards round differently.
if ! equal np2-one np3-one; then pass "2 and 3 shards give different checkpoints"; else
  fail "2 and 3 shards gave the same checkpoint: the comparison proves nothing"; fi

# 3. Resume with another rank count and the same total shards.
resume=(model.dropout=0.1 model.solver.backward.warm_start=true)
within 300 "${mpi[@]}" -np 2 "$stillpoint" train "$config" "${common[@]}" "${resume[@]}" \
  train.shards=1 log.dir=resumed-one --stop-after 2 >resume-a.log 2>&1
"$stillpoint" train "$config" "${common[@]}" "${resume[@]}" train.shards=2 log.dir=resumed-one \
  --resume >resume-b.log 2>&1
"$stillpoint" train "$config" "${common[@]}" "${resume[@]}" train.shards=2 log.dir=resumed-ranks \
  --stop-after 2 >resume-c.log 2>&1
within 300 "${mpi[@]}" -np 2 "$stillpoint" train "$config" "${common[@]}" "${resume[@]}" \
  train.shards=1 log.dir=resumed-ranks --resume >resume-d.log 2>&1
if equal dropout-one resumed-one && equal dropout-one resumed-ranks; then
  pass "resume across rank counts (2 ranks -> 1 process, 1 process -> 2 ranks) is bitwise the straight run"
else
  fail "resume across rank counts differs from the straight run"
fi

# 4. eval and compare.
"$stillpoint" eval np2-one --json >eval-one.json
for ranks in 2 3; do
  within 120 "${mpi[@]}" -np "$ranks" "$stillpoint" eval np2-one --json >"eval-$ranks.json" 2>&1
  if cmp -s eval-one.json "eval-$ranks.json"; then pass "eval under -np $ranks prints what one process prints"
  else fail "eval under -np $ranks: $(cat "eval-$ranks.json")"; fi
done
compare=(train.steps=2 train.eval_every=2 train.checkpoint_every=2 threads=1 log.progress=none
  task.train_examples=128 task.test_examples=32 compare.attention=[softmax]
  compare.kinds=[explicit,implicit] eval.iterations_sweep=[1,2])
"$stillpoint" compare "$config" "${compare[@]}" train.shards=2 log.dir=compare-one >compare-one.log 2>&1
within 300 "${mpi[@]}" -np 2 "$stillpoint" compare "$config" "${compare[@]}" train.shards=1 \
  log.dir=compare-ranks >compare-ranks.log 2>&1
if equal compare-one/softmax/explicit compare-ranks/softmax/explicit &&
  equal compare-one/softmax/implicit compare-ranks/softmax/implicit &&
  [[ -f compare-ranks/report.md ]]; then
  pass "compare under -np 2 trains every variant bitwise as one process and writes the report"
else
  fail "compare under -np 2"
fi

# 5. Faults. Standard error goes to its own file: mpirun forwards the two
# streams separately, so in one file a line of one can land inside a line of
# the other.
set +e
STILLPOINT_FAULT=1:3:error within 120 "${mpi[@]}" -np 2 "$stillpoint" train "$config" \
  "${common[@]}" train.steps=6 log.dir=fault-error >fault-error.log 2>fault-error.err
code=$?
set -e
if [[ $code -ne 0 ]] && grep -q "training stopped early: step 3: rank 1: injected error" fault-error.err &&
  grep -q '"stop_reason": "step 3: rank 1: injected error' fault-error/summary.json; then
  pass "an error on rank 1 stops every rank (exit $code) naming the rank, summary written"
else
  fail "error on rank 1 (exit $code)"; cat fault-error.log fault-error.err
fi
set +e
STILLPOINT_FAULT=2:3:nonfinite within 120 "${mpi[@]}" -np 3 "$stillpoint" train "$config" \
  "${common[@]}" train.steps=6 train.on_nonfinite=stop log.dir=fault-nan >fault-nan.log 2>fault-nan.err
code=$?
set -e
if [[ $code -ne 0 ]] && cat fault-nan.log fault-nan.err | grep -q "step 3: non-finite loss on rank 2" &&
  grep -q '"stopped_early": true' fault-nan/summary.json; then
  pass "a non-finite loss on rank 2 of 3 stops every rank (exit $code) naming the rank"
else
  fail "non-finite loss on rank 2 (exit $code)"; cat fault-nan.log fault-nan.err
fi
set +e
start=$SECONDS
STILLPOINT_FAULT=1:3:kill within 120 "${mpi[@]}" -np 2 "$stillpoint" train "$config" \
  "${common[@]}" train.steps=200 log.dir=fault-kill >fault-kill.log 2>&1
code=$?
set -e
# 124: the time limit ended it, not mpirun.
if [[ $code -ne 0 && $code -ne 124 ]] && grep -q "exited on signal 9" fault-kill.log; then
  pass "a killed rank ends the job in $((SECONDS - start)) s (exit $code)"
else
  fail "killed rank (exit $code)"; cat fault-kill.log
fi
# Ctrl-C: SIGINT to mpirun. Open MPI (4.1) then waits
# odls_base_sigkill_timeout seconds, sends SIGTERM to every rank, waits as
# long again and sends SIGKILL: with 5 s the ranks get the notice after 5 s
# and 5 s to finish the step, agree on the stop and rank 0 writes the
# checkpoint and the summary (docs/scale.md).
"${mpi[@]}" --mca odls_base_sigkill_timeout 5 -np 2 "$stillpoint" train "$config" \
  "${common[@]}" train.steps=100000 log.dir=interrupted >interrupted.log 2>interrupted.err &
launcher=$!
for _ in $(seq 1 120); do  # until the first evaluation has been printed
  cat interrupted.log interrupted.err 2>/dev/null | grep -q "eval at step 2" && break
  sleep 1
done
kill -INT "$launcher"
set +e
wait "$launcher"
code=$?
set -e
if cat interrupted.log interrupted.err | grep -q "stopped by SIGTERM at step" &&
  grep -q '"stop_reason": "stopped by SIGTERM' interrupted/summary.json &&
  "$stillpoint" eval interrupted --json >/dev/null; then
  pass "SIGINT to mpirun: every rank stops after the same step with checkpoint and summary (exit $code)"
else
  fail "SIGINT to mpirun (exit $code)"; cat interrupted.log interrupted.err
fi

# 6. Bad input: more ranks than rows.
set +e
within 60 "${mpi[@]}" -np 3 "$stillpoint" train "$config" "${common[@]}" train.batch_size=2 \
  log.dir=too-many >too-many.log 2>&1
code=$?
set -e
if [[ $code -eq 2 && $(grep -c "^error: .*cannot be cut into 3 ranks" too-many.log) -eq 1 &&
  ! -e too-many ]]; then
  pass "3 ranks for a batch of 2 rows: exit 2, one message, no run directory"
else
  fail "3 ranks for 2 rows (exit $code)"; cat too-many.log
fi

echo "mpi: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
