#!/usr/bin/env bash
# The memory wall on this machine: gpt-large (GPT-2 large's shape, 36 layers x 1280; 708M
# parameters at the byte vocabulary) with AdamW on 2 workers. At stage 0 each worker would hold 16
# bytes a parameter (11.3 GB; 22.7 GB the two) before activations: the driver's memory check stops
# the job before its first step with a ConfigError that gives both figures and what would fit. At
# stage 3 with activation checkpointing each holds 16/2 bytes a parameter and each block's input:
# it trains STEPS steps (default 10) of one sequence of CONTEXT (default 64) tokens per worker,
# the learning rate warmed up over 5 (6e-4 at once, as gpt-base takes it, spikes the loss first).
# Prints the check's message, the stage 3 run's progress lines (the loss as it falls), its train
# loss, each worker's peak resident memory, what a replica holds, and seconds per step.
#   bench/zero_wall.sh [STEPS] [MODEL]     (defaults: 10, gpt-large; CONTEXT=64)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-10}
model=${2:-gpt-large}
context=${CONTEXT:-64}
dsgd=${DSGD:-build/dsgd}
[ -x "$dsgd" ] || { echo "zero_wall: $dsgd not built (make build)"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dir=build/lm-bench
[ -f $dir/train.tok ] || $dsgd prepare-text --out $dir >/dev/null
common=(--model "$model" --dataset "text:$dir" --workers 2 --threads 1 --batch-size 2 --max-steps "$steps"
        --config "{\"context\": $context, \"val_sequences\": 4, \"warmup_steps\": 5}" --no-eval)
echo "== $model, zero 0: expected to stop before its first step"
start=$(date +%s.%N)
if OMP_NUM_THREADS=1 $dsgd train "${common[@]}" --zero 0 --quiet >/dev/null 2>"$tmp/zero0.err"; then
  echo "zero_wall: zero 0 trained, so this machine holds it; nothing to show" >&2; exit 1
fi
grep -m1 -i "memory\|error" "$tmp/zero0.err" | cut -c1-600
printf "(stopped after %.1f s)\n" "$(echo "$(date +%s.%N) - $start" | bc)"
echo "== $model, zero 3 + activation checkpointing, $steps steps"
OMP_NUM_THREADS=1 $dsgd train "${common[@]}" --zero 3 --activation-checkpointing --json-out "$tmp/zero3.json" \
  2> >(tee "$tmp/zero3.err" | grep -E "step|loss" >&2) >/dev/null ||
  { echo "zero_wall: zero 3 failed:" >&2; tail -5 "$tmp/zero3.err" >&2; exit 1; }
/usr/bin/python3 - "$tmp/zero3.json" "$steps" <<'PY'
import json, sys
j, steps = json.load(open(sys.argv[1])), int(sys.argv[2])
print(f"zero 3 + activation checkpointing: {j['parameters'] / 1e6:.0f}M parameters, {j['steps']} steps, "
      f"train loss {j['train_loss']:.3f} (first epoch's mean), {j['train_s'] / steps:.1f} s/step, "
      f"peak RSS per worker {j['worker_peak_rss_mib']:.0f} MiB; a replica holds parameters "
      f"{j['parameter_bytes'] / 2**20:.0f} MiB, gradients {j['gradient_bytes'] / 2**20:.0f} MiB, "
      f"optimizer state {j['optimizer_state_bytes'] / 2**20:.0f} MiB")
PY
