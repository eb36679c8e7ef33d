#!/usr/bin/env bash
# A simulated cluster on one machine: every host a network namespace with one link (a veth pair to
# a bridge in a namespace of its own), shaped to RATE Gbit/s each way with tc tbf; dsgd's driver in
# a namespace of its own, one or two workers (`dsgd worker`) in every host. The compute is
# simulated (model "simulated": forward and backward sleep, gradients of the real size appear
# layer by layer), so 8 hosts fit on 2 cores; the communication is real Gloo/gRPC over the links.
#
# Default scale: ResNet-50 on 25 Gbit/s links (25.6M parameters, 52 ms per fp32 step of batch 128
# on one H100), divided by 25: 1.024M parameters and 52 ms on 1 Gbit/s. A link of g Gbit/s here
# then models one of 25 g Gbit/s.
#
# For each host count and link rate: step time of every strategy (of the training steps: the
# run's time less the driver's snapshot of the replicas' state after it, 8 MB from one worker to
# the driver, which --profile times; it comes once per train() call, and each run here is one
# short call), scaling efficiency (step time of one worker alone over the step time here; the
# per-worker batch stays 32), and the analytic bound, max(compute, communication), with B the
# gradient's bytes and bw the link's bytes/s:
#   allreduce (Gloo ring among hosts; "hier": 2 workers per host, shared memory within)
#                        2 (h-1)/h B/bw
#   allreduce-fp16, -bf16 (--compression: 16 bits a value across hosts)
#                        (h-1)/h B/bw
#   allreduce-powersgd<R> (--compression powersgd:R, no plain start steps)
#                        2 (h-1)/h B_R/bw   (B_R: 4 bytes x R (n + m) per n x m layer)
#   ps, k shards         max((h+k-2)/k, [k<h]) B/bw  (the busiest link: a shard owner's, which
#                        takes (h-1)/k B of pushes and sends (k-1)/k B of its own, and the
#                        reverse for pulls; or, when k < h, a non-owner's, B each way)
#   ps<k>-fp16, ps<k>-bf16 (ps with k shards, --compression fp16 / bf16): half of ps's
#   psp, k shard processes on k hosts of their own ("psp<k>": --ps-placement processes)
#                        max(1, h/k) B/bw         (a worker's link carries B each way; a shard's
#                                                  h B/k)
#   simple               h B/bw                   (every gradient in through the driver's link,
#                                                  every average out, both ways at once)
# Without overlap the bound is compute + communication. A second bound says what a design that
# overlaps communication with backward only can reach (dsgd's, and PyTorch DDP's: the next
# forward needs the updated parameters): compute + max(0, communication - backward), backward
# being 2/3 of the simulated step.
#
# A rate of 0 leaves the links unshaped: what this machine itself costs (its 2 cores carry every
# host's TCP stack and Gloo threads), the floor under every shaped figure.
#
#   bench/cluster.sh [HOSTS] [GBITS] [STEPS]    (defaults: "2 4 8" "0 0.5 1 2" 40)
# Env: SIM_PARAMETERS (1024000), SIM_STEP_MS (52), MAX_AGGREGATE_GBITS (8: skip host counts x
# rates above this; the box moves ~8.5 Gbit/s between namespaces in all), CONFIGS (which rows:
# default "allreduce allreduce-no-overlap hier ps1 ps2 ps4 ps8 psh-no-overlap psph simple"; "psph": as
# many shard processes as hosts; "allreduce-ring", "allreduce-hd": one flat Gloo allreduce with
# that algorithm (--allreduce-algo) rather than auto's choice; "allreduce-fp16", "allreduce-bf16":
# allreduce with --compression fp16 or bf16; "allreduce-powersgd<R>": --compression powersgd:R;
# any config with "-fwd<T>" appended
# also runs with --forward-overlap-buckets T, "-fwdauto" with auto: its choice is printed, and its
# step time includes the trial steps),
# REPEATS (each config this many times, the configs interleaved: the step is the median, every
# run's is listed; default 1), JSON_OUT (also write every row as JSON lines there), LINK_CHECK=1
# (first measure what each cluster's links deliver to plain TCP: every host streams to the next,
# and each receiver prints
# its rate), LINK_BUSY=1 (sample every link's byte counters during each run, bench/link_meter.py:
# how busy the busiest link was, and its bytes per step over the formula's), COMM_ALONE=1 (also
# measure the bound's two terms on this machine: every config again with no compute, SIM_STEP_MS
# 0, its communication as measured here; and h workers at once with no communication, the
# compute when h hosts' workers share these 2 cores), WRITE_DOCS=1 (replace the tables in
# docs/BENCHMARKS.md between the cluster-tables markers, or DOC_MARKER's, and unless PLOT=0 the
# plot docs/img/cluster-scaling.png: bench/plot_cluster.sh), KEEP_TMP=DIR (copy the run's
# scratch files to DIR at exit: each run's JSON summary with its --profile phases, the driver's and
# the workers' logs, the link meter's samples), TRACE_DIR=DIR (each run also writes its timeline,
# `dsgd train --trace`, to DIR/CONFIG-<h>h-<g>g.json; bench/trace_gaps.py reads them).
# MODEL=cnn trains the real CNN on Fashion-MNIST instead of the simulated model, EPOCHS epochs
# (3) at lr 0.02 x 0.7 per epoch, momentum 0.9, test accuracy after each (STEPS unused): the
# table adds each run's time to 90% test accuracy (training seconds to the end of the first
# epoch at or above it) and its final accuracy; compute alone is 40 steps of one worker.
# Needs root (or CAP_NET_ADMIN) for namespaces; creates them with this script's pid in their names
# and removes them on any exit, also when interrupted. Addresses: 198.19.1.0/24, only inside them.
set -euo pipefail
cd "$(dirname "$0")/.."
read -r -a host_counts <<<"${1:-2 4 8}"
read -r -a rates <<<"${2:-0 0.5 1 2}"
steps=${3:-40}
repeats=${REPEATS:-1}
dsgd=$(realpath "${DSGD:-build/dsgd}")
params=${SIM_PARAMETERS:-1024000}
step_ms=${SIM_STEP_MS:-52}
layers=${SIM_LAYERS:-32}
max_aggregate=${MAX_AGGREGATE_GBITS:-8}
read -r -a configs <<<"${CONFIGS:-allreduce allreduce-no-overlap hier ps1 ps2 ps4 ps8 psh-no-overlap psph simple}"
per_worker_batch=32
bucket_bytes=${BUCKET_BYTES:-1048576}  # DDP's 25 MB default, scaled by 25 like the rest
id=$$
prefix=dsgdc$id
sw=$prefix-sw
tmp=$(mktemp -d)
pids=()
made=()

cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for ns in "${made[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
  if [[ -n "${KEEP_TMP:-}" ]]; then cp -r "$tmp" "$KEEP_TMP" || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

add_ns() {
  if ! ip netns add "$1" 2>"$tmp/err"; then
    echo "cluster.sh: cannot create a network namespace ($(cat "$tmp/err")); needs root or CAP_NET_ADMIN" >&2
    exit 77
  fi
  made+=("$1")
  ip -n "$1" link set lo up
  # As tuned in data centres: an idle connection (between two steps' gradients) keeps its window.
  ip netns exec "$1" sysctl -qw net.ipv4.tcp_slow_start_after_idle=0
}

# Host i (0 = the driver's) at 198.19.1.(i+1), its link shaped to $1 Gbit/s both ways.
make_cluster() {
  local gbit=$1 n=$2 bytes_per_s burst
  for ns in "${made[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
  made=()
  add_ns "$sw"
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 mtu 9000 up
  bytes_per_s=$(/usr/bin/python3 -c "print(int($gbit * 1e9 / 8))")  # 0: unshaped
  burst=$(( bytes_per_s / 1000 > 131072 ? bytes_per_s / 1000 : 131072 ))  # 1 ms, at least 2 GSO packets
  for i in $(seq 0 "$n"); do
    local ns=$prefix-h$i
    add_ns "$ns"
    ip -n "$sw" link add "p$i" mtu 9000 type veth peer name eth0 mtu 9000 netns "$ns"
    ip -n "$sw" link set "p$i" master br0 up
    ip -n "$ns" addr add "198.19.1.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    [[ "$gbit" == 0 ]] && continue
    ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "${gbit}gbit" burst "$burst" latency 20ms
    ip netns exec "$sw" tc qdisc add dev "p$i" root tbf rate "${gbit}gbit" burst "$burst" latency 20ms
  done
}

