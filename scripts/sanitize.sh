#!/usr/bin/env bash
# Runs the tests under sanitizers:
#   asan  AddressSanitizer + UndefinedBehaviorSanitizer (STILLPOINT_SANITIZE),
#         the whole suite, in build-asan/;
#   tsan  ThreadSanitizer (STILLPOINT_SANITIZE_THREAD), the tests that run
#         work on several threads (ParallelFor, data-parallel shards,
#         retrieval), in build-tsan/.
#
#   bash scripts/sanitize.sh            # both
#   bash scripts/sanitize.sh asan       # one of them
#   bash scripts/sanitize.sh asan -R Config   # extra arguments go to ctest
#
# RelWithDebInfo (optimised, with line numbers): a Debug build under ASan is
# too slow for the training tests' time limits. Exits non-zero on the first
# sanitizer report or failing test.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
which=${1:-all}
[[ $# -gt 0 ]] && shift
jobs=$(nproc)

launcher=()
if command -v ccache >/dev/null 2>&1; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=true
fi

configure() {  # build dir, extra cmake arguments...
  local dir=$1
  shift
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DSTILLPOINT_BUILD_BENCH=OFF "${launcher[@]}" "$@" >/dev/null
}

run_asan() {
  configure build-asan -DSTILLPOINT_SANITIZE=ON
  cmake --build build-asan -j "$jobs"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j "$jobs" "$@"
}

run_tsan() {
  configure build-tsan -DSTILLPOINT_SANITIZE_THREAD=ON
  local targets=(framework_parallel_test training_data_parallel_test training_retrieve_test)
  cmake --build build-tsan -j "$jobs" --target "${targets[@]}"
  # No suppressions. oneTBB is a prebuilt library without ThreadSanitizer
  # instrumentation, so ParallelFor (framework/parallel.cc) tells the
  # sanitizer where it hands a task to a worker and where it joins it; a
  # suppression of reports with a frame in libtbb would also hide every race
  # inside a loop body, since each task runs on a stack that passes through it.
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1"
  ctest --test-dir build-tsan --output-on-failure -j "$jobs" \
    -R '^(Parallel|DataParallel|ShardRows|Retrieve)' "$@"
  # The control: a race between two loop bodies must still be reported (a
  # test compiled only into this build, disabled so ctest skips it).
  local control=ParallelTest.DISABLED_ARaceBetweenLoopBodiesIsReportedByThreadSanitizer
  local output
  if output=$(build-tsan/tests/framework_parallel_test --gtest_also_run_disabled_tests \
      --gtest_filter="$control" 2>&1); then
    echo "sanitize.sh: ThreadSanitizer did not report the race in $control" >&2
    return 1
  fi
  if ! grep -q 'WARNING: ThreadSanitizer: data race' <<<"$output"; then
    printf '%s\n' "$output" >&2
    echo "sanitize.sh: $control failed without a ThreadSanitizer report" >&2
    return 1
  fi
  echo "sanitize.sh: tsan: the race in $control was reported, as it must be"
}

case "$which" in
  asan) run_asan "$@" ;;
  tsan) run_tsan "$@" ;;
  all) run_asan "$@" && run_tsan "$@" ;;
  *) echo "sanitize.sh: unknown sanitizer '$which' (asan, tsan or nothing for both)" >&2; exit 2 ;;
esac
