"""How dsgd's driver and control plane grow with the number of ranks: bench/scale.sh's measurement.

For each N: `dsgd train` with the simulated model (each step sleeps SIM_MS of "compute"; gradients
of PARAMS floats) on N workers over N / PER_HOST pseudo-hosts with one standby, scraped through
its Prometheus endpoint. Per N it records
  first_step_s   launch to the first step the driver hears of (heartbeats: up to 1 s late)
  step_ms        seconds per step at a steady pace, over WINDOW s
  model_ms       what the step should take on this machine: the largest of the compute (SIM_MS),
                 the allreduce of the gradient alone (`dsgd bench allreduce`, same ranks and
                 pseudo-hosts) and the CPU the N workers burn per step over this machine's cores
  driver_cpu     the driver's share of one core over the window, and its resident memory
  calls_per_s    control-plane calls (heartbeats, commands, rendezvous) per second
  worker_mib     a worker's unique memory (private pages; what one more rank costs)
  kill_s         kill -9 of one member to training resumed (the recovery's recovery_s)
  hang_s         SIGSTOP of one member to its detection (the recovery's detect_s)
and prints one JSON line per N (for docs/SCALE.md's fit) and a table at the end. TRAIN_FLAGS adds
flags to every `dsgd train` (e.g. --no-tls).
"""
import json
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from worker_processes import worker_pids  # noqa: E402  (a job's worker processes, as the tests find them)

