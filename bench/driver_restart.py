#!/usr/bin/python3
"""A driver killed and started again in place, on the demo workload (bench/driver_restart.sh runs it; see there)."""
import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from recovery import WORKLOAD, children, is_worker, training_workers  # noqa: E402


def newest_step(root):
    try:
        steps = [int(n[5:]) for n in os.listdir(root) if n.startswith("step-")]
    except OSError:
        return -1
    return max(steps, default=-1)


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def fault_free(dsgd, args, out_dir):
    out = os.path.join(out_dir, "clean.json")
    with open(os.path.join(out_dir, "clean.log"), "w") as log:
        subprocess.run([dsgd] + WORKLOAD + args + ["--json-out", out], stdout=log, stderr=subprocess.STDOUT,
                       check=True)
    with open(out) as f:
        return json.load(f)


def restarted(dsgd, args, out_dir, name, after_step, delay_s):
    """One job whose driver is killed (-9) at a random moment after its snapshot of `after_step`
    is on disk, and started again `delay_s` later with the same command."""
    state = os.path.join(out_dir, name + "-state")
    out = os.path.join(out_dir, name + ".json")
    cmd = [dsgd] + WORKLOAD + args + ["--json-out", out, "--driver-state", state]
    log = open(os.path.join(out_dir, name + ".log"), "w")
    driver = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    while newest_step(os.path.join(state, "checkpoints")) < after_step and driver.poll() is None:
        time.sleep(0.05)
    time.sleep(random.uniform(0, 2))  # anywhere in the next interval
    workers = training_workers(driver.pid)
    if driver.poll() is not None or len(workers) < 2:
        raise SystemExit(f"{name}: the job was not training when its driver was to be killed")
    killed_at = time.time()
    driver.kill()
    driver.wait()
    time.sleep(delay_s)
    started_at = time.time()
    again = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    kept, checked = True, False
    while again.poll() is None:
        if any(is_worker(p) for p in children(again.pid)):
            kept = False  # the new driver started a worker of its own
        if not checked:
            with open(log.name) as f:
                checked = "the job goes on with" in f.read()
            kept = kept and (not checked or all(alive(w) for w in workers))  # the old ones, training again
        time.sleep(0.1)
    if again.returncode != 0:
        raise SystemExit(f"{name}: the restarted driver exited with {again.returncode}; see {log.name}")
    with open(out) as f:
        j = json.load(f)
    ev = next(r for r in j["recoveries"] if r["kind"] == "driver_restart")
    return {
        "start_to_resumed_s": ev["resumed_at_unix_s"] - started_at,
        "kill_to_resumed_s": ev["resumed_at_unix_s"] - killed_at,
        "driver_recovery_s": ev["recovery_s"],
        "phases_s": ev["phases_s"],
        "rolled_back_steps": ev["rolled_back_steps"],
        "workers_kept": kept and ev["lost"] == "",
        "test_accuracy": j["test_accuracy"],
        "test_loss": j["test_loss"],
        "steps": j["steps"],
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--after-step", type=int, default=100)
    p.add_argument("--delays", default="0,5", help="seconds between the kill and the new driver's start")
    p.add_argument("--json")
    a = p.parse_args()
    dsgd = os.path.join(os.path.dirname(__file__), "..", "build", "dsgd")
    args = ["--epochs", str(a.epochs)]
    out_dir = tempfile.mkdtemp(prefix="dsgd-driver-restart-")
    random.seed(1)
    clean = fault_free(dsgd, args, out_dir)
    rows = []
    for delay in [float(d) for d in a.delays.split(",")]:
        for i in range(a.runs):
            r = restarted(dsgd, args, out_dir, f"d{delay:g}-{i}", a.after_step, delay)
            r["delay_s"] = delay
            rows.append(r)
            print(json.dumps(r), flush=True)
    print(f"\nfault-free: test accuracy {clean['test_accuracy']:.4f}, test loss {clean['test_loss']:.6f}, "
          f"{clean['steps']} steps ({out_dir})")
    print("| restart after the kill | new driver's start to training resumed, median / max s | kill to resumed, "
          "median s | steps trained again (max) | workers kept | result vs fault-free |")
    print("|---|---|---|---|---|---|")
    for delay in sorted({r["delay_s"] for r in rows}):
        rs = [r for r in rows if r["delay_s"] == delay]
        same = all(r["test_loss"] == clean["test_loss"] and r["steps"] == clean["steps"] for r in rs)
        print(f"| {delay:g} s | {statistics.median(r['start_to_resumed_s'] for r in rs):.2f} / "
              f"{max(r['start_to_resumed_s'] for r in rs):.2f} | "
              f"{statistics.median(r['kill_to_resumed_s'] for r in rs):.2f} | "
              f"{max(r['rolled_back_steps'] for r in rs)} | {sum(r['workers_kept'] for r in rs)}/{len(rs)} | "
              f"{'equal (test loss to the last digit)' if same else 'DIFFERENT'} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"clean": clean, "runs": rows}, f, indent=1)


if __name__ == "__main__":
    main()
