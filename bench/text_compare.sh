#!/usr/bin/env bash
# The character-level language model of examples/configs/text.yaml against a
# PyTorch character GPT of the same size (bench/text_gpt.py), on the same
# text, split, window length, batch, steps and schedule: held-out loss (nats
# and bits per character) after the same steps, median ms per step, peak
# resident memory, parameters. A sibling of bench/compare.sh.
#
#   bash bench/text_compare.sh [--steps 2000] [--threads 2] [--variants "explicit implicit"]
#                              [--text FILE] [--out DIR]
#
# Environment: BUILD_DIR (default <repo>/build-release; built when missing),
# STILLPOINT_BIN (use this binary instead). Timings depend on the machine's
# load: run it on a quiet machine.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
steps=2000
threads=2
variants="explicit"
text=""
out=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --variants) variants=$2; shift 2 ;;
    --text) text=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "text_compare.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
out=${out:-$(mktemp -d /tmp/stillpoint_text_compare.XXXXXX)}
mkdir -p "$out"

bin=${STILLPOINT_BIN:-}
if [[ -z "$bin" ]]; then
  build=${BUILD_DIR:-$root/build-release}
  if [[ ! -x "$build/bin/stillpoint" ]]; then
    cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTILLPOINT_NATIVE=ON \
      -DSTILLPOINT_BUILD_TESTS=OFF >/dev/null
    cmake --build "$build" -j "$threads" --target stillpoint_cli
  fi
  bin=$build/bin/stillpoint
fi
text_path=${text:-/usr/share/doc/jargon-text/jargon.txt.gz}
overrides=("train.steps=$steps" "threads=$threads" "task.path=$text_path" "log.progress=none")

rows=()
for variant in $variants; do
  # The explicit model runs as a plain transformer stack (the input enters
  # once, as the GPT's does); the DEQ cells of text.yaml's compare get it at
  # every cell, which an implicit model needs and an explicit one learns
  # worse with (docs/examples.md).
  kind_overrides=("model.kind=$variant")
  [[ "$variant" == explicit ]] && kind_overrides+=("model.input_injection=first_step")
  "$bin" train "$root/examples/configs/text.yaml" "${kind_overrides[@]}" \
    "log.dir=$out/$variant" --overwrite "${overrides[@]}" >"$out/$variant.log" 2>&1
  rows+=("$(python3 - "$out/$variant/summary.json" "$variant" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"stillpoint {sys.argv[2]}|{s['test_loss']:.4f}|{s['test_bpc']:.4f}|"
      f"{1000 * s['seconds_per_step']:.1f}|{s['peak_rss_mb']:.0f}|{s['parameters']}")
PY
)")
done
/usr/bin/python3 "$root/bench/text_gpt.py" --path "$text_path" --steps "$steps" \
  --threads "$threads" >"$out/pytorch.json"
rows+=("$(python3 - "$out/pytorch.json" <<'PY'
import json, sys
s = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(f"PyTorch GPT ({s['torch']})|{s['test_loss']:.4f}|{s['test_bpc']:.4f}|"
      f"{s['median_ms_per_step']:.1f}|{s['peak_rss_mb']:.0f}|{s['parameters']}")
PY
)")
echo "text: $text_path, $steps steps, $threads threads (records in $out)"
echo "| model | held-out loss (nats/char) | bpc | median ms/step | peak RSS (MiB) | parameters |"
echo "|---|---:|---:|---:|---:|---:|"
for row in "${rows[@]}"; do echo "| ${row//|/ | } |"; done
