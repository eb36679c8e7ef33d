#!/usr/bin/env bash
# dsgd against its peers on this machine, side by side in one run (the machine is shared and
# noisy: only ratios within a run mean anything). Same data (Fashion-MNIST), optimizer (SGD,
# momentum 0.9), per-worker batch and 1 thread per process everywhere.
#   bench/train_peers.sh [STEPS] [REPEATS] [EPOCHS]     (defaults: 200 steps, 2 repeats, 5 epochs)
# 1. Throughput, two workloads: the CNN with 64 samples per worker (compute-bound) and the MLP
#    784-2048-2048-10 with 32 (communication-bound: 23 MB of gradients per step). Rows: plain
#    single-process LibTorch (`dsgd train --in-process`: no dsgd communication) at 1 and 2
#    threads; dsgd allreduce and simple with 1 and 2 workers; PyTorch DDP (gloo) with world size
#    1 and 2 (bench/peers/ddp_train.py on Debian's /usr/bin/python3). STEPS steps each, the
#    configurations interleaved REPEATS times; medians.
# 2. Time to accuracy: the CNN with 2 workers (global batch 128, lr 0.02 x 0.7 per epoch, as
#    `make demo`), dsgd allreduce against DDP, EPOCHS epochs, test accuracy after each; training
#    seconds (evaluation excluded) until 85% and 90%.
# Prints markdown tables; RESULTS_JSON=FILE also writes every measurement. WORKLOADS="cnn" runs
# one workload only; EPOCHS 0 leaves out the time-to-accuracy pair (for repeated throughput runs);
# SYSTEMS="plain-1t dsgd-allreduce-1w" keeps only the rows named (e.g. for one ratio, repeated).
# PRECISIONS="fp32 bf16" adds each workload's dsgd allreduce and DDP rows at 1 and 2 workers under
# bf16 autocast (`--precision bf16`; DDP: torch.autocast("cpu", bfloat16)), named *-bf16, beside
# the float32 rows: bf16's speed-up for both systems, measured in the same run.
# The one-core rows (1 thread, 1 worker, world size 1: every process of the row, dsgd's driver
# included) run on one and the same core, the last this script may use: left to the scheduler,
# plain LibTorch started from a shell stayed on one core and dsgd's worker, spawned by its
# driver, landed on either, and on this shared machine the two cores' speeds differ from minute
# to minute. PIN=0 leaves them unpinned.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-200}
repeats=${2:-2}
epochs=${3:-5}
dsgd=${DSGD:-build/dsgd}
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
[ -x "$dsgd" ] || { echo "train_peers: $dsgd not built (make build)"; exit 1; }
$py -c 'import torch' 2>/dev/null || { echo "train_peers: $py has no torch (scripts/install-deps.sh installs python3-torch)"; exit 1; }

# name|workload|command (per-worker batch: cnn 64, mlp 32)
configs=()
workloads=${WORKLOADS:-cnn mlp}
for w in $workloads; do
  case $w in cnn | mlp) ;; *) echo "train_peers: WORKLOADS has '$w'; use cnn, mlp or both" >&2; exit 2 ;; esac
  b=64; [ "$w" = mlp ] && b=32
  common="--model $w --max-steps $steps --no-eval --quiet --momentum 0.9"
  configs+=(
    "plain-1t|$w|$dsgd train --in-process --threads 1 --batch-size $b $common"
    "plain-2t|$w|$dsgd train --in-process --threads 2 --batch-size $b $common"
    "dsgd-allreduce-1w|$w|$dsgd train --workers 1 --strategy allreduce --threads 1 --batch-size $b $common"
    "dsgd-allreduce-2w|$w|$dsgd train --workers 2 --strategy allreduce --threads 1 --batch-size $((2 * b)) $common"
    "dsgd-simple-1w|$w|$dsgd train --workers 1 --strategy simple --threads 1 --batch-size $b $common"
    "dsgd-simple-2w|$w|$dsgd train --workers 2 --strategy simple --threads 1 --batch-size $((2 * b)) $common"
    "ddp-1w|$w|$py bench/peers/ddp_train.py --world-size 1 --model $w --batch-size $b --max-steps $steps --no-eval --threads 1"
    "ddp-2w|$w|$py bench/peers/ddp_train.py --world-size 2 --model $w --batch-size $b --max-steps $steps --no-eval --threads 1"
  )
  for p in ${PRECISIONS:-fp32}; do
    case $p in fp32) continue ;; bf16) ;; *) echo "train_peers: PRECISIONS has '$p'; use fp32, bf16" >&2; exit 2 ;; esac
    configs+=(
      "dsgd-allreduce-1w-$p|$w|$dsgd train --workers 1 --strategy allreduce --threads 1 --batch-size $b --precision $p $common"
      "dsgd-allreduce-2w-$p|$w|$dsgd train --workers 2 --strategy allreduce --threads 1 --batch-size $((2 * b)) --precision $p $common"
      "ddp-1w-$p|$w|$py bench/peers/ddp_train.py --world-size 1 --model $w --batch-size $b --max-steps $steps --no-eval --threads 1 --precision $p"
      "ddp-2w-$p|$w|$py bench/peers/ddp_train.py --world-size 2 --model $w --batch-size $b --max-steps $steps --no-eval --threads 1 --precision $p"
    )
  done
