"""A dsgd job's worker processes as the tests see them: which they are, and slowing one down.
Used by tests/python and tests/tools/dashboard_test.py."""
import os
import signal
import time


def worker_pids(parent=None):
    """The dsgd workers of process `parent` (default: this one), oldest first: its children
    started with --dsgd-worker."""
    parent = os.getpid() if parent is None else parent
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and b"--dsgd-worker" in cmd:
            out.append(int(pid))
    return sorted(out)


def throttle(pid, share, stop, achieved=None):
    """Lets `pid` run `share` of each 100 ms (SIGSTOP, SIGCONT), as a cgroup's cpu.max would,
    until `stop` (a threading.Event) is set or the process is gone. On a loaded machine the sleeps
    overshoot: `achieved` (a dict), when given, gets the share the process was really let run."""
    running = stopped = 0.0
    try:
        while not stop.is_set():
            t0 = time.monotonic()
            os.kill(pid, signal.SIGSTOP)
            time.sleep(0.1 * (1 - share))
            t1 = time.monotonic()
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.1 * share)
            running, stopped = running + time.monotonic() - t1, stopped + t1 - t0
            if achieved is not None:
                achieved["share"] = running / (running + stopped)
    except ProcessLookupError:
        pass  # evicted, or killed
