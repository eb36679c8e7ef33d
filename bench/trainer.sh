#!/usr/bin/env bash
# Trainer throughput against the single process measured in the same run. Configurations run
# interleaved, REPEATS times each (the machine is shared and noisy); prints medians and ratios as
# a markdown table.
#   bench/trainer.sh [STEPS] [REPEATS] [SET]        (defaults: 300 steps, 3 repeats, set "strategies")
# SET strategies: the CNN, 64 samples per replica: in-process at 1 and 2 threads; 1 and 2 workers
#   (1 thread each) for simple, allreduce and ps; allreduce with 1 MB buckets with and without
#   overlapping backward.
# SET ps: the MLP 784-2048-2048-10 (23 MB of gradients), 32 samples per replica, 4 MB buckets,
#   2 workers on 2 pseudo-hosts (--local-hosts 2: the exchange between them goes over Gloo as
#   between machines): allreduce against ps with 1 and 2 shards, pipelined and not, averaging
#   on the shards or applying SGD there (--ps-update-on-shards), and asynchronous (ps_async);
#   shards in the workers (BytePS's placement) and in processes of their own (--ps-placement
#   processes: Ray's), one per pseudo-host.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-300}
repeats=${2:-3}
set=${3:-strategies}
dsgd=${DSGD:-build/dsgd}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

case "$set" in
strategies)
  model=cnn
  configs=(
    "in-process-1t|--in-process --threads 1 --batch-size 64"
    "in-process-2t|--in-process --threads 2 --batch-size 64"
    "allreduce-1w|--workers 1 --strategy allreduce --threads 1 --batch-size 64"
    "allreduce-2w|--workers 2 --strategy allreduce --threads 1 --batch-size 128"
    "simple-1w|--workers 1 --strategy simple --threads 1 --batch-size 64"
    "simple-2w|--workers 2 --strategy simple --threads 1 --batch-size 128"
    "ps-2w|--workers 2 --strategy ps --threads 1 --batch-size 128"
    "allreduce-2w-1MB-overlap|--workers 2 --strategy allreduce --threads 1 --batch-size 128 --grad-shard-bytes 1000000"
    "allreduce-2w-1MB-no-overlap|--workers 2 --strategy allreduce --threads 1 --batch-size 128 --grad-shard-bytes 1000000 --no-overlap"
  ) ;;
ps)
  model=mlp
  two="--workers 2 --threads 1 --batch-size 64 --grad-shard-bytes 4000000 --local-hosts 2"
  configs=(
    "in-process-1t|--in-process --threads 1 --batch-size 32"
    "allreduce-2w-1host|--workers 2 --strategy allreduce --threads 1 --batch-size 64 --grad-shard-bytes 4000000"
    "allreduce-2w-2hosts|$two --strategy allreduce"
    "ps-1shard-2hosts|$two --strategy ps --ps-shards 1"
    "ps-2shards-2hosts|$two --strategy ps --ps-shards 2"
    "ps-2shards-2hosts-no-overlap|$two --strategy ps --ps-shards 2 --no-overlap"
    "ps-1shard-2hosts-processes|$two --strategy ps --ps-shards 1 --ps-placement processes"
    "ps-2shards-2hosts-processes|$two --strategy ps --ps-shards 2 --ps-placement processes"
    "ps-2shards-2hosts-processes-update-on-shards|$two --strategy ps --ps-shards 2 --ps-placement processes --ps-update-on-shards"
    "ps-2shards-2hosts-update-on-shards|$two --strategy ps --ps-shards 2 --ps-update-on-shards"
    "ps_async-2shards-2hosts|$two --strategy ps_async --ps-shards 2"
    "ps-2shards-1host|--workers 2 --strategy ps --threads 1 --batch-size 64 --grad-shard-bytes 4000000 --ps-shards 2"
  ) ;;
*) echo "trainer.sh: unknown set '$set' (strategies or ps)"; exit 2 ;;
esac
common=(--model "$model" --max-steps "$steps" --no-eval --quiet)
for r in $(seq "$repeats"); do
  for c in "${configs[@]}"; do
    name=${c%%|*}
    # shellcheck disable=SC2086
    "$dsgd" train "${common[@]}" ${c#*|} --json-out "$tmp/$name-$r.json" >/dev/null
  done
done

/usr/bin/python3 - "$tmp" "$steps" "$repeats" "$model" "${configs[@]}" <<'PY'
import json, statistics, sys
tmp, steps, repeats, model, configs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
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
what = "CNN (1.2M parameters)" if model == "cnn" else "MLP 784-2048-2048-10 (5.8M parameters)"
print(f"\n{steps} steps per run, {what}, Fashion-MNIST, SGD momentum 0.9, no evaluation;"
      " samples/s counts time inside train() only.")
PY
