#!/usr/bin/python3
"""Kill-to-resumed on the demo workload (bench/recovery.sh runs it; see there)."""
import argparse
import glob
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time

# The demo workload of docs/RELIABILITY.md: the CNN on Fashion-MNIST, 2 workers of 1 thread.
WORKLOAD = ["train", "--workers", "2", "--model", "cnn", "--batch-size", "128", "--threads", "1",
            "--checkpoint-every", "20", "--lr", "0.02", "--momentum", "0.9", "--lr-decay", "0.7", "--quiet"]


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def cpu_ticks(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime
    except (OSError, IndexError):
        return None


def is_worker(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"--dsgd-worker" in f.read()
    except OSError:
        return False


def training_workers(driver):
    """The driver's workers that compute now (a standby idles): busy over 0.5 s."""
    pids = [p for p in children(driver) if is_worker(p)]
    before = {p: cpu_ticks(p) for p in pids}
    time.sleep(0.5)
    busy = []
    for p in pids:
        after = cpu_ticks(p)
        if before[p] is not None and after is not None and after - before[p] >= 10:  # >= 0.1 s of CPU
            busy.append(p)
    return busy


def run(dsgd, args, out_dir, name, faults):
    """One job. `faults`: (seconds after the previous fault or the start, signal, busy_only) in
    order; a busy_only fault waits until two workers train and hits one of them at random, the
    others hit any worker process (at start-up). Returns the job's summary."""
    out = os.path.join(out_dir, name + ".json")
    log = open(os.path.join(out_dir, name + ".log"), "w")
    driver = subprocess.Popen([dsgd] + WORKLOAD + args + ["--json-out", out, "--max-failures", str(len(faults) + 2)],
                              stdout=log, stderr=subprocess.STDOUT)
    spawned, stopped = set(), []
    fault_times = []
    next_at = time.time() + (faults[0][0] if faults else 0)
    while driver.poll() is None:
        spawned.update(children(driver.pid))
        if len(fault_times) < len(faults) and time.time() >= next_at:
            _, sig, busy_only = faults[len(fault_times)]
            targets = training_workers(driver.pid) if busy_only else [p for p in children(driver.pid) if is_worker(p)]
            if len(targets) >= (2 if busy_only else 1):  # busy: training, not recovering
                victim = RNG.choice(targets)
                fault_times.append(time.time())
                os.kill(victim, sig)
                if sig == signal.SIGSTOP:
                    stopped.append(victim)
                if len(fault_times) < len(faults):
                    next_at = time.time() + faults[len(fault_times)][0]
        time.sleep(0.02)
    log.close()
    for p in stopped:  # evicted and killed by the driver; in case not, do not leave it stopped
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    if driver.returncode != 0:
        sys.exit(f"bench/recovery: {name} failed with status {driver.returncode}; see {log.name}")
    with open(out) as f:
        summary = json.load(f)
    events = [e for e in summary["recoveries"] if e["kind"] == "recovery"]
    during_training = [t for t, f in zip(fault_times, faults) if f[2]]
    if len(events) < len(during_training):
        sys.exit(f"bench/recovery: {name}: {len(during_training)} faults but {len(events)} recoveries; see {log.name}")
    # A fault at start-up costs a restart, not a recovery event: the others pair with the events.
    measured = [e["resumed_at_unix_s"] - t for e, t in zip(events[-len(during_training):], during_training)] \
        if during_training else []
    time.sleep(1)
    orphans = [p for p in spawned if os.path.exists(f"/proc/{p}") and open(f"/proc/{p}/stat").read().split()[2] != "Z"]
    leftovers = [f for p in spawned for f in glob.glob(f"/dev/shm/dsgd-{p}-*")]
    return {"name": name, "accuracy": summary["test_accuracy"], "events": events, "measured": measured,
            "orphans": orphans, "shm_leftovers": leftovers, "kills": len(fault_times)}


RNG = random.Random(1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dsgd", default="build/dsgd")
    p.add_argument("--runs", type=int, default=4)
    p.add_argument("--kills", type=int, default=5, help="per run")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--gap", type=float, default=4.0, help="seconds between kills, at least (plus up to as much)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="write every run here too")
    p.add_argument("--modes", default="standby,no-standby",
                   help="comma-separated: standby, standby-snapshot (--no-from-peer), no-standby")
    p.add_argument("--no-scenarios", action="store_true", help="leave out the two-kills, SIGSTOP and start-up cases")
    o = p.parse_args()
    RNG.seed(o.seed)
    out_dir = tempfile.mkdtemp(prefix="dsgd-recovery-")
    epochs = ["--epochs", str(o.epochs)]
    kill = signal.SIGKILL
    print(f"bench/recovery: the demo workload, {o.epochs} epoch(s) a run; logs in {out_dir}", file=sys.stderr)
    clean = run(o.dsgd, epochs, out_dir, "fault-free", [])
    print(f"  fault-free: test accuracy {clean['accuracy']:.4f}", file=sys.stderr)
    known = {"standby": ("one standby", ["--standby", "1"]),
             "standby-snapshot": ("one standby, from the snapshot", ["--standby", "1", "--no-from-peer"]),
             "no-standby": ("no standby", [])}
    modes = [known[m] for m in o.modes.split(",")]
    results = {"fault_free_accuracy": clean["accuracy"], "modes": [], "scenarios": []}
    for label, args in modes:
        runs = []
        for i in range(o.runs):
            faults = [(RNG.uniform(o.gap if k else 5, 2 * o.gap if k else 5 + o.gap), kill, True) for k in range(o.kills)]
            r = run(o.dsgd, epochs + args, out_dir, f"{label.replace(' ', '-')}-{i + 1}", faults)
            print(f"  {label} run {i + 1}: {r['kills']} kills, kill-to-resumed "
                  f"{', '.join(f'{m:.2f}' for m in r['measured'])} s, test accuracy {r['accuracy']:.4f}", file=sys.stderr)
            runs.append(r)
        measured = [m for r in runs for m in r["measured"]]
        reported = [e["recovery_s"] for r in runs for e in r["events"]]
        standby = sum(e["standbys_used"] for r in runs for e in r["events"])
        rolled_back = [e["rolled_back_steps"] for r in runs for e in r["events"] if e["kind"] == "recovery"]
        deltas = [100 * (r["accuracy"] - clean["accuracy"]) for r in runs]
        results["modes"].append({
            "mode": label, "kills": len(measured), "standbys_used": standby, "rolled_back_steps": rolled_back,
            "median_s": statistics.median(measured), "max_s": max(measured),
            "reported_median_s": statistics.median(reported), "reported_max_s": max(reported),
            "accuracy_delta_points": deltas,
            "orphans": sum(len(r["orphans"]) for r in runs), "shm_leftovers": sum(len(r["shm_leftovers"]) for r in runs),
            "runs": [{k: v for k, v in r.items() if k != "events"} for r in runs]})
    # The other cases, each with one standby: two kills 3 s apart, a hung worker, a kill
    # while the job starts.
    scenarios = [("two kills 3 s apart", [(8, kill, True), (3, kill, True)]),
                 ("SIGSTOP (kill-to-resumed: stop-to-resumed)", [(8, signal.SIGSTOP, True)]),
                 ("kill -9 during start-up", [(0.4, kill, False)])]
    for label, faults in ([] if o.no_scenarios else scenarios):
        r = run(o.dsgd, epochs + ["--standby", "1"], out_dir, "scenario-" + str(len(results["scenarios"]) + 1), faults)
        print(f"  {label}: resumed {', '.join(f'{m:.2f}' for m in r['measured']) or '-'} s after, "
              f"test accuracy {r['accuracy']:.4f}", file=sys.stderr)
        results["scenarios"].append({"scenario": label, "measured_s": r["measured"],
                                     "accuracy_delta_points": 100 * (r["accuracy"] - clean["accuracy"]),
                                     "orphans": len(r["orphans"]), "shm_leftovers": len(r["shm_leftovers"])})
    print(f"| mode | kills | standby took over | kill-to-resumed median (s) | max (s) | recovery_s median / max "
          f"(s) | steps rolled back, total (max) | test accuracy vs fault-free ({100 * clean['accuracy']:.2f}%), "
          f"points | orphans, /dev/shm leftovers |")
    print("|---|---|---|---|---|---|---|---|---|")
    for m in results["modes"]:
        d, rb = m["accuracy_delta_points"], m["rolled_back_steps"] or [0]
        print(f"| {m['mode']} | {m['kills']} | {m['standbys_used']} | {m['median_s']:.2f} | {m['max_s']:.2f} | "
              f"{m['reported_median_s']:.2f} / {m['reported_max_s']:.2f} | {sum(rb)} ({max(rb)}) | "
              f"{', '.join(f'{x:+.2f}' for x in d)} | {m['orphans']}, {m['shm_leftovers']} |")
    if results["scenarios"]:
        print()
        print("| case (one standby) | resumed after the fault (s) | test accuracy vs fault-free, points | orphans, /dev/shm leftovers |")
        print("|---|---|---|---|")
    for c in results["scenarios"]:
        print(f"| {c['scenario']} | {', '.join(f'{m:.2f}' for m in c['measured_s']) or 'finished, exit 0'} | "
              f"{c['accuracy_delta_points']:+.2f} | {c['orphans']}, {c['shm_leftovers']} |")
    if o.json:
        with open(o.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