done
if [ -n "${SYSTEMS:-}" ]; then
  rows=" "
  for c in "${configs[@]}"; do [[ "$rows" == *" ${c%%|*} "* ]] || rows+="${c%%|*} "; done
  for want in $SYSTEMS; do
    [[ "$rows" == *" $want "* ]] || { echo "train_peers: SYSTEMS names '$want', not a row; rows:$rows" >&2; exit 2; }
  done
  kept=()
  for c in "${configs[@]}"; do
    if [[ " $SYSTEMS " == *" ${c%%|*} "* ]]; then kept+=("$c"); fi
  done
  configs=("${kept[@]}")
fi

pin=()
if [ "${PIN:-1}" != 0 ]; then
  command -v taskset >/dev/null || { echo "train_peers: taskset (util-linux) not found; PIN=0 runs unpinned" >&2; exit 1; }
  cpu=$(taskset -pc $$ | sed 's/.*: //' | tr ',' '\n' | tail -1 | sed 's/.*-//')
  pin=(taskset -c "$cpu")
fi

echo "train_peers: ${#configs[@]} throughput runs x $repeats$( ((epochs > 0)) && echo ", then time to accuracy ($epochs epochs x 2)")" >&2
for r in $(seq "$repeats"); do
  for c in "${configs[@]}"; do
    IFS='|' read -r name workload cmd <<<"$c"
    out="$tmp/$workload.$name.$r.json"
    prefix=()
    case $name in *-1t | *-1w | *-1w-*) prefix=("${pin[@]}") ;; esac
    # shellcheck disable=SC2086
    if ! OMP_NUM_THREADS=1 "${prefix[@]}" $cmd --json-out "$out" >/dev/null 2>"$tmp/err"; then
      echo "train_peers: $workload $name failed:" >&2; tail -5 "$tmp/err" >&2; exit 1
    fi
    echo "  $workload $name (repeat $r): $($py -c "import json;print(round(json.load(open('$out'))['samples_per_s']))") samples/s" >&2
  done
done

if [ "$epochs" -gt 0 ]; then
tta_common="--model cnn --epochs $epochs --lr 0.02 --lr-decay 0.7 --momentum 0.9 --threads 1"
OMP_NUM_THREADS=1 $dsgd train --workers 2 --strategy allreduce --batch-size 128 $tta_common --quiet \
  --json-out "$tmp/tta.dsgd.json" >/dev/null 2>"$tmp/err" || { tail -5 "$tmp/err" >&2; exit 1; }
echo "  time to accuracy: dsgd done" >&2
OMP_NUM_THREADS=1 $py bench/peers/ddp_train.py --world-size 2 --batch-size 64 --model cnn --epochs "$epochs" \
  --lr 0.02 --lr-decay 0.7 --momentum 0.9 --threads 1 --json-out "$tmp/tta.ddp.json" >/dev/null 2>"$tmp/err" ||
  { tail -5 "$tmp/err" >&2; exit 1; }
echo "  time to accuracy: ddp done" >&2
fi

$py - "$tmp" "$steps" "$repeats" "$epochs" <<'PY'
import glob, json, os, statistics, sys
tmp, steps, repeats, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
runs = {}
for f in glob.glob(os.path.join(tmp, "*.*.*.json")):
    base = os.path.basename(f)
    if base.startswith("tta."):
        continue
    workload, name, _r, _ = base.split(".")
    runs.setdefault((workload, name), []).append(json.load(open(f))["samples_per_s"])
med = {k: statistics.median(v) for k, v in runs.items()}
order = ["plain-1t", "plain-2t", "dsgd-allreduce-1w", "dsgd-allreduce-2w", "dsgd-simple-1w", "dsgd-simple-2w",
         "ddp-1w", "ddp-2w", "dsgd-allreduce-1w-bf16", "dsgd-allreduce-2w-bf16", "ddp-1w-bf16", "ddp-2w-bf16"]
