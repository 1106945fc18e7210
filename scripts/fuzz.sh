#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (config loader, checkpoint
# reader, CSV and gzip readers, IDX reader) with clang, ASan and UBSan, in build-fuzz/,
# and runs each for FUZZ_SECONDS (default 30) from its seed corpus
# (tests/fuzz/corpus/<name>/). New inputs go to build-fuzz/corpus/<name>/,
# never into the repository; a crash leaves its input in
# build-fuzz/<name>-crash-* (or -timeout-, -oom-) and the script exits
# non-zero.
#
#   bash scripts/fuzz.sh                  # every target, 30 s each
#   FUZZ_SECONDS=600 bash scripts/fuzz.sh config
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
seconds=${FUZZ_SECONDS:-30}
build_dir=build-fuzz

launcher=()
if command -v ccache >/dev/null 2>&1; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=true
fi
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER=clang++ -DSTILLPOINT_FUZZ=ON -DSTILLPOINT_BUILD_TESTS=OFF \
  -DSTILLPOINT_BUILD_EXAMPLES=OFF -DSTILLPOINT_BUILD_BENCH=OFF "${launcher[@]}" >/dev/null

targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  for source in tests/fuzz/*_fuzz.cc; do
    name=$(basename "$source" _fuzz.cc)
    targets+=("$name")
  done
fi
cmake --build "$build_dir" -j "$(nproc)" --target "${targets[@]/#/fuzz_}"

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
for name in "${targets[@]}"; do
  corpus="$build_dir/corpus/$name"
  mkdir -p "$corpus"
  echo "fuzz.sh: $name for $seconds s"
  "$build_dir/tests/fuzz/fuzz_$name" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$build_dir/$name-" \
    "$corpus" "tests/fuzz/corpus/$name"
done
echo "fuzz.sh: no crash in ${targets[*]}"
