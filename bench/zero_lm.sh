#!/usr/bin/env bash
# ZeRO at a language model's size: gpt-base (124M parameters, GPT-2 small's shape) with AdamW on
# 2 workers x 1 thread, one job per stage (0, 1, 2), each STEPS steps of 2 sequences of CONTEXT
# (default 256) tokens per worker. Prints per stage each worker's largest peak resident memory
# (the summary's worker_peak_rss_mib, VmHWM), the optimizer-state and gradient bytes each replica
# holds, and seconds per step, beside the formula's saving (per replica, (N-1)/N of AdamW's 8
# bytes a parameter at stage 1, and of the gradient's 4 more at stage 2).
#   bench/zero_lm.sh [STEPS] [MODEL]        (defaults: 4 steps, gpt-base; RESULTS_JSON=FILE)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-4}
model=${2:-gpt-base}
dsgd=${DSGD:-build/dsgd}
py=/usr/bin/python3
[ -x "$dsgd" ] || { echo "zero_lm: $dsgd not built (make build)"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dir=build/lm-bench
[ -f $dir/train.tok ] || $dsgd prepare-text --out $dir >/dev/null
context=${CONTEXT:-256}
for z in 0 1 2; do
  OMP_NUM_THREADS=1 $dsgd train --model "$model" --dataset "text:$dir" --workers 2 --threads 1 --batch-size 4 \
    --max-steps "$steps" --config "{\"context\": $context, \"val_sequences\": 8}" --no-eval --quiet --zero $z \
    --json-out "$tmp/zero$z.json" >/dev/null 2>"$tmp/err" ||
    { echo "zero_lm: zero $z failed:" >&2; tail -5 "$tmp/err" >&2; exit 1; }
  echo "  zero $z done" >&2
done
$py - "$tmp" "$model" "$steps" "$context" <<'PY'
import json, os, sys
tmp, model, steps, context = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
runs = {z: json.load(open(os.path.join(tmp, f"zero{z}.json"))) for z in (0, 1, 2)}
def metric(j, key):
    for where in (j, j.get("train_metrics", {}), j.get("metrics", {})):
        if isinstance(where, dict) and key in where:
            return where[key]
    return float("nan")
params = metric(runs[0], "parameters")
print(f"\n#### {model}, AdamW, 2 workers x 1 thread, 2 x {context} tokens per worker and step ({steps} steps)\n")
print("| zero | peak RSS per worker, MiB | optimizer state MB a replica | gradients MB a replica | s/step | saved MiB (formula) |")
print("|---|---|---|---|---|---|")
base = metric(runs[0], "worker_peak_rss_mib")
for z, j in runs.items():
    rss = metric(j, "worker_peak_rss_mib")
    formula = {0: 0, 1: 8, 2: 12}[z] * params / 2 / 2**20 if params == params else float("nan")
    print(f"| {z} | {rss:.0f} | {metric(j, 'optimizer_state_bytes') / 1e6:.1f} | {metric(j, 'gradient_bytes') / 1e6:.1f} "
          f"| {metric(j, 'train_s') / steps:.2f} | {base - rss:.0f} ({formula:.0f}) |")
if os.environ.get("RESULTS_JSON"):
    json.dump(runs, open(os.environ["RESULTS_JSON"], "w"), indent=2)
PY
