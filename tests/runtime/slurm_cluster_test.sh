#!/usr/bin/env bash
# The slurm launcher on a real Slurm (Debian 12's slurm-wlm): munged, slurmctld and 3 slurmd,
# each node in a network namespace of its own, joined by a bridge in the controller's namespace
# (addresses from 198.19.0.0/16, part of 198.18.0.0/15, reserved for benchmarking). It submits
# examples/slurm/train.sbatch as it is, with 3 nodes (2 workers and a spare), kills one worker's
# process on its node during training, and checks that
#   - the driver's workers really are Slurm job steps (squeue, polled while the job runs),
#   - the replacement is a new step on another node than the lost worker's,
#   - the job finishes (COMPLETED), with a recovery and the replacement's joining (back to 2
#     workers) in its summary,
# then prints one JSON line: launcher, nodes, workers, test_accuracy, recoveries. Every daemon,
# job and namespace it made is gone on any exit (also when interrupted). Runs as root (slurmd
# starts steps as their user); exit 77 (skip) without root, namespaces, a cgroup filesystem or
# Slurm.
# Usage: slurm_cluster_test.sh DSGD_BINARY [EXTRA dsgd train ARGUMENTS]
set -euo pipefail
dsgd=$(realpath "$1")
shift
here=$(cd "$(dirname "$0")" && pwd)
sbatch_script="$here/../../examples/slurm/train.sbatch"
for daemon in munged slurmctld slurmd; do
  command -v $daemon >/dev/null || [[ -x /usr/sbin/$daemon ]] ||
    { echo "SKIP: no $daemon (munge, slurmctld, slurmd; scripts/install-deps.sh installs them)"; exit 77; }
done
export PATH=$PATH:/usr/sbin
[[ $(id -u) -eq 0 ]] || { echo "SKIP: needs root (network namespaces, slurmd)"; exit 77; }
# slurmd loads its cgroup plugin even with proctrack/linuxproc, and will not start without a
# cgroup filesystem: a machine without one cannot run this test (a container's, say).
grep -q " /sys/fs/cgroup[/ ]" /proc/mounts ||
  { echo "SKIP: no cgroup filesystem at /sys/fs/cgroup, which slurmd needs to start"; exit 77; }