# With LINK_CHECK=1: what the links deliver to plain TCP, before any dsgd run on them. Every host
# sends 48 MiB to the next one (a ring, so each link carries one stream each way, as allreduce's
# ring does) and prints the rate its receiver saw.
link_check() {
  local gbit=$1 n=$2 i p=()
  for i in $(seq 1 "$n"); do
    ip netns exec "$prefix-h$i" /usr/bin/python3 -c "
import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('198.19.1.$((i + 1))', 29599)); s.listen(1); s.settimeout(30)
c, _ = s.accept(); c.settimeout(30); n, t0 = 0, None
while d := c.recv(1 << 20):
    t0 = t0 or time.time(); n += len(d)
print(f'link check, $gbit Gbit/s: host $i received {n * 8 / (time.time() - t0) / 1e9:.3f} Gbit/s')" &
    p+=($!) pids+=($!)
  done
  sleep 0.3
  for i in $(seq 1 "$n"); do
    ip netns exec "$prefix-h$i" /usr/bin/python3 -c "
import socket
c = socket.create_connection(('198.19.1.$((i % n + 2))', 29599), timeout=30)
for _ in range(48): c.sendall(bytes(1 << 20))" &
    p+=($!) pids+=($!)
  done
  wait "${p[@]}"
}

# Sets common, the flags of every run, for a simulated step of $1 ms.
set_common() {
  common=(--model simulated --dataset synthetic --image-size 8 --synthetic-samples 65536 --threads 1 --no-eval --quiet --profile
          --max-steps "$steps" --grad-shard-bytes "$bucket_bytes" --checkpoint-every 0
          --config "{\"sim_parameters\": $params, \"sim_step_ms\": $1, \"sim_layers\": $layers}")
}
model=${MODEL:-simulated}
epochs=${EPOCHS:-3}
alone_flags=()
if [[ "$model" == cnn ]]; then
  [[ "${COMM_ALONE:-0}" == 1 ]] && { echo "cluster.sh: COMM_ALONE needs the simulated model" >&2; exit 2; }
  set_common() {
    common=(--model cnn --epochs "$epochs" --lr 0.02 --lr-decay 0.7 --momentum 0.9 --threads 1 --quiet --profile
            --grad-shard-bytes "$bucket_bytes" --checkpoint-every 0)
  }
  alone_flags=(--max-steps 40 --no-eval)
elif [[ "$model" != simulated ]]; then
  echo "cluster.sh: MODEL '$model': use simulated or cnn" >&2
  exit 2
fi
set_common "$step_ms"
port=29600

