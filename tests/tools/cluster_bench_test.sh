#!/usr/bin/env bash
# bench/cluster.sh, small: 2 simulated hosts on 0.5 Gbit/s links, 8 steps of allreduce (also with
# the forward overlap), simple and ps with 2 shard processes on hosts of their own (psph), each
# also without compute (COMM_ALONE) and with the links metered (LINK_BUSY), after a check of the
# links with plain TCP (LINK_CHECK).
# Checks that the shaping holds (TCP gets the shaped rate; simple cannot beat its driver's link:
# h B / bw; psph cannot beat a worker's: B / bw), that every row is there, and that the script leaves no namespace or process behind, also when stopped midway
# by SIGTERM. Exit 77 (skip) without the rights to make namespaces.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
export DSGD=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! ip netns add "dsgd-probe$$" 2>/dev/null; then echo "SKIP: cannot create network namespaces here"; exit 77; fi
# The kernel must have bridges and the tbf qdisc (modules bridge, sch_tbf).
if ! { ip -n "dsgd-probe$$" link add br0 type bridge && ip -n "dsgd-probe$$" link add v0 type veth peer name v1 &&
       ip netns exec "dsgd-probe$$" tc qdisc add dev v0 root tbf rate 1gbit burst 131072 latency 20ms; } 2>"$tmp/probe"; then
  ip netns del "dsgd-probe$$"
  echo "SKIP: this kernel lacks a bridge or the tbf qdisc: $(cat "$tmp/probe")"
  exit 77
fi
ip netns del "dsgd-probe$$"

leftovers() {  # namespaces and processes of the cluster.sh run with pid $1
  { ip netns list | grep "dsgdc$1-" || true; pgrep -f "bench-$1|dsgdc$1-" || true; }
}

LINK_CHECK=1 LINK_BUSY=1 COMM_ALONE=1 JSON_OUT=$tmp/rows.jsonl CONFIGS="allreduce allreduce-fwd2 simple psph" \
  "$root/bench/cluster.sh" 2 0.5 8 \
  >"$tmp/out" 2>&1 &
run=$!
wait "$run" || { echo "FAIL: cluster.sh failed"; cat "$tmp/out"; exit 1; }
cat "$tmp/out"
[ -z "$(leftovers "$run")" ] || { echo "FAIL: left behind: $(leftovers "$run")"; exit 1; }
/usr/bin/python3 - "$tmp/rows.jsonl" "$tmp/out" <<'PY'
import json, re, sys
# LINK_CHECK: plain TCP gets the shaped rate from each worker host to the next, not more.
line = r"link check, 0.5 Gbit/s: host \d+ received ([0-9.]+) Gbit/s"
rates = [float(m) for m in re.findall(line, open(sys.argv[2]).read())]
assert len(rates) == 2 and all(0.4 < r < 0.55 for r in rates), rates
rows = {r["config"]: r for r in map(json.loads, open(sys.argv[1]))}
assert set(rows) == {"allreduce", "allreduce-fwd2", "simple", "psph"}, rows
bytes_ = 4 * rows["simple"]["parameters"]
link_ms = 1000 * 2 * bytes_ / (0.5e9 / 8)  # 2 hosts' gradients through the driver's 0.5 Gbit/s link
assert rows["simple"]["step_ms"] > 0.9 * link_ms, (rows["simple"], link_ms)
assert rows["psph"]["step_ms"] > 0.9 * link_ms / 2, (rows["psph"], link_ms / 2)  # B through a worker's link
for c, r in rows.items():
    assert r["step_ms"] >= 0.95 * r["compute_ms"], r  # two workers are not faster per step than one
    # COMM_ALONE: with no compute a step is the communication, not shorter than the shaped links
    # allow (B through a worker's link; simple: 2 B through the driver's), and shorter than a step
    # with compute where the links bound it. psph's is not: with no compute both workers' pushes
    # reach the 2 shard processes at once, and 5 processes contend for 2 cores (a CI run measured
    # 221 ms alone against 189 with compute), so it is only bounded loosely.
    assert r["comm_alone_ms"] > 0.9 * link_ms * (1 if c == "simple" else 0.5), (r, link_ms)
    assert r["comm_alone_ms"] < (1.5 if c == "psph" else 1.0) * r["step_ms"], r
    assert r["shared_compute_ms"] >= 0.95 * r["compute_ms"], r  # 2 workers at once take a step at least
# LINK_BUSY: no link carries more than its rate; allreduce's, the limit here, is mostly busy and
# carries about the formula's bytes per step (B each way on 2 hosts; a short run's window is noisy).
for r in rows.values():
    assert r["link_busy"] is not None and 0 < r["link_busy"] <= 1.05, r
a = rows["allreduce"]
per_step = a["link_busy"] * (0.5e9 / 8) * a["step_ms"] / 1000
assert a["link_busy"] > 0.3 and 0.8 < per_step / bytes_ < 1.4, (a, per_step, bytes_)
print(f"PASS: simple {rows['simple']['step_ms']:.0f} ms per step >= 0.9 x {link_ms:.0f} ms on the link; "
      f"allreduce {rows['allreduce']['step_ms']:.0f} ms, ps with 2 shard processes {rows['psph']['step_ms']:.0f} ms")
PY

# Stopped midway: everything it made goes.
LINK_BUSY=1 CONFIGS="allreduce" "$root/bench/cluster.sh" 2 0.5 200 >"$tmp/out2" 2>&1 &
run=$!
for _ in $(seq 900); do pgrep -f "bench-$run" >/dev/null && break; sleep 0.1; done  # after ~15 s alone
pgrep -f "bench-$run" >/dev/null || { echo "FAIL: no job started"; cat "$tmp/out2"; exit 1; }
kill -TERM "$run"
wait "$run" || true
sleep 0.5
[ -z "$(leftovers "$run")" ] || { echo "FAIL: left behind after SIGTERM: $(leftovers "$run")"; exit 1; }
echo "PASS: nothing left behind after SIGTERM"
