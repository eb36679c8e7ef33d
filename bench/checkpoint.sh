#!/usr/bin/env bash
# Sharded checkpoints against the disk they land on (docs/CHECKPOINTS.md), in one run: the
# disk's own write and read bandwidth (dd, fsynced), then dsgd's save (every worker writing its
# share, the driver the manifest) and load (every worker reading what it needs) of gpt-base with
# AdamW on 2 workers, then Python's torch.save and torch.load of the same bytes; then periodic
# checkpoints (--checkpoint-dir, one every 10 steps, written by the workers in the background)
# against the same steps without: step time, training's wait per checkpoint, the driver's peak
# RSS. Prints the ratios.
#
#   bench/checkpoint.sh [MODEL] [DIR]      (gpt-base; a directory on the disk to measure, build/ckpt-bench)
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-gpt-base}
dir=${2:-build/ckpt-bench}
dsgd=${DSGD:-build/dsgd}
py=/usr/bin/python3
[ -x "$dsgd" ] || { echo "checkpoint: $dsgd not built (make build)"; exit 1; }
rm -rf "$dir" && mkdir -p "$dir"
trap 'rm -rf "$dir"' EXIT
lm=build/lm-bench
[ -f $lm/train.tok ] || $dsgd prepare-text --out $lm >/dev/null
drop() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null && echo cold || echo warm; }
mbps() { $py -c "import sys; print(f'{float(sys.argv[1]) / float(sys.argv[2]) / 1e6:.0f}')" "$@"; }

# The disk: 1 GiB written with fsync (direct I/O where the file system allows), then read.
direct=oflag=direct
dd if=/dev/zero of="$dir/dd" bs=64M count=1 $direct 2>/dev/null || direct=
t0=$(date +%s.%N); dd if=/dev/zero of="$dir/dd" bs=64M count=16 conv=fsync $direct 2>/dev/null; t1=$(date +%s.%N)
dd_write=$(mbps $((1 << 30)) "$($py -c "print($t1 - $t0)")")
cache=$(drop)
t0=$(date +%s.%N); dd if="$dir/dd" of=/dev/null bs=64M 2>/dev/null; t1=$(date +%s.%N)
dd_read=$(mbps $((1 << 30)) "$($py -c "print($t1 - $t0)")")
rm -f "$dir/dd"