# Sets run_ms (per training step: the run's time per step less its snapshots, as --profile
# measures them) and run_parameters from the JSON summary in $1.
# Also run_bytes (a worker's bytes to other hosts per step, -1 where not counted); with MODEL=cnn
# run_to90 (training seconds until the test accuracy first reached 90%, or null) and
# run_accuracy (the last).
read_summary() {
  read -r run_ms run_parameters run_to90 run_accuracy run_bytes < <(/usr/bin/python3 -c "import json, sys; r = json.load(open(sys.argv[1]))
p = r['profile_ms']; t, to90 = 0.0, 'null'
for e in r.get('history', []):
    t += e['epoch_s']
    if to90 == 'null' and e.get('test_accuracy', -1) >= 0.9: to90 = round(t, 1)
print(p['step'] - p['snapshot'], r['parameters'], to90, r.get('test_accuracy', -1), r.get('comm_bytes_per_step', -1))" "$1")
}

# run NAME HOSTS WORKERS_PER_HOST FLAGS...: one job across the cluster; sets run_ms (per step).
# With $servers > 0, that many `dsgd ps-server` shard processes run on hosts HOSTS+1...
run() {
  local name=$1 hosts=$2 per_host=$3
  shift 3
  local workers=$((hosts * per_host)) address="198.19.1.1:$port" out=$tmp/$name-$hosts meter=
  port=$((port + 1))
  run_busy=null
  if [[ "${LINK_BUSY:-0}" == 1 && "$gbit" != 0 ]]; then
    local ns=() i
    for i in $(seq 0 $((hosts + ${servers:-0}))); do ns+=("$prefix-h$i"); done  # h0: the driver's
    bench/link_meter.py "$gbit" "${ns[@]}" >"$out.links" &
    meter=$!
    pids+=("$meter")
  fi
  local trace=()
  [[ -n "${TRACE_DIR:-}" ]] && trace=(--trace "$TRACE_DIR/$name-${hosts}h-${gbit}g.json")
  ip netns exec "$prefix-h0" "$dsgd" train "${common[@]}" "$@" "${trace[@]}" --workers "$workers" --listen "$address" \
    --token "bench-$id" --batch-size $((per_worker_batch * workers)) --json-out "$out.json" \
    >/dev/null 2>"$out.driver" &
  local driver=$!
  pids+=("$driver")
  for _ in $(seq 100); do
    ip netns exec "$prefix-h0" ss -ltn | grep -q ":$((port - 1)) " && break
    sleep 0.05
  done
  local workers_pids=()
  for h in $(seq 1 "$hosts"); do
    for _ in $(seq "$per_host"); do
      ip netns exec "$prefix-h$h" "$dsgd" worker --driver "$address" --token "bench-$id" --host-id "host-$h" \
        >>"$out.workers" 2>&1 &
      workers_pids+=($!)
      pids+=($!)
    done
  done
  for s in $(seq 0 $((${servers:-0} - 1))); do
    ip netns exec "$prefix-h$((hosts + 1 + s))" "$dsgd" ps-server --driver "$address" --token "bench-$id" --shard "$s" \
      --host-id "server-$s" >>"$out.workers" 2>&1 &
    workers_pids+=($!)
    pids+=($!)
  done
  if ! wait "$driver"; then
    echo "cluster.sh: $name on $hosts hosts failed:" >&2
    tail -20 "$out.driver" "$out.workers" >&2
    exit 1
  fi
  wait "${workers_pids[@]}" 2>/dev/null || true
  if [[ -n "$meter" ]]; then
    kill -TERM "$meter"
    wait "$meter"
    run_busy=$(/usr/bin/python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['busy'] or 'null')" "$out.links")
  fi
  grep -ho "forward_overlap_buckets auto: .*" "$out.driver" | sed "s/^/$name on $hosts hosts: /" >&2 || true
  read_summary "$out.json"
}

# Compute alone: one worker, no communication (the efficiency's numerator and the bound's compute).
"$dsgd" train "${common[@]}" "${alone_flags[@]}" --workers 1 --batch-size "$per_worker_batch" --json-out "$tmp/one.json" >/dev/null
read_summary "$tmp/one.json"
compute_ms=$run_ms parameters=$run_parameters
echo "one worker alone: $compute_ms ms per step, $parameters parameters" >&2

# With COMM_ALONE=1 also: h such workers at once, each alone, no communication: the compute when
# h hosts' workers share this machine's cores (sets shared_ms).
shared_compute() {
  local n=$1 p=() i
  for i in $(seq "$n"); do
    "$dsgd" train "${common[@]}" --workers 1 --batch-size "$per_worker_batch" --json-out "$tmp/shared$i.json" \
      >/dev/null &
    p+=($!) pids+=($!)
  done
  wait "${p[@]}"
  shared_ms=0
  for i in $(seq "$n"); do
    read_summary "$tmp/shared$i.json"
    shared_ms=$(/usr/bin/python3 -c "print(max($shared_ms, $run_ms))")
  done
}

# config_flags CONFIG HOSTS: sets per_host, servers, flags and fwd for one config; fails (status 1)
# for a config that does not apply to HOSTS (more shards than hosts).
config_flags() {
  local c=$1 h=$2 base=$1 k
  per_host=1 servers=0 flags=() fwd=()
  if [[ "$c" =~ ^(.*)-fwd([0-9]+|auto)$ ]]; then  # any config, with the forward overlap
    base=${BASH_REMATCH[1]} fwd=(--forward-overlap-buckets "${BASH_REMATCH[2]}")
  fi
  case "$base" in
  allreduce) flags=(--strategy allreduce) ;;
  allreduce-ring | allreduce-hd) flags=(--strategy allreduce --allreduce-algo "${base#allreduce-}") ;;
  allreduce-no-overlap) flags=(--strategy allreduce --no-overlap) ;;
  allreduce-fp16 | allreduce-bf16) flags=(--strategy allreduce --compression "${base#allreduce-}") ;;
  allreduce-powersgd[0-9]*)  # steady state: no plain start steps
    flags=(--strategy allreduce --compression "powersgd:${base#allreduce-powersgd}" --powersgd-start-steps 0) ;;
  hier) per_host=2 flags=(--strategy allreduce) ;;
  ps[0-9]*-fp16 | ps[0-9]*-bf16) k=${base#ps}; k=${k%%-*}; ((k <= h)) || return 1
    flags=(--strategy ps --ps-shards "$k" --compression "${base##*-}") ;;
  ps[0-9]*) k=${base#ps}; ((k <= h)) || return 1; flags=(--strategy ps --ps-shards "$k") ;;
  psh-no-overlap) flags=(--strategy ps --ps-shards "$h" --no-overlap) ;;
  psp*) k=${base#psp}; [[ "$k" == h ]] && k=$h; ((k <= h)) || return 1
    servers=$k flags=(--strategy ps --ps-shards "$k" --ps-placement processes) ;;
  simple) flags=(--strategy simple) ;;
  *) echo "cluster.sh: unknown config '$c'" >&2; exit 2 ;;
  esac
}

