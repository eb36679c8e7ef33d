#!/usr/bin/env bash
# Trainer throughput: the CNN on Fashion-MNIST, 64 samples per replica per step, against the
# single process measured in the same run. Configurations run interleaved, REPEATS times each
# (the machine is shared and noisy); prints medians and ratios as a markdown table.
#   bench/trainer.sh [STEPS] [REPEATS]        (defaults: 300 steps, 3 repeats)
# Rows: in-process at 1 and 2 threads; 1 and 2 workers (1 thread each) for simple and
# allreduce; allreduce with 1 MB buckets with and without overlapping backward.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-300}
repeats=${2:-3}
dsgd=${DSGD:-build/dsgd}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

common=(--model cnn --max-steps "$steps" --no-eval --quiet)
configs=(
  "in-process-1t|--in-process --threads 1 --batch-size 64"
  "in-process-2t|--in-process --threads 2 --batch-size 64"
  "allreduce-1w|--workers 1 --strategy allreduce --threads 1 --batch-size 64"
  "allreduce-2w|--workers 2 --strategy allreduce --threads 1 --batch-size 128"
  "simple-1w|--workers 1 --strategy simple --threads 1 --batch-size 64"
  "simple-2w|--workers 2 --strategy simple --threads 1 --batch-size 128"
  "allreduce-2w-1MB-overlap|--workers 2 --strategy allreduce --threads 1 --batch-size 128 --grad-shard-bytes 1000000"
  "allreduce-2w-1MB-no-overlap|--workers 2 --strategy allreduce --threads 1 --batch-size 128 --grad-shard-bytes 1000000 --no-overlap"
)
for r in $(seq "$repeats"); do
  for c in "${configs[@]}"; do
    name=${c%%|*}
    # shellcheck disable=SC2086
    "$dsgd" train "${common[@]}" ${c#*|} --json-out "$tmp/$name-$r.json" >/dev/null
  done
done

/usr/bin/python3 - "$tmp" "$steps" "$repeats" "${configs[@]}" <<'PY'
import json, statistics, sys
tmp, steps, repeats, configs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
def runs(name):
    return [json.load(open(f"{tmp}/{name}-{r}.json"))["samples_per_s"] for r in range(1, int(repeats) + 1)]
base = statistics.median(runs("in-process-1t"))
print(f"| configuration | flags | samples/s (median of {repeats}) | runs | vs 1 process, 1 thread |")
print("|---|---|---|---|---|")
for c in configs:
    name, flags = c.split("|", 1)
    r = runs(name)
    m = statistics.median(r)
    print(f"| {name} | `{flags}` | {m:.0f} | {', '.join(f'{x:.0f}' for x in r)} | {m / base:.2f}x |")
print(f"\n{steps} steps per run, CNN (1.2M parameters), Fashion-MNIST, SGD momentum 0.9, no evaluation;"
      " samples/s counts time inside train() only.")
PY
