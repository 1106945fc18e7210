#!/usr/bin/env bash
# The main job: builds the `stillpoint` program and runs the quickstart's two
# comparisons:
#   - examples/configs/quickstart.yaml: the reverse task trained as an
#     explicit 6-layer transformer, a weight-tied unroll and an implicit (DEQ)
#     model, with softmax and probabilistic attention (runs/quickstart/);
#   - examples/configs/quickstart_extrapolate.yaml: prefix parity trained on
#     8 bits and evaluated on 64, where the implicit model holds up by
#     iterating longer and the explicit one falls toward chance
#     (runs/quickstart_extrapolate/, its report's length x iterations heat map).
#
#   bash scripts/quickstart.sh                       # Release, -march=native, build-release/
#   bash scripts/quickstart.sh train.steps=50        # extra arguments: config overrides
#   BUILD_DIR=build BUILD_TYPE=RelWithDebInfo bash scripts/quickstart.sh   # reuse the test build
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${BUILD_DIR:-build-release}
build_type=${BUILD_TYPE:-Release}
cd "$root"

native=OFF
[[ "$build_type" == Release ]] && native=ON
launcher=()
if command -v ccache >/dev/null 2>&1; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=true
fi
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="$build_type" \
  -DSTILLPOINT_NATIVE="$native" "${launcher[@]}" >/dev/null
cmake --build "$build_dir" -j "$(nproc)" --target stillpoint_cli

"$build_dir/bin/stillpoint" compare examples/configs/quickstart.yaml "$@"

# The same overrides for the second comparison; a log.dir given for the first
# gets the suffix -extrapolate, so the two runs never share a directory.
second=()
for argument in "$@"; do
  case "$argument" in
    log.dir=*) second+=("$argument-extrapolate") ;;
    *) second+=("$argument") ;;
  esac
done
"$build_dir/bin/stillpoint" compare examples/configs/quickstart_extrapolate.yaml "${second[@]}"