run() {  # the job's debug log, for the driver's own timings of its save or load
  DSGD_LOG_LEVEL=debug OMP_NUM_THREADS=1 $dsgd train --model "$model" --dataset "text:$lm" --workers 2 --threads 1 \
    --batch-size 2 --config '{"context": 128, "val_sequences": 2}' --no-eval --quiet "$@" 2>&1 >/dev/null
}
run --max-steps 2 --save "$dir/ckpt" >"$dir/save.log"
save_line=$(grep -m1 "trainer: saved $dir/ckpt" "$dir/save.log") || { tail -20 "$dir/save.log"; exit 1; }
bytes=$(du -bc "$dir"/ckpt/* | tail -1 | cut -f1)  # the shares, model.pt and the manifest
save_s=$(echo "$save_line" | sed -E 's/.*\) in ([0-9.]+) s:.*/\1/')
cache_load=$(drop)
run --max-steps 3 --load "$dir/ckpt" >"$dir/load.log"
load_line=$(grep -m1 "trainer: loaded $dir/ckpt" "$dir/load.log") || { tail -20 "$dir/load.log"; exit 1; }
read_bytes=$(echo "$load_line" | sed -E 's/.*\(([0-9]+) bytes read.*/\1/')
load_s=$(echo "$load_line" | sed -E 's/.*read ([0-9.]+) s,.*/\1/')

# torch.save / torch.load of as many bytes in one process, fsynced.
read -r ts_save ts_load < <($py - "$dir" "$bytes" <<'PY'
import os, sys, time, torch
d, n = sys.argv[1], int(sys.argv[2])
state = {f"t{i}": torch.rand(n // 4 // 64) for i in range(64)}
t0 = time.time()
with open(f"{d}/ts.pt", "wb") as f:
    torch.save(state, f); f.flush(); os.fsync(f.fileno())
t1 = time.time()
os.system("sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null")
t2 = time.time(); torch.load(f"{d}/ts.pt"); t3 = time.time()
print(t1 - t0, t3 - t2)
PY
)
echo
echo "#### Sharded checkpoint of $model, AdamW, 2 workers ($bytes bytes with model.pt; reads $cache_load)"
echo
echo "| | seconds | MB/s | against the disk (dd) |"
echo "|---|---|---|---|"
echo "| dd write, 1 GiB, fsync ${direct:+(direct)} | | $dd_write | 1.00 |"
echo "| dd read, 1 GiB ($cache) | | $dd_read | 1.00 |"
sw=$(mbps "$bytes" "$save_s"); lr=$(mbps "$read_bytes" "$load_s")
echo "| dsgd save (the driver's call: shares and model.pt written by the workers, fsynced, committed) | $save_s | $sw | $($py -c "print(f'{$sw / $dd_write:.2f}')") |"
echo "| dsgd load ($read_bytes bytes read by the workers) | $load_s | $lr | $($py -c "print(f'{$lr / $dd_read:.2f}')") |"
tw=$(mbps "$bytes" "$ts_save"); tr=$(mbps "$bytes" "$ts_load")
echo "| torch.save, one process | $(printf %.3f "$ts_save") | $tw | $($py -c "print(f'{$tw / $dd_write:.2f}')") |"
echo "| torch.load, one process | $(printf %.3f "$ts_load") | $tr | $($py -c "print(f'{$tr / $dd_read:.2f}')") |"

# Periodic checkpoints: the same 40 steps with and without one every 10 (both runs snapshot on
# the same policy); the driver's RSS sampled every 0.2 s.
periodic() {  # OUT_JSON [ARGS...] -> prints the driver's peak RSS in MiB
  local out=$1; shift
  DSGD_LOG_LEVEL=info OMP_NUM_THREADS=1 $dsgd train --model "$model" --dataset "text:$lm" --workers 2 --threads 1 \
    --batch-size 2 --config '{"context": 128, "val_sequences": 2}' --no-eval --quiet --max-steps 40 \
    --checkpoint-every 10 --json-out "$out" "$@" >/dev/null 2>"$out.log" &
  local pid=$! peak=0 rss
  while kill -0 $pid 2>/dev/null; do
    rss=$(ps -o rss= -p $pid 2>/dev/null || echo 0); rss=${rss// /}
    [ -n "$rss" ] && [ "$rss" -gt "$peak" ] && peak=$rss
    sleep 0.2
  done
  wait $pid || { tail -20 "$out.log" >&2; exit 1; }
  echo $((peak / 1024))
}
rss_without=$(periodic "$dir/without.json")
rss_with=$(periodic "$dir/with.json" --checkpoint-dir "$dir/ckpts" --keep-checkpoints 2)
read -r step_without step_with wait_median wait_max count behind < <($py - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
a, b = (json.load(open(f"{d}/{n}.json")) for n in ("without", "with"))
c = b.get("checkpoints", {})
print(a["train_s"] / a["steps"], b["train_s"] / b["steps"], c.get("wait_s_median", -1), c.get("wait_s_max", -1),
      c.get("count", 0), c.get("behind", 0))
PY
)
echo
echo "#### Periodic checkpoints of $model: 40 steps, one every 10, by the workers in the background"
echo
echo "| | step s | against no checkpoints | training's wait per checkpoint (median, max) | driver's peak RSS MiB |"
echo "|---|---|---|---|---|"
echo "| no checkpoint dir | $(printf %.3f "$step_without") | 1.00 | | $rss_without |"
echo "| --checkpoint-dir, every 10 steps ($count checkpoints, $behind waited for the last write) | $(printf %.3f "$step_with") | $($py -c "print(f'{$step_with / $step_without:.3f}')") | $(printf '%.3f, %.3f' "$wait_median" "$wait_max") s | $rss_with |"
