#!/usr/bin/env bash
# Checks the installed package: installs the build tree into a temporary
# prefix, then configures, builds and runs tests/consumer against it with
# find_package(stillpoint), and imports the installed Python package (when
# the build has one) from the prefix. Builds the tree first if needed.
#
#   bash scripts/check_install.sh      # build dir: build/ (or $BUILD_DIR)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${BUILD_DIR:-build}
jobs=$(nproc)
cd "$root"

if [[ ! -f "$build_dir/CMakeCache.txt" ]]; then
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
cmake --build "$build_dir" -j "$jobs"

work=$(mktemp -d "${TMPDIR:-/tmp}/stillpoint-install.XXXXXX")
trap 'rm -rf "$work"' EXIT

cmake --install "$build_dir" --prefix "$work/prefix" >"$work/install.log"
echo "check_install.sh: installed $(grep -c '^-- Installing' "$work/install.log") files" \
  "into a temporary prefix"

# Public headers live under PREFIX/include/stillpoint/<folder>/; the
# framework's kernels (framework/kernels/) and the command-line program's
# headers (training/cli/) are private to the build and must not be installed.
include_dir="$work/prefix/include/stillpoint"
for header in framework/ops.h framework/buffer_pool.h layers/linear.h training/trainer.h; do
  if [[ ! -f "$include_dir/$header" ]]; then
    echo "check_install.sh: public header $header is not in PREFIX/include/stillpoint" >&2
    exit 1
  fi
done
private=$(cd "$work/prefix" && find . -path '*/kernels/*' -o -name 'gemm.h' -o -name 'vector_math.h' \
  -o -path '*/cli/*.h' -o -name 'cli_commands.h')
if [[ -n "$private" ]]; then
  echo "check_install.sh: private headers were installed:" $private >&2
  exit 1
fi
if [[ -e "$work/prefix/include/framework" ]]; then
  echo "check_install.sh: headers installed outside PREFIX/include/stillpoint" >&2
  exit 1
fi

# The consumer's configure output is long (Ceres reports every dependency):
# keep it in a log and show it only when something fails.
if ! cmake -S tests/consumer -B "$work/consumer" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_PREFIX_PATH="$work/prefix" >"$work/configure.log" 2>&1; then
  cat "$work/configure.log" >&2
  echo "check_install.sh: configuring tests/consumer against the installed package failed" >&2
  exit 1
fi
cmake --build "$work/consumer" -j "$jobs"
"$work/consumer/consumer"
"$work/consumer/consumer_full"

# The Python package, from PREFIX/<STILLPOINT_PYTHON_INSTALL_DIR> alone.
cache_value() { sed -n "s/^$1:[A-Z]*=//p" "$build_dir/CMakeCache.txt"; }
if [[ "$(cache_value STILLPOINT_PYTHON)" == "ON" ]]; then
  site="$work/prefix/$(cache_value STILLPOINT_PYTHON_INSTALL_DIR)"
  python=$(cache_value Python3_EXECUTABLE)
  # Run from elsewhere, so the source tree's python/ cannot be what is imported.
  (cd "$work" && PYTHONPATH="$site" "$python" -c '
import sys, numpy, stillpoint
assert stillpoint.__file__.startswith(sys.argv[1]), stillpoint.__file__
result = stillpoint.retrieve(numpy.eye(3), numpy.eye(3)[:2] * 0.9, beta=8.0)
assert result["nearest"].tolist() == [0, 1], result
print("check_install.sh: imported stillpoint", stillpoint.__version__, "from", sys.argv[1])
' "$site")
fi

# A user's own energy attention registered in a program of their own and
# trained from YAML (examples/custom_layer_from_yaml), against the same prefix.
if ! cmake -S examples/custom_layer_from_yaml -B "$work/custom_layer" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH="$work/prefix" \
  >"$work/configure_custom.log" 2>&1; then
  cat "$work/configure_custom.log" >&2
  echo "check_install.sh: configuring examples/custom_layer_from_yaml failed" >&2
  exit 1
fi
cmake --build "$work/custom_layer" -j "$jobs"
(cd "$work" && "$work/custom_layer/train_lse_attention" \
  "$root/examples/custom_layer_from_yaml/config.yaml" log.progress=none >custom_layer.log) || {
  cat "$work/custom_layer.log" >&2
  echo "check_install.sh: examples/custom_layer_from_yaml did not learn" >&2
  exit 1
}
tail -1 "$work/custom_layer.log"
echo "check_install.sh: OK"
