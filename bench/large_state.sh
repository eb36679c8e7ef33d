#!/usr/bin/env bash
# Recovery and checkpoints at a large state: gpt-base (86M parameters at byte vocabulary; with
# AdamW 1.03 GB of parameters and state) on 2 workers x 1 thread with one standby, a snapshot and
# a --checkpoint-dir checkpoint every 4 steps, one training worker killed (-9) after the step-8
# checkpoint, --save at the end; then a second job that --loads that save. Prints, from the
# driver's debug log and the JSON summary: each snapshot's and checkpoint write's seconds, the
# kill-to-resumed time (the kill here to the driver's resumed_at_unix_s), the recovery's phases
# and rolled-back steps, and the save's and load's seconds. ZERO=N runs the job at --zero N;
# KEEP_TMP=DIR keeps its files (logs, JSON, checkpoints: gigabytes) in DIR.
# About 5 minutes.
#   bench/large_state.sh [STEPS=14] [MODEL=gpt-base]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-14}
model=${2:-gpt-base}
dsgd=${DSGD:-build/dsgd}
py=/usr/bin/python3
[ -x "$dsgd" ] || { echo "large_state: $dsgd not built (make build)"; exit 1; }
tmp=${KEEP_TMP:-$(mktemp -d)}
job=
cleanup() { [ -n "$job" ] && kill "$job" 2>/dev/null; [ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"; }
trap cleanup EXIT
dir=build/lm-bench
[ -f $dir/train.tok ] || $dsgd prepare-text --out $dir >/dev/null
common=(--model "$model" --dataset "text:$dir" --workers 2 --threads 1 --batch-size 4 --no-eval --quiet
        --config '{"context": 256, "val_sequences": 8}' --zero "${ZERO:-0}")
DSGD_LOG_LEVEL=debug OMP_NUM_THREADS=1 $dsgd train "${common[@]}" --standby 1 --max-steps "$steps" \
  --checkpoint-every 4 --checkpoint-overhead 0 --checkpoint-dir "$tmp/ck" --save "$tmp/final" \
  --json-out "$tmp/run.json" >/dev/null 2>"$tmp/log" &
job=$!
# After the step-8 checkpoint, and a second into the next step: the busiest child is training.
ck8=$(printf "%s/ck/step-%012d" "$tmp" 8)
for _ in $(seq 1200); do [ -d "$ck8" ] && break; kill -0 "$job" 2>/dev/null || break; sleep 0.5; done
[ -d "$ck8" ] || { echo "large_state: no step-8 checkpoint"; tail -5 "$tmp/log"; exit 1; }
sleep 1
victim=$(ps -o pid=,pcpu= --ppid "$job" | sort -k2 -nr | head -1 | awk '{print $1}')
kill_t=$(date +%s.%N)
kill -9 "$victim"
wait "$job" || { echo "large_state: the job failed"; tail -5 "$tmp/log"; exit 1; }
job=
DSGD_LOG_LEVEL=debug OMP_NUM_THREADS=1 $dsgd train "${common[@]}" --load "$tmp/final" --max-steps $((steps + 1)) \
  --json-out "$tmp/load.json" >/dev/null 2>"$tmp/loadlog" || { echo "large_state: the load failed"; exit 1; }
$py - "$tmp" "$kill_t" "$model" "${ZERO:-0}" <<'PY'
import json, os, re, statistics, sys
tmp, kill_t, model, zero = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
log = open(os.path.join(tmp, "log")).read()
loadlog = open(os.path.join(tmp, "loadlog")).read()
run = json.load(open(os.path.join(tmp, "run.json")))
snaps = [(int(b), float(s)) for b, s in re.findall(r"snapshot of (\d+) bytes in ([\d.]+) s", log)]
handed = [float(s) for s in re.findall(r"checkpoint of step \d+ handed to its writer in ([\d.]+) s", log)]
ckpts = [float(s) for s in re.findall(r"checkpoint \S+ written in ([\d.]+) s", log)]
save = re.search(r"saved \S+ \((\d+) bytes of state\) in ([\d.]+) s: read ([\d.]+) s, written ([\d.]+) s", log)
load = re.search(r"loaded \S+ \((\d+) bytes of state\) in ([\d.]+) s: read ([\d.]+) s, sent (?:to the workers )?([\d.]+) s", loadlog)
print(f"\n#### {model}, AdamW, zero {zero}: {run['parameters'] / 1e6:.1f}M parameters, 2 workers x 1 thread, "
      f"one standby\n")
print("| what | seconds | notes |")
print("|---|---|---|")
if snaps:
    print(f"| snapshot (driver reads the state) | {statistics.median(s for _, s in snaps):.2f} median, "
          f"{max(s for _, s in snaps):.2f} max | {len(snaps)} of {snaps[-1][0] / 1e6:.0f} MB |")
if handed:
    print(f"| checkpoint (--checkpoint-dir): training waits | {statistics.median(handed):.2f} median, "
          f"{max(handed):.2f} max | {len(handed)}: model.pt read from a worker, the write handed to a thread |")
if ckpts:
    print(f"| checkpoint (--checkpoint-dir): written meanwhile | {statistics.median(ckpts):.2f} median, "
          f"{max(ckpts):.2f} max | {len(ckpts)} |")
for ev in run["recoveries"]:
    if ev.get("kind") != "recovery":
        continue
    phases = ", ".join(f"{k} {v:.2f}" for k, v in ev.get("phases_s", {}).items())
    print(f"| kill to resumed | {ev['resumed_at_unix_s'] - kill_t:.2f} | recovery_s {ev['recovery_s']:.2f} "
          f"({phases}); {ev.get('rolled_back_steps', 0)} steps rolled back, caught up "
          f"{ev.get('caught_up_s', 0):.2f} s; from a peer: {ev.get('from_peer', False)} |")
for who, n, way, s in re.findall(
        r"worker (\d+): state of (\d+) bytes (sent|received and loaded|passed) over the group in ([\d.]+) s", log):
    print(f"| worker {who}: state {way} over the group | {float(s):.2f} | {int(n) / 1e6:.0f} MB |")
if save:
    print(f"| save (--save) | {float(save.group(2)):.2f} | state read {float(save.group(3)):.2f}, written "
          f"{float(save.group(4)):.2f}; {int(save.group(1)) / 1e6:.0f} MB |")
if load:
    print(f"| load (--load) | {float(load.group(2)):.2f} | read {float(load.group(3)):.2f}, sent to the workers "
          f"{float(load.group(4)):.2f} |")
PY
