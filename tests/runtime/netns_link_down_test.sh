#!/usr/bin/env bash
# A worker's network is cut mid-training: one worker joins from a network namespace, one from the
# root namespace; a few seconds into training the namespace's link goes down. The driver must
# evict the cut-off worker within the heartbeat timeout, name it, and finish training with the
# other; the cut-off worker must exit by itself (it cannot reach the driver). Creates and removes
# its namespace and link itself (also when interrupted). Exit 77 (skip) when namespaces cannot be
# made here. Usage: netns_link_down_test.sh DSGD_BINARY
set -euo pipefail
dsgd=$1
source "$(dirname "$0")/netns.sh"
netns_up

"$dsgd" train --workers 2 --listen "$host_ip:0" --token "tok-$id" --model mlp --dataset synthetic \
  --synthetic-samples 4096 --epochs 4 --batch-size 32 --threads 1 --no-eval \
  --heartbeat-timeout-ms 2000 --checkpoint-every 20 --checkpoint-overhead 0 \
  --json-out "$tmp/run.json" >"$tmp/driver.out" 2>"$tmp/driver.err" &
driver=$!
pids+=("$driver")
wait_for_driver_address "$tmp/driver.err"

ip netns exec "$ns" "$dsgd" worker --driver "$address" --token "tok-$id" --host-id remote-host \
  >"$tmp/remote.out" 2>&1 &
remote=$!
pids+=("$remote")
DSGD_TOKEN="tok-$id" "$dsgd" worker --driver "$address" --host-id local-host >"$tmp/local.out" 2>&1 &
pids+=("$!")

# Cut the link once training is under way (setup takes 2-3 s; an epoch about 10).
sleep 6
ip -n "$ns" link set "$ns_if" down
cut=$(date +%s.%N)
echo "link cut"

if ! wait "$driver"; then
  echo "FAIL: the driver failed"; cat "$tmp/driver.err" "$tmp/remote.out" "$tmp/local.out"; exit 1
fi
grep -q "lost worker [0-9]* (host [^,]*, pid $remote, silent)" "$tmp/driver.err" || {
  echo "FAIL: the driver did not name the cut-off worker"; cat "$tmp/driver.err"; exit 1; }
grep "recovered in" "$tmp/driver.err" | tail -1
# The cut-off worker cannot reach the driver: it must exit by itself within its heartbeat timeout.
for _ in $(seq 150); do
  kill -0 "$remote" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$remote" 2>/dev/null; then
  echo "FAIL: the cut-off worker is still running 15 s later"; exit 1
fi
gone=$(date +%s.%N)
echo "the cut-off worker exited $(echo "$gone - $cut" | bc 2>/dev/null || echo '?') s after the cut (at most)"
/usr/bin/python3 - "$tmp/run.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["epochs"] == 4, r["epochs"]
assert r["steps"] == 4 * 4096 // 32, r["steps"]
print(f"PASS: training finished all {r['steps']} steps after the link went down")
PY
