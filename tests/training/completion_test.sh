#!/bin/bash
# The bash completion script (training/cli/completion/stillpoint.bash) against
# the built program: commands, options, override keys from
# `stillpoint config --keys`, config files. Usage: completion_test.sh SCRIPT BIN_DIR
set -u
source "$1"
export PATH="$2:$PATH"
cd "$(mktemp -d)" || exit 1
touch run.yaml notes.txt
failures=0
expect() {  # expect "WANTED" WORDS...
  local wanted="$1"
  shift
  COMP_WORDS=("$@")
  COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
  COMPREPLY=()
  _stillpoint
  if [[ "${COMPREPLY[*]}" != "${wanted}" ]]; then
    echo "FAIL: '${COMP_WORDS[*]}' completed to '${COMPREPLY[*]}', wanted '${wanted}'"
    failures=$((failures + 1))
  fi
}
expect "train" stillpoint tr
expect "report retrieve" stillpoint re
expect "--json-schema" stillpoint config --js
expect "--resume" stillpoint train run.yaml --res
expect "run.yaml" stillpoint train r
expect "model.kind=" stillpoint train run.yaml model.ki
expect "train.optimizer.lr=" stillpoint compare run.yaml train.optimizer.l
exit "${failures}"
