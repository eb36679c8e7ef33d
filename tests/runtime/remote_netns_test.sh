#!/usr/bin/env bash
# Remote mode across a network namespace: the driver listens on a veth address, one worker joins
# from inside a namespace (its own address, its own "host"), another from the root namespace;
# they train together over Gloo across the link. Also: a worker with a wrong token is refused.
# Creates and removes its namespace and link itself (also when interrupted). Exit 77 (skip) when
# namespaces cannot be made here. Usage: remote_netns_test.sh DSGD_BINARY
set -euo pipefail
dsgd=$1
source "$(dirname "$0")/netns.sh"
netns_up

"$dsgd" train --workers 2 --listen "$host_ip:0" --token "tok-$id" --model mlp --dataset synthetic \
  --synthetic-samples 2048 --image-size 8 --epochs 2 --batch-size 32 --threads 1 \
  --json-out "$tmp/run.json" >"$tmp/driver.out" 2>"$tmp/driver.err" &
driver=$!
pids+=("$driver")
wait_for_driver_address "$tmp/driver.err"
echo "driver at $address"

# A wrong token is refused and changes nothing.
if "$dsgd" worker --driver "$address" --token wrong --host-id intruder >"$tmp/intruder.out" 2>&1; then
  echo "FAIL: a worker with a wrong token was accepted"; exit 1
fi
grep -q "wrong or missing job token" "$tmp/intruder.out" || { echo "FAIL: no token error"; cat "$tmp/intruder.out"; exit 1; }

ip netns exec "$ns" "$dsgd" worker --driver "$address" --token "tok-$id" --host-id remote-host \
  >"$tmp/remote.out" 2>&1 &
pids+=("$!")
DSGD_TOKEN="tok-$id" "$dsgd" worker --driver "$address" --host-id local-host >"$tmp/local.out" 2>&1 &
pids+=("$!")

if ! wait "$driver"; then
  echo "FAIL: the driver failed"; cat "$tmp/driver.err" "$tmp/remote.out" "$tmp/local.out"; exit 1
fi
/usr/bin/python3 - "$tmp/run.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["workers"] == 2, r["workers"]
assert r["epochs"] == 2, r["epochs"]
assert r["test_accuracy"] > 0.2, r["test_accuracy"]   # 10 classes: chance is 0.1
print(f"PASS: 2 workers across the namespace link trained to {r['test_accuracy']:.3f} test accuracy")
PY