rows=$tmp/rows.jsonl
: >"$rows"
declare -A shared_by_hosts=()
for gbit in "${rates[@]}"; do
  for h in "${host_counts[@]}"; do
    shared=null
    if [[ "${COMM_ALONE:-0}" == 1 ]]; then
      if [[ -z "${shared_by_hosts[$h]:-}" ]]; then
        shared_compute "$h"
        shared_by_hosts[$h]=$shared_ms
        echo "$h workers at once, each alone: $shared_ms ms per step" >&2
      fi
      shared=${shared_by_hosts[$h]}
    fi
    if /usr/bin/python3 -c "import sys; sys.exit(0 if $h * $gbit > $max_aggregate else 1)"; then
      echo "skipping $h hosts at $gbit Gbit/s: $h x $gbit > MAX_AGGREGATE_GBITS $max_aggregate" >&2
      continue
    fi
    extra=0  # hosts for shard processes
    for c in "${configs[@]}"; do [[ "$c" == psp* ]] && extra=$h; done
    make_cluster "$gbit" $((h + extra))
    [[ "${LINK_CHECK:-0}" == 1 ]] && link_check "$gbit" "$h"
    # Each config REPEATS times, the configs interleaved (the machine is shared and noisy); a row
    # per config with the median step and every run's.
    declare -A runs_of=() busy_of=() alone_of=() to90_of=() accuracy_of=() bytes_of=()
    for r in $(seq "$repeats"); do
      for c in "${configs[@]}"; do
        config_flags "$c" "$h" || continue
        echo "$(date +%T) $h hosts, $gbit Gbit/s: $c$( ((repeats > 1)) && echo " (run $r of $repeats)")" >&2
        run "$c" "$h" "$per_host" "${flags[@]}" "${fwd[@]}"
        runs_of[$c]+="$run_ms," busy_of[$c]+="$run_busy," to90_of[$c]+="$run_to90," accuracy_of[$c]+="$run_accuracy," bytes_of[$c]=$run_bytes
        if [[ "${COMM_ALONE:-0}" == 1 && $r == 1 ]]; then  # the same job with no compute: its communication alone
          set_common 0
          run "$c-alone" "$h" "$per_host" "${flags[@]}" "${fwd[@]}"
          alone_of[$c]=$run_ms
          set_common "$step_ms"
        fi
      done
    done
    for c in "${configs[@]}"; do
      config_flags "$c" "$h" || continue
      /usr/bin/python3 - "$c" "$h" "$gbit" "${runs_of[$c]}" "${busy_of[$c]}" "$compute_ms" "$parameters" "$step_ms" \
        "${alone_of[$c]:-null}" "$shared" "${to90_of[$c]}" "${accuracy_of[$c]}" "${bytes_of[$c]}" >>"$rows" <<'PY'
