#!/usr/bin/env bash
# Single-process training throughput: the baselines the distributed runtime is measured against.
# Runs `dsgd train` for each model at 1 and 2 threads, REPEATS times each, interleaved so machine
# noise hits every configuration alike, and prints the median samples/s as a markdown table
# with the ratio of 2 threads to 1.
#   bench/train_baseline.sh [STEPS] [REPEATS]        (defaults: 300 steps, 3 repeats)
# Needs a built tree (make build) and Fashion-MNIST (scripts/install-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-300}
repeats=${2:-3}
dsgd=${DSGD:-build/dsgd}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

declare -A batch=([cnn]=64 [mlp]=32)
for r in $(seq "$repeats"); do
  for model in cnn mlp; do
    for threads in 1 2; do
      "$dsgd" train --in-process --model "$model" --batch-size "${batch[$model]}" --threads "$threads" \
        --max-steps "$steps" --no-eval --quiet --json-out "$tmp/$model-$threads-$r.json" >/dev/null
    done
  done
done

/usr/bin/python3 - "$tmp" "$steps" "$repeats" <<'PY'
import json, statistics, sys, glob, os
tmp, steps, repeats = sys.argv[1], sys.argv[2], sys.argv[3]
def median(model, threads):
    runs = [json.load(open(f))["samples_per_s"] for f in glob.glob(f"{tmp}/{model}-{threads}-*.json")]
    return statistics.median(runs), runs
print(f"| model | batch | threads | samples/s (median of {repeats}) | runs | vs 1 thread |")
print("|---|---|---|---|---|---|")
for model, batch in (("cnn", 64), ("mlp", 32)):
    base, _ = median(model, 1)
    for threads in (1, 2):
        m, runs = median(model, threads)
        print(f"| {model} | {batch} | {threads} | {m:.0f} | {', '.join(f'{x:.0f}' for x in runs)} | {m / base:.2f}x |")
print(f"\n{steps} steps per run, Fashion-MNIST, SGD momentum 0.9, no evaluation.")
PY