targets = {"cnn": 1.08, "mlp": 1.4}
out = {"steps": steps, "repeats": repeats, "throughput": {}, "time_to_accuracy": {}}
for w, label in (("cnn", "CNN, 64 samples per worker"), ("mlp", "MLP 784-2048-2048-10, 32 samples per worker")):
    if (w, "plain-1t") not in med:
        continue
    print(f"\n#### Throughput: {label} ({steps} steps, median of {repeats})\n")
    print("| system | samples/s | vs plain 1 thread | vs DDP same workers | runs |")
    print("|---|---|---|---|---|")
    for n in order:
        if (w, n) not in med:
            continue
        v = med[(w, n)]
        workers = "2" if "-2w" in n else "1"
        precision = "-bf16" if n.endswith("-bf16") else ""
        ddp = med.get((w, f"ddp-{workers}w{precision}"))
        vs_ddp = f"{v / ddp:.2f}x" if ddp and n.startswith("dsgd") else ""
        print(f"| {n} | {v:.0f} | {v / med[(w, 'plain-1t')]:.2f}x | {vs_ddp} | {', '.join(f'{x:.0f}' for x in sorted(runs[(w, n)]))} |")
    out["throughput"][w] = {n: {"median": med[(w, n)], "runs": runs[(w, n)]} for n in order if (w, n) in med}
    # Each target whose rows this run has (SYSTEMS may have left some out).
    a1, a2, d2, p2 = (med.get((w, n)) for n in ("dsgd-allreduce-1w", "dsgd-allreduce-2w", "ddp-2w", "plain-2t"))
    found = []
    if a2 and d2:
        found.append(f"Target for dsgd allreduce 2 workers: >= {targets[w]}x DDP 2 workers; measured {a2 / d2:.2f}x")
    if a2 and p2:
        found.append(f"against one process with 2 threads: {a2 / p2:.2f}x")
    if a1:
        found.append(f"1 worker against plain LibTorch: {a1 / med[(w, 'plain-1t')]:.3f}x")
    for sysname in ("dsgd-allreduce", "ddp"):  # bf16 against float32, the same system and workers
        for k in ("1w", "2w"):
            f32, b16 = med.get((w, f"{sysname}-{k}")), med.get((w, f"{sysname}-{k}-bf16"))
            if f32 and b16:
                found.append(f"{sysname} {k[0]} worker(s) bf16 against fp32: {b16 / f32:.2f}x")
    if found:
        line = "; ".join(found)
        print("\n" + line[0].upper() + line[1:] + ".")

def reach(history, key, level):
    t = 0.0
    for e in history:
        t = e["train_s"] if "train_s" in e else t + e["epoch_s"]
        if e.get(key, -1) >= level:
            return t, e["epoch"]
    return None, None

if epochs == 0:
    if os.environ.get("RESULTS_JSON"):
        json.dump(out, open(os.environ["RESULTS_JSON"], "w"), indent=2)
    sys.exit(0)
print(f"\n#### Time to accuracy: CNN, 2 workers, global batch 128, {epochs} epochs\n")
print("| system | 85% after (s, epoch) | 90% after (s, epoch) | final accuracy | samples/s |")
print("|---|---|---|---|---|")
for name, f in (("dsgd-allreduce-2w", "tta.dsgd.json"), ("ddp-2w", "tta.ddp.json")):
    r = json.load(open(os.path.join(tmp, f)))
    cells = []
    for level in (0.85, 0.90):
        t, e = reach(r["history"], "test_accuracy", level)
        cells.append(f"{t:.0f} s (epoch {e})" if t is not None else "not reached")
    print(f"| {name} | {cells[0]} | {cells[1]} | {r['test_accuracy']:.4f} | {r['samples_per_s']:.0f} |")
    out["time_to_accuracy"][name] = {"history": r["history"], "test_accuracy": r["test_accuracy"],
                                     "samples_per_s": r["samples_per_s"], "to_90": reach(r["history"], "test_accuracy", 0.90)[0]}
d90, p90 = out["time_to_accuracy"]["dsgd-allreduce-2w"]["to_90"], out["time_to_accuracy"]["ddp-2w"]["to_90"]
if d90 is not None and p90 is not None:
    print(f"\nTarget for time to 90%: <= 0.9x DDP's; measured {d90 / p90:.2f}x ({d90:.0f} s against {p90:.0f} s).")
else:
    missing = " and ".join(n for n, t in (("dsgd", d90), ("DDP", p90)) if t is None)
    print(f"\nTarget for time to 90%: <= 0.9x DDP's; not measurable in {epochs} epochs: {missing} did not reach 90%"
          + (f" (dsgd after {d90:.0f} s)" if d90 is not None else "") + ".")
if os.environ.get("RESULTS_JSON"):
    json.dump(out, open(os.environ["RESULTS_JSON"], "w"), indent=2)
PY