import json, statistics, sys
c, h, gbit, runs, busy, compute, params, sim, alone, shared, to90, accuracy, sent = sys.argv[1:]
runs = [float(x) for x in runs.split(",") if x]
busy = [float(x) for x in busy.split(",") if x and x != "null"]
to90 = [None if x == "null" else float(x) for x in to90.split(",") if x]
accuracy = [float(x) for x in accuracy.split(",") if x and float(x) >= 0]
print(json.dumps({"config": c, "hosts": int(h), "gbit": float(gbit), "step_ms": statistics.median(runs),
                  "to90_s": to90 if accuracy else None, "test_accuracy": accuracy or None,
                  "comm_bytes_per_step": float(sent) if float(sent) >= 0 else None,
                  "step_runs_ms": runs, "compute_ms": float(compute), "parameters": int(params),
                  "sim_step_ms": float(sim), "comm_alone_ms": json.loads(alone), "shared_compute_ms": json.loads(shared),
                  "link_busy": statistics.median(busy) if busy else None}))
PY
    done
    unset runs_of busy_of alone_of to90_of accuracy_of bytes_of
  done
done
[[ -n "${JSON_OUT:-}" ]] && cp "$rows" "$JSON_OUT"

report=$tmp/report.md
/usr/bin/python3 - "$rows" "$steps" "$params" "$step_ms" "$layers" "$bucket_bytes" "$model" "$epochs" >"$report" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps, params, step_ms, layers, bucket = sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5], int(sys.argv[6])
model, epochs = sys.argv[7], sys.argv[8]
cnn = model == "cnn"
bytes_of = {(r["config"], r["hosts"], r["gbit"]): r.get("comm_bytes_per_step") for r in rows}
def powersgd_bytes(rank):
    # The simulated layers as the model shapes them (near-square matrices), compressed where
    # their factors are at most half their size; the head (small) as it is.
    import math
    total = 0
    n_layers = int(layers)
    for l in range(n_layers):
        n = params // n_layers + (1 if l < params % n_layers else 0)
        rows = int(math.isqrt(n))
        while rows > 1 and n % rows: rows -= 1
        cols = n // rows
        total += rank * (rows + cols) if rows > 1 and 2 * rank * (rows + cols) <= n else n
    return 4 * total
def comm_ms(c, h, gbit, b):
    if gbit == 0: return 0.0  # unshaped
    c = c.split("-fwd")[0]
    bw = gbit * 1e9 / 8
    if c in ("allreduce-fp16", "allreduce-bf16"): t = (h - 1) / h * b / bw  # 16 bits a value
    elif c.startswith("allreduce-powersgd") and cnn:  # the CNN's own layers: the bytes its leaders sent
        t = (bytes_of.get((c, h, gbit)) or 0) / bw
    elif c.startswith("allreduce-powersgd"): t = 2 * (h - 1) / h * powersgd_bytes(int(c[len("allreduce-powersgd"):])) / bw
    elif c.startswith("allreduce") or c == "hier": t = 2 * (h - 1) / h * b / bw
    elif c.startswith("psp"):
        k = h if c == "psph" else int(c[3:])
        t = max(1, h / k) * b / bw
    elif c.startswith("ps") or c == "psh-no-overlap":
        k = h if c == "psh-no-overlap" else int(c[2:].split("-")[0])
        t = max((h + k - 2) / k, 1 if k < h else 0) * b / bw
        if c.endswith("-fp16") or c.endswith("-bf16"): t /= 2  # 16 bits a value, both ways
    elif c == "simple": t = h * b / bw
    return 1000 * t
if cnn:
    p = rows[0]["parameters"]
    print(f"The CNN on Fashion-MNIST: {p} parameters ({p * 4 / 1e6:.1f} MB of gradients, {bucket >> 10} KiB "
          f"buckets); 32 samples per worker, {epochs} epochs per run (lr 0.02 x 0.7 per epoch, momentum 0.9). One "
          f"worker alone: {rows[0]['compute_ms']:.1f} ms per step (the compute in the bounds; the backward-overlap "
          f"bound assumes the simulated model's split of forward and backward, so it is left out).\n")
else:
    print(f"Simulated compute: {params} parameters in {layers} tensors ({params * 4 / 1e6:.1f} MB of gradients, "
          f"{bucket >> 10} KiB buckets), "
          f"{step_ms} ms forward + backward; 32 samples per worker, {steps} steps per run. One worker alone: "
          f"{rows[0]['compute_ms']:.1f} ms per step (the compute in the bounds).\n")
