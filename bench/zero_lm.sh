#!/usr/bin/env bash
# ZeRO and activation checkpointing at a language model's size: gpt-base (124M parameters, GPT-2
# small's shape) with AdamW on 2 workers x 1 thread, one job per variant, each STEPS steps of
# BATCH / 2 sequences of CONTEXT tokens per worker. The variants (RUNS, default "0 1 2 3 0ac 3ac"):
# a ZeRO stage, "ac" with --activation-checkpointing. Prints per variant each worker's largest peak
# resident memory (the summary's worker_peak_rss_mib, VmHWM), what each replica holds (optimizer
# state, gradients, parameters) and seconds per step, beside the formula's saving per replica of
# what stage 0 holds (AdamW in fp32: (N-1)/N of 8 bytes a parameter at stage 1, of 12 at stage 2,
# of 16 at stage 3); then whether PyTorch's FSDP can run beside it. ROUNDS rounds (default 1) of
# every variant in the order given, interleaved, fresh workers each run; s/step is a run's train_s
# / STEPS (its first step included), and the table gives each variant's median over the rounds
# (peak RSS: the largest). Compare within one run.
#   bench/zero_lm.sh [STEPS] [MODEL]   (defaults: 4 steps, gpt-base; CONTEXT=256 BATCH=4 ROUNDS=1
#                                       RUNS=...; RESULTS_JSON=FILE)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-4}
model=${2:-gpt-base}
dsgd=${DSGD:-build/dsgd}
py=/usr/bin/python3
runs=${RUNS:-0 1 2 3 0ac 3ac}
rounds=${ROUNDS:-1}
[ -x "$dsgd" ] || { echo "zero_lm: $dsgd not built (make build)"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dir=build/lm-bench
[ -f $dir/train.tok ] || $dsgd prepare-text --out $dir >/dev/null
context=${CONTEXT:-256}
batch=${BATCH:-4}
for r in $(seq 1 "$rounds"); do
  for v in $runs; do
    z=${v%ac}
    ac=(); [ "$v" != "$z" ] && ac=(--activation-checkpointing)
    OMP_NUM_THREADS=1 $dsgd train --model "$model" --dataset "text:$dir" --workers 2 --threads 1 --batch-size "$batch" \
      --max-steps "$steps" --config "{\"context\": $context, \"val_sequences\": 8}" --no-eval --quiet --zero "$z" \
      "${ac[@]}" --json-out "$tmp/$v.$r.json" >/dev/null 2>"$tmp/err" ||
      { echo "zero_lm: $v failed:" >&2; tail -5 "$tmp/err" >&2; exit 1; }
    echo "  round $r: $v done" >&2
  done
done
$py - "$tmp" "$model" "$steps" "$context" "$batch" "$rounds" $runs <<'PY'
import json, os, statistics, sys
tmp, model, steps, context, batch, rounds, names = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), \
    int(sys.argv[5]), int(sys.argv[6]), sys.argv[7:]
all_runs = {v: [json.load(open(os.path.join(tmp, f"{v}.{r}.json"))) for r in range(1, rounds + 1)] for v in names}
runs = {v: js[0] for v, js in all_runs.items()}
step_s = {v: statistics.median(j["train_s"] / steps for j in js) for v, js in all_runs.items()}
peak = {v: max(j["worker_peak_rss_mib"] for j in js) for v, js in all_runs.items()}
def metric(j, key):
    for where in (j, j.get("train_metrics", {}), j.get("metrics", {})):
        if isinstance(where, dict) and key in where:
            return where[key]
    return float("nan")
first = runs[names[0]]
params = metric(first, "parameters")
print(f"\n#### {model}, AdamW, 2 workers x 1 thread, {batch // 2} x {context} tokens per worker and step "
      f"({steps} steps; medians of {rounds} interleaved rounds)\n")
print("| run | peak RSS per worker, MiB | optimizer state MB | gradients MB | parameters MB | s/step "
      "| s/step / first | saved MiB against the first (formula, ZeRO only) |")
print("|---|---|---|---|---|---|---|---|")
base_rss, base_s = peak[names[0]], step_s[names[0]]
for v, j in runs.items():
    z = int(v.rstrip("ac"))
    rss, s = peak[v], step_s[v]
    formula = {0: 0, 1: 8, 2: 12, 3: 16}[z] * params / 2 / 2**20 if params == params else float("nan")
    label = f"zero {z}" + (" + activation checkpointing" if v.endswith("ac") else "")
    print(f"| {label} | {rss:.0f} | {metric(j, 'optimizer_state_bytes') / 1e6:.1f} "
          f"| {metric(j, 'gradient_bytes') / 1e6:.1f} | {metric(j, 'parameter_bytes') / 1e6:.1f} | {s:.2f} "
          f"| {s / base_s:.3f} | {base_rss - rss:.0f} ({formula:.0f}) |")
print("runs, s/step: " + "; ".join(f"{v} " + " ".join(f"{j['train_s'] / steps:.2f}" for j in js)
                                   for v, js in all_runs.items()))
if os.environ.get("RESULTS_JSON"):
    json.dump(all_runs, open(os.environ["RESULTS_JSON"], "w"), indent=2)
PY
# PyTorch's FSDP beside it, where Debian's python3-torch can run it.
if fsdp_error=$($py -c 'import torch.distributed.fsdp' 2>&1); then
  echo "PyTorch FSDP imports here: a side-by-side run is still to be written (bench/peers/)"
else
  echo "PyTorch FSDP (python3-torch $($py -c 'import torch; print(torch.__version__)')): cannot run here:" \
    "'import torch.distributed.fsdp' fails with: $(echo "$fsdp_error" | tail -1)"
fi
