#!/usr/bin/env bash
# The ssh launcher against real sshd daemons: "node1" is an sshd inside a network namespace,
# "node2" (two slots) one in the root namespace on this test's veth address; each takes only a
# throw-away key made here. `dsgd train --launcher ssh` starts its 2 workers through them; one
# worker is killed on node1 mid-training, and the driver must start its replacement on node2
# (the host without a loss) and finish. Also checked: the worker on node1 really runs in the
# namespace (only sshd can have put it there), the job token is on no command line, and no
# worker outlives the job; a ps job's shard process is started over ssh as well. Creates and
# removes its namespace, daemons and keys itself (also when interrupted). Exit 77 (skip) without namespaces or sshd. Usage: ssh_launcher_test.sh DSGD_BINARY
set -euo pipefail
dsgd=$1
sshd=/usr/sbin/sshd
[[ -x $sshd ]] || { echo "SKIP: no $sshd (openssh-server; scripts/install-deps.sh installs it)"; exit 77; }
source "$(dirname "$0")/netns.sh"
netns_up

# Privilege separation wants this directory; made here only if missing, and removed then.
made_run=""
if [[ ! -d /run/sshd ]]; then mkdir -p /run/sshd && made_run=1; fi
cleanup_ssh() { [[ -n $made_run ]] && rmdir /run/sshd 2>/dev/null; netns_cleanup; }
trap cleanup_ssh EXIT

ssh-keygen -q -t ed25519 -N '' -f "$tmp/host_key"
ssh-keygen -q -t ed25519 -N '' -f "$tmp/client_key"
cp "$tmp/client_key.pub" "$tmp/authorized_keys"
chmod 600 "$tmp/authorized_keys"
daemon_config() {  # $1: address, $2: port, $3: name
  cat > "$tmp/sshd-$3.conf" <<CONF
ListenAddress $1:$2
HostKey $tmp/host_key
AuthorizedKeysFile $tmp/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile $tmp/sshd-$3.pid
LogLevel ERROR
CONF
}
daemon_config "$ns_ip" 2222 node1
daemon_config "$host_ip" 2223 node2
ip netns exec "$ns" $sshd -D -e -f "$tmp/sshd-node1.conf" 2>"$tmp/sshd-node1.log" &
pids+=("$!")
$sshd -D -e -f "$tmp/sshd-node2.conf" 2>"$tmp/sshd-node2.log" &
pids+=("$!")
cat > "$tmp/ssh_config" <<CONF
Host node1
  HostName $ns_ip
  Port 2222
Host node2
  HostName $host_ip
  Port 2223
Host *
  User root
  IdentityFile $tmp/client_key
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  ConnectTimeout 5
  LogLevel ERROR
CONF
for node in node1 node2; do  # the daemons are up and take the key
  for _ in $(seq 50); do
    ssh -F "$tmp/ssh_config" -o BatchMode=yes "$node" true 2>/dev/null && break
    sleep 0.1
  done
  ssh -F "$tmp/ssh_config" -o BatchMode=yes "$node" true || { echo "FAIL: sshd on $node"; cat "$tmp"/sshd-*.log; exit 1; }
done
printf 'node1\n# the second host takes two workers\nnode2:2\n' > "$tmp/hosts"

token="secret-$id-$RANDOM$RANDOM"
"$dsgd" train --launcher ssh --hosts "$tmp/hosts" --ssh-command "ssh -F $tmp/ssh_config" --listen "$host_ip:0" \
  --token "$token" --workers 2 --model mlp --dataset synthetic --synthetic-samples 8192 --image-size 8 --epochs 6 \
  --batch-size 64 --threads 1 --json-out "$tmp/run.json" >"$tmp/driver.out" 2>"$tmp/driver.err" &
driver=$!
pids+=("$driver")