for gbit in sorted({r["gbit"] for r in rows}):
    if gbit == 0:
        print("\nUnshaped links: this machine's own cost (the floor under the shaped figures)\n")
    else:
        print(f"\n{gbit:g} Gbit/s links (models {25 * gbit:g} Gbit/s at full scale)\n")
    alone = any(r.get("comm_alone_ms") is not None for r in rows)
    busy = any(r.get("link_busy") is not None for r in rows if r["gbit"] == gbit)
    print("| hosts | strategy | step ms | communication ms | bound ms | step / bound | "
          "backward-overlap bound ms | step / it | scaling efficiency |"
          + (" compute, h at once ms | communication alone ms | step / max(both) |" if alone else "")
          + (" busiest link busy | its bytes / formula's |" if busy else "")
          + (" runs: step ms |" if any(len(r.get("step_runs_ms", [])) > 1 for r in rows if r["gbit"] == gbit) else "")
          + (" to 90% s | test accuracy |" if cnn else ""))
    repeated = any(len(r.get("step_runs_ms", [])) > 1 for r in rows if r["gbit"] == gbit)
    print("|---|---|---|---|---|---|---|---|---|" + ("---|---|---|" if alone else "") + ("---|---|" if busy else "")
          + ("---|" if repeated else "") + ("---|---|" if cnn else ""))
    for r in [r for r in rows if r["gbit"] == gbit]:
        b, t = 4 * r["parameters"], r["compute_ms"]
        comm = comm_ms(r["config"], r["hosts"], gbit, b)
        if "no-overlap" in r["config"]:
            bound = bwd_bound = t + comm
        else:
            bound, bwd_bound = max(t, comm), t + max(0, comm - 2 * float(step_ms) / 3)
        line = (f"| {r['hosts']} | {r['config']} | {r['step_ms']:.1f} | {comm:.1f} | {bound:.1f} | "
                f"{r['step_ms'] / bound:.2f} | " + ("- | - |" if cnn else f"{bwd_bound:.1f} | {r['step_ms'] / bwd_bound:.2f} |")
                + f" {t / r['step_ms']:.2f} |")
        if alone:
            a, sc = r.get("comm_alone_ms"), r.get("shared_compute_ms") or t
            measured = (sc + a) if "no-overlap" in r["config"] else max(sc, a)
            line += f" {sc:.1f} | {a:.1f} | {r['step_ms'] / measured:.2f} |" if a is not None else " - | - | - |"
        if busy:
            u = r.get("link_busy")
            # The link's bytes per step, busy x rate x step, over the formula's, rate x comm.
            line += f" {u:.2f} | {u * r['step_ms'] / comm:.2f} |" if u is not None and comm > 0 else " - | - |"
        if repeated:
            line += " " + ", ".join(f"{x:.1f}" for x in r.get("step_runs_ms", [r["step_ms"]])) + " |"
        if cnn:
            line += (" " + ", ".join("not reached" if x is None else f"{x:.0f}" for x in (r.get("to90_s") or [])) + " | "
                     + ", ".join(f"{x:.4f}" for x in (r.get("test_accuracy") or [])) + " |")
        print(line)
PY
cat "$report"
if [[ "${WRITE_DOCS:-0}" == 1 ]]; then
  command="${COMM_ALONE:+COMM_ALONE=$COMM_ALONE }${LINK_BUSY:+LINK_BUSY=$LINK_BUSY }"  # as typed, to rerun it
  command+="${SIM_STEP_MS:+SIM_STEP_MS=$SIM_STEP_MS }${REPEATS:+REPEATS=$REPEATS }"
  command+="${BUCKET_BYTES:+BUCKET_BYTES=$BUCKET_BYTES }${CONFIGS:+CONFIGS=\"$CONFIGS\" }bench/cluster.sh"
  for a in "$@"; do command+=" \"$a\""; done
  bench/write_docs.py "${DOC_MARKER:-cluster-tables}" "$report" "$command"
  if [[ "${PLOT:-1}" == 1 ]]; then bench/plot_cluster.sh "$rows" docs/img/cluster-scaling.png; fi
fi
