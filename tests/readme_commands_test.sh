#!/bin/bash
# Every `build-release/bin/stillpoint ...` command the README shows, run
# against the program under test after a reduced quickstart (the README's
# first command, with a few training steps). `train` commands get
# train.steps=2 appended to stay quick, `compare` commands a two-step
# budget. ctest runs each step as a test of its own (tests/CMakeLists.txt),
# in parallel where they do not depend on each other, all in one work
# directory:
#
#   readme_commands_test.sh list SOURCE_DIR
#       prints the README's commands, one a line
#   readme_commands_test.sh count SOURCE_DIR EXPECTED
#       fails unless the README shows EXPECTED commands, at least 3
#   readme_commands_test.sh prepare SOURCE_DIR STILLPOINT_BINARY WORK_DIR
#       makes WORK_DIR afresh, with the files the commands read
#   readme_commands_test.sh quickstart SOURCE_DIR STILLPOINT_BINARY WORK_DIR
#       the reduced quickstart (runs/quickstart, which later commands read)
#   readme_commands_test.sh command SOURCE_DIR STILLPOINT_BINARY WORK_DIR COMMAND
#       one README command, as the README spells it
set -euo pipefail
mode=$1
source_dir=$2

readme_commands() {
  awk '/^```bash/{inside=1; next} /^```/{inside=0} inside' "$source_dir/README.md" |
    grep '^build-release/bin/stillpoint '
}

case "$mode" in
  list)
    readme_commands
    exit 0
    ;;
  count)
    expected=$3
    found=$(readme_commands | wc -l)
    if [[ $found -lt 3 || $found -ne $expected ]]; then
      echo "FAIL: found $found stillpoint commands in README.md, the tests were made for" \
        "$expected (at least 3; re-run cmake after editing README.md)"
      exit 1
    fi
    echo "ok: $found README commands"
    exit 0
    ;;
esac

binary=$3
work=$4

if [[ "$mode" == prepare ]]; then
  rm -rf "$work"
  mkdir -p "$work/training/cli"
  ln -s "$source_dir/examples" "$work/examples"
  ln -s "$source_dir/training/cli/completion" "$work/training/cli/completion"
  exit 0
fi

cd "$work"
case "$mode" in
  quickstart)
    "$binary" compare examples/configs/quickstart.yaml train.steps=4 train.eval_every=4 \
      train.checkpoint_every=4 task.train_examples=256 task.test_examples=64 \
      eval.iterations_sweep=[1,2] eval.gradient_check_batch_size=2 \
      log.dir=runs/quickstart log.progress=none >quickstart.log
    ;;
  command)
    command=$5
    reduced_compare="train.steps=2 train.eval_every=2 train.checkpoint_every=2 eval.max_examples=256 eval.iterations_sweep=[1] eval.gradient_check_batch_size=2 log.progress=none"
    line=${command/#build-release\/bin\/stillpoint/$binary}
    [[ "$command" == "build-release/bin/stillpoint train "* ]] && line="${line/ log.dir=/ train.steps=2 log.dir=}"
    # A comparison runs two steps per variant, evaluated once on the first 256
    # held-out examples (the examples' full budgets take minutes each, and the
    # real-data examples' whole held-out sets most of the rest); the README's
    # own flags follow.
    [[ "$command" == "build-release/bin/stillpoint compare "* ]] &&
      line="${line/.yaml/.yaml $reduced_compare}"
    if ! output=$(eval "$line" 2>&1); then
      echo "FAIL: $command"
      sed 's/^/  /' <<<"$output"
      exit 1
    fi
    echo "ok: $command"
    ;;
  *)
    echo "readme_commands_test.sh: unknown mode '$mode'" >&2
    exit 2
    ;;
esac