worker_on() {  # the worker process (not its shell) started on host $1
  pgrep -f -- "^$dsgd --dsgd-worker .*--host-id $1\$" | head -1 || true
}
victim=""
for _ in $(seq 300); do
  victim=$(worker_on node1)
  [[ -n $victim ]] && grep -q "epoch 1" "$tmp/driver.out" "$tmp/driver.err" 2>/dev/null && break
  kill -0 "$driver" 2>/dev/null || break
  sleep 0.1
done
[[ -n $victim ]] || { echo "FAIL: no worker started on node1"; cat "$tmp/driver.err"; exit 1; }
[[ $(ip netns identify "$victim") == "$ns" ]] ||
  { echo "FAIL: the worker on node1 (pid $victim) is not in node1's namespace"; exit 1; }
# (but the driver's own, where this test put it with --token)
printf '%s\n' "$token" > "$tmp/token"  # grep -f: the token is not on grep's own command line
leaks=$(grep -l -F -f "$tmp/token" /proc/[0-9]*/cmdline 2>/dev/null | grep -v "^/proc/$driver/cmdline\$" || true)
if [[ -n $leaks ]]; then
  for f in $leaks; do echo "  $f: $(tr '\0' ' ' < "$f")"; done
  echo "FAIL: the job token is on a command line (above)"; exit 1
fi
sleep 1
kill -9 "$victim"
echo "killed the worker on node1 (pid $victim)"

if ! wait "$driver"; then
  echo "FAIL: the driver failed"; tail -40 "$tmp/driver.err"; exit 1
fi
grep -q "starting a worker on node2 (ssh)" <(sed -n '/lost\|recover/,$p' "$tmp/driver.err") ||
  { echo "FAIL: no replacement started on node2 after the loss"; tail -40 "$tmp/driver.err"; exit 1; }
for _ in $(seq 50); do
  [[ -z $(pgrep -f -- "--dsgd-worker --driver $host_ip:") ]] && break
  sleep 0.1
done
leftover=$(pgrep -af -- "--dsgd-worker --driver $host_ip:" || true)
[[ -z $leftover ]] || { echo "FAIL: workers outlived the job: $leftover"; exit 1; }

# Parameter-server shard processes go through the launcher too: one worker and one shard, each
# taking a slot of the hosts.
"$dsgd" train --launcher ssh --hosts "$tmp/hosts" --ssh-command "ssh -F $tmp/ssh_config" --listen "$host_ip:0" \
  --workers 1 --strategy ps --ps-placement processes --ps-shards 1 --model mlp --dataset synthetic \
  --synthetic-samples 2048 --image-size 8 --epochs 1 --batch-size 64 --threads 1 --json-out "$tmp/ps.json" \
  >"$tmp/ps.out" 2>"$tmp/ps.err" || { echo "FAIL: the ps job failed"; tail -30 "$tmp/ps.err"; exit 1; }
grep -q "starting ps shard 0 on node[12] (ssh)" "$tmp/ps.err" ||
  { echo "FAIL: the ps shard was not started over ssh"; tail -30 "$tmp/ps.err"; exit 1; }
sleep 0.5
leftover=$(pgrep -af -- "--dsgd-ps-server --driver $host_ip:" || true)
[[ -z $leftover ]] || { echo "FAIL: the shard process outlived the job: $leftover"; exit 1; }
echo "a ps job's shard process ran over ssh: $(grep -o 'starting ps shard 0 on node[12]' "$tmp/ps.err")"
/usr/bin/python3 - "$tmp/run.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["epochs"] == 6, r["epochs"]
assert r["test_accuracy"] > 0.2, r["test_accuracy"]   # 10 classes: chance is 0.1
rec = [e for e in r["recoveries"] if e.get("kind") != "scale_up"]
assert len(rec) >= 1, r["recoveries"]
print(json.dumps({"launcher": "ssh", "nodes": 2, "workers": r["workers"], "test_accuracy": r["test_accuracy"],
                  "recoveries": len(rec)}))
print(f"PASS: 2 workers over ssh, one lost on node1 and replaced on node2; {r['test_accuracy']:.3f} test accuracy")
PY
