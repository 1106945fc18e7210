#!/bin/bash
# Every `build-release/bin/stillpoint ...` command the README shows, run
# against the program under test after a reduced quickstart (the README's
# first command, with a few training steps). `train` commands get
# train.steps=2 appended to stay quick, `compare` commands a two-step
# budget. Usage: readme_commands_test.sh
# SOURCE_DIR STILLPOINT_BINARY
set -euo pipefail
source_dir=$1
binary=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
ln -s "$source_dir/examples" examples
mkdir -p training/cli && ln -s "$source_dir/training/cli/completion" training/cli/completion

"$binary" compare examples/configs/quickstart.yaml train.steps=4 train.eval_every=4 \
  train.checkpoint_every=4 task.train_examples=256 task.test_examples=64 \
  eval.iterations_sweep=[1,2] eval.gradient_check_batch_size=2 \
  log.dir=runs/quickstart log.progress=none >quickstart.log

# The commands of the README's bash blocks.
mapfile -t commands < <(awk '/^```bash/{inside=1; next} /^```/{inside=0} inside' \
  "$source_dir/README.md" | grep '^build-release/bin/stillpoint ')
if [[ ${#commands[@]} -lt 3 ]]; then
  echo "FAIL: found ${#commands[@]} stillpoint commands in README.md"
  exit 1
fi
reduced_compare="train.steps=2 train.eval_every=2 train.checkpoint_every=2 eval.iterations_sweep=[1] eval.gradient_check_batch_size=2 log.progress=none"
failures=0
for command in "${commands[@]}"; do
  line=${command/#build-release\/bin\/stillpoint/$binary}
  [[ "$command" == "build-release/bin/stillpoint train "* ]] && line="${line/ log.dir=/ train.steps=2 log.dir=}"
  # A comparison runs two steps per variant, evaluated once (the examples'
  # full budgets take minutes each); the README's own flags follow.
  [[ "$command" == "build-release/bin/stillpoint compare "* ]] &&
    line="${line/.yaml/.yaml $reduced_compare}"
  if ! (eval "$line") >output.txt 2>&1; then
    echo "FAIL: $command"
    sed 's/^/  /' output.txt
    failures=$((failures + 1))
  else
    echo "ok: $command"
  fi
done
exit "$failures"
