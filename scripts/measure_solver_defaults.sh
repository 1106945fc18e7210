#!/usr/bin/env bash
# Measures the solver choices of an example config's implicit model: each
# choice trains the config's model from the same seed, and the table
# docs/solvers.md ("Measured: solver choices in training") reports per
# choice the median ms per step, the final held-out accuracy, the forward
# and backward iterations, and the gradient error against the reference
# (ift, GMRES to 1e-10) at the final evaluation on a probe batch of 32.
#
#   bash scripts/measure_solver_defaults.sh [CONFIG] [OUT_DIR] [SEEDS...]
#
# Defaults: examples/configs/quickstart.yaml, /tmp/solver-defaults, seeds
# 0 1 2. KIND sets model.kind for every choice but the explicit reference
# (default implicit; KIND=config keeps the config's own, e.g. energy).
# STILLPOINT_BIN picks the binary (default build-release/bin/stillpoint,
# else build/bin/stillpoint). CHOICES picks the list: `adjoint` (default:
# each adjoint solver at 15 and 30 iterations, the inexact modes, the
# forward budget) or `budget` (fewer iterations per step: a looser forward
# tolerance, adjoints stopped on a tolerance, smaller budgets).
# Prints a Markdown table (means over seeds) on stdout.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
config=${1:-$root/examples/configs/quickstart.yaml}
out=${2:-/tmp/solver-defaults}
shift $(( $# < 2 ? $# : 2 )) || true
seeds=("$@")
[[ ${#seeds[@]} -gt 0 ]] || seeds=(0 1 2)
kind=${KIND:-implicit}
kind_override=()
[[ $kind == config ]] || kind_override=("model.kind=$kind")
bin=${STILLPOINT_BIN:-}
if [[ -z $bin ]]; then
  bin=$root/build-release/bin/stillpoint
  [[ -x $bin ]] || bin=$root/build/bin/stillpoint
fi

# name | overrides (the config's own values for everything else)
fp="model.solver.backward.solver=fixed_point"
an="model.solver.backward.solver=anderson"
gm="model.solver.backward.solver=gmres"
b15="model.solver.backward.max_iterations=15"
b30="model.solver.backward.max_iterations=30"
adjoint_choices=(
  "explicit (reference)|model.kind=explicit"
  "the config's own|"
  "fixed_point 30|$fp $b30"
  "anderson 30|$an $b30"
  "gmres 30|$gm $b30"
  "broyden 30|model.solver.backward.solver=broyden $b30"
  "neumann 30|model.solver.backward.solver=neumann model.solver.backward.neumann_terms=30"
  "fixed_point 15|$fp $b15"
  "anderson 15|$an $b15"
  "gmres 15|$gm $b15"
  "phantom|model.solver.backward.mode=phantom"
  "jfb|model.solver.backward.mode=jfb"
  "forward 15 (backward: the config's)|model.solver.forward.max_iterations=15"
  "forward 60 (backward: the config's)|model.solver.forward.max_iterations=60"
)
f3="model.solver.forward.relative_tolerance=1e-3"
f33="model.solver.forward.relative_tolerance=3e-3"
bt3="model.solver.backward.tolerance=1e-3"
b10="model.solver.backward.max_iterations=10"
budget_choices=(
  "explicit (reference)|model.kind=explicit"
  "the config's own|"
  "forward tol 1e-3|$f3"
  "anderson 15|$an $b15"
  "forward tol 1e-3, anderson 15|$f3 $an $b15"
  "forward tol 1e-3, anderson 10|$f3 $an $b10"
  "forward tol 1e-3, fixed_point 15|$f3 $fp $b15"
  "forward tol 1e-3, anderson 30 to 1e-3|$f3 $an $b30 $bt3"
  "forward tol 1e-3, fixed_point 30 to 1e-3|$f3 $fp $b30 $bt3"
  "forward tol 3e-3, anderson 10|$f33 $an $b10"
  "forward tol 1e-3, fixed_point 10|$f3 $fp $b10"
  "forward tol 3e-3, fixed_point 15|$f33 $fp $b15"
  "forward tol 3e-3, fixed_point 10|$f33 $fp $b10"
  "forward tol 3e-3, fixed_point 10, warm start|$f33 $fp $b10 model.solver.backward.warm_start=true"
)
case ${CHOICES:-adjoint} in
  adjoint) choices=("${adjoint_choices[@]}") ;;
  budget) choices=("${budget_choices[@]}") ;;
  *) echo "CHOICES must be adjoint or budget, not '${CHOICES}'" >&2; exit 2 ;;
esac

mkdir -p "$out"
printf '| choice | ms/step | held-out accuracy | fwd iters | bwd iters | grad cosine | grad rel err |\n'
printf '|---|---|---|---|---|---|---|\n'
for entry in "${choices[@]}"; do
  name=${entry%%|*}
  overrides=${entry#*|}
  for seed in "${seeds[@]}"; do
    dir="$out/$(echo "$name" | tr ' ,()' '____')/seed$seed"
    mkdir -p "$(dirname "$dir")"
    # shellcheck disable=SC2086
    "$bin" train "$config" "${kind_override[@]}" seed="$seed" $overrides \
      eval.gradient_check_batch_size=32 log.dir="$dir" log.progress=none log.plots=false \
      --overwrite >"$dir.log" 2>&1 || { echo "failed: $name seed $seed (see $dir.log)" >&2; exit 1; }
  done
  /usr/bin/python3 - "$name" "$out/$(echo "$name" | tr ' ,()' '____')" "${seeds[@]}" <<'PY'
import json, statistics, sys
name, base, seeds = sys.argv[1], sys.argv[2], sys.argv[3:]
runs = [json.load(open(f"{base}/seed{s}/summary.json")) for s in seeds]
def mean(values):
    return sum(values) / len(values)
ms = mean([1000 * r["seconds_per_step"] for r in runs])
acc = mean([100 * r["test_accuracy"] for r in runs])
fwd = mean([r.get("forward_iterations_mean") or 0.0 for r in runs])
bwd = mean([r.get("backward_iterations_mean") or 0.0 for r in runs])
checks = [r.get("gradient_check") for r in runs]
if all(c and c.get("cosine") is not None for c in checks):
    cos = f'{mean([c["cosine"] for c in checks]):.6f}'
    err = f'{mean([c["relative_error"] for c in checks]):.1e}'
else:  # no implicit layer: no gradient to check
    cos = err = "-"
print(f"| {name} | {ms:.1f} | {acc:.2f}% | {fwd:.1f} | {bwd:.1f} | {cos} | {err} |")
PY
done