DSGD = os.environ.get("DSGD_BINARY", "build/dsgd")
SIM_MS = float(os.environ.get("SIM_MS", "50"))
PARAMS = int(os.environ.get("PARAMS", "100000"))
PER_HOST = int(os.environ.get("PER_HOST", "8"))
WINDOW = float(os.environ.get("WINDOW", "15"))
HEARTBEAT_MS = int(os.environ.get("HEARTBEAT_MS", "3000"))
CORES = os.cpu_count()
TICK = os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port):
    """{family or family{labels}: value} from the driver's /metrics; None while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def members(m):
    """pids of the workers in the group, from the per-worker series."""
    return sorted(int(k.split('pid="')[1].split('"')[0]) for k in m
                  if k.startswith("dsgd_worker_step{") and 'role="member"' in k)


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rollup(pid):
    """(private MiB, resident MiB) of a process."""
    private = rss = 0
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            k, v = line.split(":", 1)
            if k in ("Private_Clean", "Private_Dirty"):
                private += int(v.split()[0])
            elif k == "Rss":
                rss += int(v.split()[0])
    return private / 1024, rss / 1024


def wait_for(port, what, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = scrape(port)
        if m is not None and what(m):
            return m
        time.sleep(0.1)
    raise SystemExit(f"scale.py: gave up after {timeout:.0f} s waiting for {what.__doc__}")


def allreduce_ms(n, hosts):
    """The allreduce of the gradient alone among n forked ranks on `hosts` pseudo-hosts."""
    r = subprocess.run([DSGD, "bench", "allreduce", "--procs", str(n), "--hosts", str(hosts), "--algo",
                        "hier" if hosts > 1 else "shm", "--bytes", str(4 * PARAMS), "--iters", "10", "--json"],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        print(f"  (bench allreduce on {n} ranks failed: {r.stderr.strip()[-200:]})", file=sys.stderr)
        return float("nan")
    return json.loads(r.stdout)["results"][0]["latency_us"] / 1000


def run(n):
    hosts = max(1, math.ceil(n / PER_HOST))
    port = free_port()
    out = tempfile.mkdtemp(prefix="dsgd-scale-")
    batch = 4 * n
    cmd = [DSGD, "train", "--model", "simulated", "--dataset", "synthetic", "--synthetic-samples", str(batch * 50),
           "--epochs", "1000", "--workers", str(n), "--local-hosts", str(hosts), "--standby", "1",
           "--threads", "1", "--batch-size", str(batch), "--heartbeat-timeout-ms", str(HEARTBEAT_MS),
           "--config", json.dumps({"sim_parameters": PARAMS, "sim_step_ms": SIM_MS, "synthetic_image_size": 8}),
           "--metrics-port", str(port), "--json-out", f"{out}/run.json"]
    cmd += shlex.split(os.environ.get("TRAIN_FLAGS", ""))
    t0 = time.monotonic()
    log = open(f"{out}/driver.log", "w")
    driver = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    row = {"workers": n, "hosts": hosts}
    try:
        wait_for(port, lambda m: m.get("dsgd_step", 0) >= 1, 600)
        row["first_step_s"] = time.monotonic() - t0
        # Steady: the standby ready, a few chunks done.
        m0 = wait_for(port, lambda m: m.get("dsgd_standbys", 0) >= 1 and m.get("dsgd_steps_total", 0) >= 20, 600)
        workers = worker_pids(driver.pid)
        c0, w0, s0 = cpu_s(driver.pid), sum(cpu_s(w) for w in workers), time.monotonic()
        time.sleep(WINDOW)
        m1 = scrape(port)
        c1, w1, s1 = cpu_s(driver.pid), sum(cpu_s(w) for w in workers), time.monotonic()
        steps = m1["dsgd_step"] - m0["dsgd_step"]
        row["step_ms"] = 1000 * (s1 - s0) / steps
        row["worker_cpu_ms_per_step"] = 1000 * (w1 - w0) / steps
        row["driver_cpu"] = (c1 - c0) / (s1 - s0)
        row["calls_per_s"] = (m1["dsgd_control_calls_total"] - m0["dsgd_control_calls_total"]) / (s1 - s0)
        row["driver_rss_mib"] = rollup(driver.pid)[1]
        sample = members(m1)[:4]
        row["worker_mib"] = sum(rollup(p)[0] for p in sample) / len(sample)
        row["worker_rss_mib"] = sum(rollup(p)[1] for p in sample) / len(sample)
        # A member killed: a standby takes its place.
        os.kill(members(m1)[n // 2], signal.SIGKILL)
        wait_for(port, lambda m: m.get("dsgd_recoveries_total", 0) >= 1 and m.get("dsgd_standbys", 0) >= 1, 600)
        m2 = wait_for(port, lambda m: m.get("dsgd_workers", 0) == n, 600)
        # A member hung: found by its missed heartbeats.
        hung = members(m2)[n // 3]
        os.kill(hung, signal.SIGSTOP)
        wait_for(port, lambda m: m.get("dsgd_recoveries_total", 0) >= 2, 600)
        try:
            os.kill(hung, signal.SIGKILL)  # the driver has, in local mode
        except ProcessLookupError:
            pass
        wait_for(port, lambda m: m.get("dsgd_step", 0) > m2["dsgd_step"] + 5, 600)
    finally:
        driver.send_signal(signal.SIGINT)
        try:
            driver.wait(timeout=120)
        except subprocess.TimeoutExpired:
            driver.kill()
            driver.wait()
        log.close()
    with open(f"{out}/run.json") as f:
        summary = json.load(f)
    recoveries = [r for r in summary["recoveries"] if r["kind"] == "recovery"]
    if len(recoveries) >= 2:
        row["kill_s"] = recoveries[0]["recovery_s"]
        row["hang_s"] = recoveries[1]["detect_s"]
        row["hang_recovery_s"] = recoveries[1]["recovery_s"]
    row["allreduce_ms"] = allreduce_ms(n, hosts)
    row["model_ms"] = max(SIM_MS, row["allreduce_ms"], row["worker_cpu_ms_per_step"] / CORES)
    row["log"] = f"{out}/driver.log"
    return row


def main():
    sizes = [int(a) for a in sys.argv[1:]] or [8, 16, 32, 64, 128]
    rows = []
    for n in sizes:
        print(f"scale: {n} workers ...", file=sys.stderr, flush=True)
        row = run(n)
        print(json.dumps(row), flush=True)
        rows.append(row)
    print(f"\nsimulated model: {PARAMS} gradient floats, {SIM_MS:.0f} ms compute a step; {PER_HOST} workers "
          f"a pseudo-host; 1 standby; heartbeat timeout {HEARTBEAT_MS} ms; {CORES} cores")
    head = ("workers", "first step s", "step ms", "model ms", "driver %core", "driver MiB", "calls/s",
            "worker MiB", "kill->resumed s", "hang found s")
    print(" | ".join(head))
    for r in rows:
        print(" | ".join([f"{r['workers']}", f"{r['first_step_s']:.1f}", f"{r['step_ms']:.0f}",
                          f"{r['model_ms']:.0f}", f"{100 * r['driver_cpu']:.1f}", f"{r['driver_rss_mib']:.0f}",
                          f"{r['calls_per_s']:.0f}", f"{r['worker_mib']:.0f}", f"{r.get('kill_s', float('nan')):.2f}",
                          f"{r.get('hang_s', float('nan')):.2f}"]))


if __name__ == "__main__":
    main()