id=$$
tag=dsgd-s$((id % 100000))
ctl=$tag-ctl
net="198.19.$((id % 256))"
ctl_ip="$net.1"
nodes=(node0 node1 node2)
tmp=$(mktemp -d)
export SLURM_CONF=$tmp/slurm.conf
daemons=()
cleanup() {
  set +e
  [[ -f $SLURM_CONF ]] && timeout 10 ip netns exec "$ctl" scancel --full --signal=KILL --user=root >/dev/null 2>&1
  for p in "${daemons[@]}"; do kill "$p" 2>/dev/null; done
  sleep 0.5
  for p in "${daemons[@]}"; do kill -9 "$p" 2>/dev/null; done
  for ns in "$ctl" "${nodes[@]/#/$tag-}"; do  # whatever still runs in a namespace (slurmstepd, steps)
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "$ns" 2>/dev/null
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The network: a bridge in the controller's namespace, a veth from it to each node's namespace.
if ! ip netns add "$ctl" 2>"$tmp/err"; then
  echo "SKIP: cannot create a network namespace here ($(cat "$tmp/err"))"; exit 77
fi
ip -n "$ctl" link set lo up
ip -n "$ctl" link add br0 type bridge
ip -n "$ctl" addr add "$ctl_ip/24" dev br0
ip -n "$ctl" link set br0 up
node_conf=""
for k in "${!nodes[@]}"; do
  ns=$tag-${nodes[$k]}
  ip netns add "$ns"
  ip link add "${tag}v$k" type veth peer name "${tag}p$k"
  ip link set "${tag}v$k" netns "$ns"
  ip link set "${tag}p$k" netns "$ctl"
  ip -n "$ctl" link set "${tag}p$k" master br0
  ip -n "$ctl" link set "${tag}p$k" up
  ip -n "$ns" addr add "$net.$((k + 10))/24" dev "${tag}v$k"
  ip -n "$ns" link set "${tag}v$k" up
  ip -n "$ns" link set lo up
  node_conf+="NodeName=${nodes[$k]} NodeAddr=$net.$((k + 10)) CPUs=1 State=UNKNOWN"$'\n'
  mkdir -p "$tmp/spool/${nodes[$k]}"
done

# munge: a key of our own, its socket in $tmp (the system's munged, if any, is left alone).
mkdir -m 700 "$tmp/munge" "$tmp/state"
head -c 1024 /dev/urandom > "$tmp/munge/key"
chmod 400 "$tmp/munge/key"
munged --foreground --force --socket="$tmp/munge/socket" --key-file="$tmp/munge/key" --pid-file="$tmp/munge/pid" \
  --log-file="$tmp/munge/log" --seed-file="$tmp/munge/seed" 2>/dev/null &
daemons+=("$!")
cat > "$SLURM_CONF" <<CONF
ClusterName=dsgdtest
SlurmctldHost=$(hostname -s)($ctl_ip)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$tmp/munge/socket
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool/%n
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd-%n.pid
SlurmctldLogFile=$tmp/slurmctld.log
SlurmdLogFile=$tmp/slurmd-%n.log
# No cgroups: processes tracked by parentage, tasks not confined.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SlurmdParameters=config_overrides
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
KillWait=5
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
$node_conf
PartitionName=test Nodes=node[0-2] Default=YES MaxTime=INFINITE State=UP
CONF
for _ in $(seq 50); do [[ -S $tmp/munge/socket ]] && break; sleep 0.1; done
ip netns exec "$ctl" slurmctld -D -i -f "$SLURM_CONF" 2>>"$tmp/slurmctld.err" &
daemons+=("$!")
for k in "${!nodes[@]}"; do
  # nsenter rather than `ip netns exec`: the latter mounts a /sys without the cgroup
  # filesystems, and slurmd will not start without them.
  nsenter --net="/run/netns/$tag-${nodes[$k]}" slurmd -D -N "${nodes[$k]}" -f "$SLURM_CONF" \
    2>>"$tmp/slurmd-${nodes[$k]}.err" &
  daemons+=("$!")
done
sq() { timeout 10 ip netns exec "$ctl" "$@"; }
fail() {  # $1: what failed; then the job's and the daemons' last words
  echo "FAIL: $1"
  for f in "$tmp/job.out" "$tmp/slurmctld.log" "$tmp"/slurmd-node*.log; do
    [[ -f $f ]] && { echo "--- ${f#"$tmp/"}"; tail -25 "$f"; }
  done
  exit 1
}
idle=""
for _ in $(seq 300); do
  idle=$(sq sinfo -h -o "%T %D" 2>/dev/null | awk '$1 == "idle" {print $2}')
  [[ $idle == 3 ]] && break
  sleep 0.1
done
[[ $idle == 3 ]] || { sq sinfo 2>&1; tail -n 5 "$tmp"/*.err; fail "Slurm's 3 nodes did not come up idle"; }
echo "slurm: slurmctld on $ctl_ip, slurmd on ${nodes[*]} ($net.10-12), 3 nodes idle"

# The job, as a user submits it; the test's own arguments after the script's.
job=$(sq sbatch --parsable --nodes=3 --output="$tmp/job.out" --export="ALL,DSGD=$dsgd" "$sbatch_script" \
  --model mlp --epochs 2 --batch-size 128 --json-out "$tmp/run.json" "$@")
echo "submitted job $job"
(while :; do sq squeue -s -h -j "$job" -o "%i %j %N" 2>/dev/null >> "$tmp/steps"; sleep 0.3; done) &
poller=$!
daemons+=("$poller")

worker_pids() { pgrep -f -- "^$dsgd --dsgd-worker --driver $net\.[0-9]*:[0-9]* " || true; }
state() { sq scontrol show job "$job" -o 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
victim=""
for _ in $(seq 1200); do
  if [[ $(worker_pids | wc -l) -eq 2 ]]; then  # both started: 5 s into training, kill one
    sleep 5
    [[ $(worker_pids | wc -l) -eq 2 ]] && victim=$(worker_pids | head -1)
    break
  fi
  # Still coming: pending, configuring its nodes, running, or not yet known to scontrol (an
  # empty answer right after the submission). Any other state is the job's end.
  case $(state) in RUNNING | PENDING | CONFIGURING | "") ;; *) break ;; esac
  sleep 0.1
done
[[ -n $victim ]] || { cat "$tmp/job.out" 2>/dev/null | tail -20; fail "the job never trained with 2 workers (state $(state))"; }
lost_node=$(tr '\0' ' ' < "/proc/$victim/cmdline" | sed -n 's/.*--host-id \([^ ]*\).*/\1/p')
[[ $(ip netns identify "$victim") == "$tag-$lost_node" ]] ||
  fail "the worker on $lost_node (pid $victim) is not in that node's namespace"
printf '%s\n' "$(sq squeue -s -h -j "$job" -o "%i %j %N")" > "$tmp/steps-before"
kill -9 "$victim"
echo "killed the worker on $lost_node (pid $victim)"

for _ in $(seq 1800); do
  s=$(state)
  [[ $s == RUNNING || $s == PENDING || $s == COMPLETING ]] || break
  sleep 0.2
done
kill "$poller" 2>/dev/null || true
s=$(state)
[[ $s == COMPLETED ]] || fail "the job ended $s"
# Every worker was a Slurm job step named dsgd-worker: the replacement one more, elsewhere.
steps=$(awk '$2 == "dsgd-worker" {print $1, $3}' "$tmp/steps" | sort -u)
echo "worker steps seen by squeue:"; sed 's/^/  /' <<< "$steps"
[[ $(cut -d' ' -f1 <<< "$steps" | sort -u | wc -l) -ge 3 ]] ||
  fail "fewer than 3 worker steps (2 and a replacement) in squeue"
first=" $(awk '$2 == "dsgd-worker" {printf "%s ", $1}' "$tmp/steps-before")"
replacement_nodes=$(awk -v first="$first" 'index(first, " " $1 " ") == 0 {print $2}' <<< "$steps" | sort -u)
[[ -n $replacement_nodes ]] || fail "no replacement step in squeue"
if grep -q -x "$lost_node" <<< "$replacement_nodes"; then
  fail "a replacement step ran on $lost_node, the node that lost a worker"
fi
grep -q "starting a worker on a node of Slurm job $job but \([^ ]*,\)\?$lost_node[, ]" "$tmp/job.out" ||
  fail "the driver did not exclude $lost_node"
nodes_used=$(awk '{print $2}' <<< "$steps" | sort -u | wc -l)
/usr/bin/python3 - "$tmp/run.json" "$nodes_used" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
rec = [e for e in r["recoveries"] if e.get("kind") != "scale_up"]
assert len(rec) >= 1, r["recoveries"]
ups = [e for e in r["recoveries"] if e.get("kind") == "scale_up"]
assert ups and ups[-1]["workers_after"] == 2, f"the replacement never joined: {r['recoveries']}"
assert r["test_accuracy"] > 0.7, r["test_accuracy"]   # Fashion-MNIST, MLP: about 0.85
print(json.dumps({"launcher": "slurm", "nodes": int(sys.argv[2]), "workers": r["workers"],
                  "test_accuracy": r["test_accuracy"], "recoveries": len(rec)}))
PY
echo "PASS: 2 workers as Slurm job steps, one killed on $lost_node and replaced on $(tr '\n' ' ' <<< "$replacement_nodes")"
