#!/usr/bin/env bash
# Remote mode across a network namespace: the driver listens on a veth address, one worker joins
# from inside a namespace (its own address, its own "host"), another from the root namespace;
# they train together over Gloo across the link. Also: a worker with a wrong token is refused.
# Creates and removes its namespace and link itself (also when interrupted). Exit 77 (skip) when
# namespaces cannot be made here. Usage: remote_netns_test.sh DSGD_BINARY
set -euo pipefail
dsgd=$1
id=$$
ns=dsgd-t$id
host_if=dsgdh$((id % 100000))
ns_if=dsgdw$((id % 100000))
# A /30 of 198.18.0.0/15 (reserved for benchmarking) chosen from the pid, so parallel runs differ.
n=$(( (id % 16000) * 4 ))
net="198.18.$((n / 256))"
host_ip="$net.$((n % 256 + 1))"
ns_ip="$net.$((n % 256 + 2))"
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  ip netns del "$ns" 2>/dev/null || true
  ip link del "$host_if" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if ! ip netns add "$ns" 2>"$tmp/err"; then
  echo "SKIP: cannot create a network namespace here ($(cat "$tmp/err")); needs root or CAP_NET_ADMIN"
  exit 77
fi
ip link add "$host_if" type veth peer name "$ns_if"
ip link set "$ns_if" netns "$ns"
ip addr add "$host_ip/30" dev "$host_if"
ip link set "$host_if" up
ip -n "$ns" addr add "$ns_ip/30" dev "$ns_if"
ip -n "$ns" link set "$ns_if" up
ip -n "$ns" link set lo up

"$dsgd" train --workers 2 --listen "$host_ip:0" --token "tok-$id" --model mlp --dataset synthetic \
  --synthetic-samples 2048 --image-size 8 --epochs 2 --batch-size 32 --threads 1 \
  --json-out "$tmp/run.json" >"$tmp/driver.out" 2>"$tmp/driver.err" &
driver=$!
pids+=("$driver")
address=""
for _ in $(seq 100); do
  address=$(sed -n 's/.*--driver \([0-9.]*:[0-9]*\) --token.*/\1/p' "$tmp/driver.err" | head -1)
  [ -n "$address" ] && break
  sleep 0.1
done
[ -n "$address" ] || { echo "FAIL: the driver never printed its address"; cat "$tmp/driver.err"; exit 1; }
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
