#!/usr/bin/env bash
# Builds and runs the gradient-check demo (examples/gradcheck_demo.cpp):
# a small float64 network differentiated once and twice, checked against
# finite differences. Exits non-zero if a check fails.
#
#   bash scripts/demo.sh               # build dir: build/ (or $BUILD_DIR)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${BUILD_DIR:-build}
cd "$root"

cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build_dir" -j "$(nproc)" --target gradcheck_demo
echo
"$build_dir/examples/gradcheck_demo"
