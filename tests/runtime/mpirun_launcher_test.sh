#!/usr/bin/env bash
# The mpirun launcher with Debian's Open MPI: `dsgd train --launcher mpirun` starts its 3 workers
# as the ranks of one mpirun; one is killed mid-training, mpirun keeps the others, and the job
# goes on with 2 (saying that none can be started in its place) and finishes. Also checked: the
# job token is on no command line but the driver's (where this test puts it), and no worker
# outlives the job. Exit 77 (skip) without mpirun. Usage: mpirun_launcher_test.sh DSGD_BINARY
set -euo pipefail
dsgd=$1
command -v mpirun >/dev/null || { echo "SKIP: no mpirun (openmpi-bin; scripts/install-deps.sh installs it)"; exit 77; }
tmp=$(mktemp -d)
driver=""
cleanup() { [[ -n $driver ]] && kill "$driver" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

token="secret-$$-$RANDOM$RANDOM"
# As root, Open MPI wants to be told (a test machine; any user may run this test).
"$dsgd" train --launcher mpirun --mpirun-command "mpirun --allow-run-as-root --oversubscribe" --token "$token" \
  --workers 3 --model mlp --dataset synthetic --synthetic-samples 8192 --image-size 8 --epochs 4 --batch-size 96 \
  --threads 1 --json-out "$tmp/run.json" >"$tmp/driver.out" 2>"$tmp/driver.err" &
driver=$!

ranks() { pgrep -f -- "^$dsgd --dsgd-worker --driver 127.0.0.1:[0-9]* --spawn-index mpi:" || true; }
for _ in $(seq 300); do
  [[ $(ranks | wc -l) -eq 3 ]] && grep -q "epoch 1" "$tmp/driver.err" 2>/dev/null && break
  kill -0 "$driver" 2>/dev/null || break
  sleep 0.1
done
[[ $(ranks | wc -l) -eq 3 ]] || { echo "FAIL: mpirun did not start 3 workers"; cat "$tmp/driver.err"; exit 1; }
printf '%s\n' "$token" > "$tmp/token"  # grep -f: the token is not on grep's own command line
leaks=$(grep -l -F -f "$tmp/token" /proc/[0-9]*/cmdline 2>/dev/null | grep -v "^/proc/$driver/cmdline\$" || true)
if [[ -n $leaks ]]; then
  for f in $leaks; do echo "  $f: $(tr '\0' ' ' < "$f")"; done
  echo "FAIL: the job token is on a command line (above)"; exit 1
fi
victim=$(ranks | tail -1)
sleep 1
kill -9 "$victim"
echo "killed worker process $victim"

if ! wait "$driver"; then
  echo "FAIL: the driver failed"; tail -40 "$tmp/driver.err"; exit 1
fi
driver=""
grep -q "launcher mpirun cannot start a replacement: the job goes on with 2 worker(s)" "$tmp/driver.err" ||
  { echo "FAIL: the driver did not say it goes on with 2"; tail -40 "$tmp/driver.err"; exit 1; }
for _ in $(seq 100); do
  [[ -z $(ranks) ]] && break
  sleep 0.1
done
[[ -z $(ranks) ]] || { echo "FAIL: workers outlived the job: $(ranks)"; exit 1; }
/usr/bin/python3 - "$tmp/run.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["epochs"] == 4, r["epochs"]
assert r["test_accuracy"] > 0.2, r["test_accuracy"]   # 10 classes: chance is 0.1
rec = [e for e in r["recoveries"] if e.get("kind") != "scale_up"]
assert len(rec) >= 1 and rec[0]["workers_after"] == 2, r["recoveries"]
print(json.dumps({"launcher": "mpirun", "workers": r["workers"], "test_accuracy": r["test_accuracy"],
                  "recoveries": len(rec)}))
print(f"PASS: 3 workers under mpirun, one killed, the job went on with 2; {r['test_accuracy']:.3f} test accuracy")
PY
