#!/usr/bin/env bash
# Configures, builds and runs the whole test suite (and, on a CPU with
# AVX2 or AVX-512, the framework's tests once more in a -march=native build).
#
#   bash scripts/test.sh               # build dir: build/
#   BUILD_DIR=/tmp/sp bash scripts/test.sh
#   bash scripts/test.sh -L solvers    # extra arguments go to ctest
#
# Ninja, RelWithDebInfo with line tables only, ccache (when installed). Exits non-zero when the
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

# Line tables only (-g1 rather than -g) in the whole test build: the code is
# the same (debug information never changes what GCC generates), a failing
# test's backtrace and a sanitizer report still name file and line, and
# every file compiles markedly faster (CONTRIBUTING.md). For variables and
# types in a debugger, configure a build directory of your own (full -g).
#
# A unity build (CMake's CMAKE_UNITY_BUILD): the libraries' files compile in
# batches of 8 to a translation unit, as the tests' do in every build
# (tests/CMakeLists.txt), for markedly less compile time from a fresh clone
# (CONTRIBUTING.md). The release builds (scripts/quickstart.sh) and the
# sanitizer builds compile every file on its own, so a file that does not
# include what it uses still fails there. STILLPOINT_UNITY=0 turns it off, for
# quick rebuilds after editing one library file.
unity=ON
[[ "${STILLPOINT_UNITY:-1}" == 0 ]] && unity=OFF
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DCMAKE_UNITY_BUILD=$unity "${launcher[@]}"
cmake --build "$build_dir" -j "$jobs"
# ctest ends with its summary: "N% tests passed, M tests failed out of K",
# the total time, and the names of failed tests.
ctest --test-dir "$build_dir" --output-on-failure -j "$jobs" "$@"
# tests/python (pytest, label python) ran above when the Python package is
# built; say so when it is not, rather than pass without them.
if grep -q '^STILLPOINT_PYTHON:BOOL=OFF$' "$build_dir/CMakeCache.txt"; then
  echo "test.sh: tests/python did not run: the Python package is not built (STILLPOINT_PYTHON" \
    "is OFF; bash scripts/setup.sh installs pybind11, python3-dev and NumPy)" >&2
fi

# The framework's SIMD kernels (matrix products, exponentials, elementwise
# maps) work in packets of the build target's width: 4 floats in the build
# above (the compiler's default, SSE2), 8 with AVX2 and 16 with AVX-512 in a
# Release build for this machine (STILLPOINT_NATIVE). On a CPU with AVX2 the
# framework's tests run once more, built as that machine's Release build is
# (-O3 -march=native: scripts/quickstart.sh), so the width and the code it
# computes with are tested too. Only those tests are built there (so ctest in
# that directory wants -L framework), and the extra arguments above are not
# passed to this run.
if grep -qw avx2 /proc/cpuinfo 2>/dev/null; then
  native_dir="$build_dir-native"
  cmake -S . -B "$native_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTILLPOINT_NATIVE=ON \
    -DCMAKE_UNITY_BUILD=$unity "${launcher[@]}"
  # framework_tests (and, with STILLPOINT_TESTS_PER_FILE in that directory,
  # the framework_<name>_test executables).
  mapfile -t native_tests < <(cmake --build "$native_dir" --target help |
    sed -n 's/^\(framework_[a-z0-9_]*tests\{0,1\}\): .*/\1/p' | sort -u)
  cmake --build "$native_dir" -j "$jobs" --target "${native_tests[@]}"
  ctest --test-dir "$native_dir" --output-on-failure -j "$jobs" -L framework
fi
