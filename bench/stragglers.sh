#!/usr/bin/env bash
# Stragglers that are not: a steady 2-worker job (the reference CNN on synthetic images, batch 64,
# one thread each) for SECONDS beside a uniform load (one busy process the scheduler shares over
# both cores), counting the workers the driver names stragglers (want: 0), and the step rate with
# and without the load. A slowed worker being named is tests/python/test_module.py's.
#   bench/stragglers.sh [SECONDS]        (default 300)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-300}
py=/usr/bin/python3
[ -f build/python/dsgd/__init__.py ] || { echo "stragglers.sh: the Python module is not built (make build)"; exit 1; }
load_pid=
trap '[ -n "$load_pid" ] && kill "$load_pid" 2>/dev/null; true' EXIT
PYTHONPATH=build/python DSGD_BINARY=${DSGD_BINARY:-build/dsgd} $py - "$seconds" <<'PY' &
import json, os, signal, subprocess, sys, time
import dsgd
seconds = float(sys.argv[1])
with dsgd.Trainer(model="cnn", num_workers=2, data="synthetic", synthetic_samples=500000, batch_size=64,
                  threads_per_worker=1) as t:
    def run(span):
        start, steps, named = time.monotonic(), 0, []
        while time.monotonic() - start < span:
            r = t.train(num_steps=200)
            steps += r["batches"]
            named += r["stragglers"]
        return steps / (time.monotonic() - start), named
    quiet_rate, quiet_named = run(min(30.0, seconds / 5))
    load = subprocess.Popen(["sh", "-c", "while :; do :; done"])
    try:
        loaded_rate, loaded_named = run(seconds)
    finally:
        load.kill()
    print(f"without load: {quiet_rate:.1f} steps/s, stragglers named: {len(quiet_named)}")
    print(f"beside a busy process for {seconds:.0f} s: {loaded_rate:.1f} steps/s "
          f"({loaded_rate / quiet_rate:.2f}x), stragglers named: {len(loaded_named)}")
    for s in quiet_named + loaded_named:
        print("  named:", json.dumps(s))
PY
wait $!
