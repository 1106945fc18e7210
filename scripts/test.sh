#!/usr/bin/env bash
# Configures, builds and runs the whole test suite.
#
#   bash scripts/test.sh               # build dir: build/
#   BUILD_DIR=/tmp/sp bash scripts/test.sh
#   bash scripts/test.sh -L solvers    # extra arguments go to ctest
#
# Ninja, RelWithDebInfo, ccache (when installed). Exits non-zero when the
# configure, the build or any test fails.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${BUILD_DIR:-build}
jobs=$(nproc)
cd "$root"

# A build dir made by another generator cannot be reused with Ninja.
cache="$build_dir/CMakeCache.txt"
if [[ -f "$cache" ]] && ! grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$cache"; then
  echo "test.sh: $build_dir was configured with another generator;" \
    "remove it or set BUILD_DIR" >&2
  exit 1
fi

launcher=()
if command -v ccache >/dev/null 2>&1; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  # Relative paths in the cache keys: a fresh clone elsewhere still hits.
  export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=true
fi

cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}"
cmake --build "$build_dir" -j "$jobs"
# ctest ends with its summary: "N% tests passed, M tests failed out of K",
# the total time, and the names of failed tests.
ctest --test-dir "$build_dir" --output-on-failure -j "$jobs" "$@"
