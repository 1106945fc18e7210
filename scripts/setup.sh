#!/usr/bin/env bash
# Installs everything stillpoint needs to build and test, from Debian 12
# packages. Safe to run again: when every package is already installed it
# says so and does not touch apt at all.
#
#   bash scripts/setup.sh              # build and test dependencies
#   bash scripts/setup.sh --with-peer  # also PyTorch + OpenBLAS, for the
#                                      # side-by-side benchmarks (bench/)
#   bash scripts/setup.sh --with-profiling  # also perf and valgrind
#   bash scripts/setup.sh --with-fuzz  # also clang and libFuzzer (scripts/fuzz.sh)
#
# Runs apt-get directly as root, through sudo otherwise.
set -euo pipefail

usage() {
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
}

packages=(
  build-essential cmake ninja-build ccache git
  libeigen3-dev libtbb-dev libceres-dev libyaml-cpp-dev
  libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev zlib1g-dev
  python3
  # The Python package (python/, STILLPOINT_PYTHON) and its tests (tests/python):
  # pybind11, Python's headers and NumPy to build it, pytest and PyTorch (the
  # stillpoint.torch tests and example) to test it.
  pybind11-dev python3-dev python3-numpy python3-pytest python3-torch
  # OpenBLAS runtime: the matrix products use it when present (Eigen otherwise).
  libopenblas0-openmp
  # Open MPI: training across processes and machines (mpirun; docs/scale.md).
  libopenmpi-dev openmpi-bin
  # Real data: Fashion-MNIST (task.kind fashion_mnist) and the Jargon File, the
  # default text of task.kind text (examples/configs/fashion.yaml, text.yaml).
  dataset-fashion-mnist jargon-text
)
# The reference implementation the benchmarks compare against.
peer_packages=(python3-torch libopenblas0-openmp)
# Profilers: perf (sampling; `perf record -g`, `perf report`) and valgrind
# (callgrind instruction counts, steadier than timings on a shared machine).
profiling_packages=(linux-perf valgrind)
# The fuzz targets (scripts/fuzz.sh) build with clang and its libFuzzer runtime.
fuzz_packages=(clang libclang-rt-14-dev)

for arg in "$@"; do
  case "$arg" in
    --with-peer) packages+=("${peer_packages[@]}") ;;
    --with-profiling) packages+=("${profiling_packages[@]}") ;;
    --with-fuzz) packages+=("${fuzz_packages[@]}") ;;
    -h | --help) usage; exit 0 ;;
    *) echo "setup.sh: unknown argument '$arg'" >&2; usage >&2; exit 2 ;;
  esac
done

missing=()
for package in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$package" 2>/dev/null || true)
  if [[ "$status" != "installed" ]]; then
    missing+=("$package")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup.sh: all ${#packages[@]} packages are installed"
  exit 0
fi

if [[ $(id -u) -eq 0 ]]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1; then
  as_root=(sudo)
else
  echo "setup.sh: missing packages: ${missing[*]}" >&2
  echo "setup.sh: installing them needs root, and sudo is not available;" \
    "run this script as root" >&2
  exit 1
fi

echo "setup.sh: installing ${missing[*]}"
"${as_root[@]}" apt-get update
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y --no-install-recommends "${missing[@]}"
