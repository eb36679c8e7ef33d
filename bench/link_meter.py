#!/usr/bin/python3
"""How busy bench/cluster.sh's links are during a run: each host's eth0 byte counters, sampled.

bench/cluster.sh starts it beside a run (LINK_BUSY=1) and stops it with SIGTERM when the run
ends. It then prints one JSON object for the busiest link and direction:

  {"busy": 0.91, "bytes_per_s": 56.9e6, "link": "dsgdc123-h2 tx"}

"busy" is the bytes the link carried (Ethernet frames, as tc tbf counts them) over what its rate
allows in the same time. The window is the middle half of the run's traffic (from the first to
the last sample in which some link moved more than 5% of its rate) less its first and last fifth,
so start-up (connections, the initial parameter broadcast) and the end stay out of it. The link
is the one that carried the most bytes over the whole run.

  bench/link_meter.py RATE_GBIT NAMESPACE...

Reads /proc/thread-self/net/dev after setns(2) into each namespace (/run/netns/NAME): one
process, no command per sample, so it takes little from the 2 cores it measures. Needs root.
"""
import ctypes
import json
import os
import signal
import sys
import time

CLONE_NEWNET = 0x40000000
INTERVAL_S = 0.05


def eth0_bytes():
    with open("/proc/thread-self/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == "eth0":
                fields = rest.split()
                return int(fields[0]), int(fields[8])  # received, transmitted
    raise RuntimeError("no eth0 in this namespace")


def main():
    rate = float(sys.argv[1]) * 1e9 / 8  # bytes/s
    names = sys.argv[2:]
    libc = ctypes.CDLL(None, use_errno=True)
    fds = [os.open(f"/run/netns/{n}", os.O_RDONLY) for n in names]
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    samples = []  # (time, [(rx, tx) per namespace])
    while not stop:
        row = []
        for fd in fds:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns")
            row.append(eth0_bytes())
        samples.append((time.monotonic(), row))
        time.sleep(INTERVAL_S)
    links = [(n, d) for n in names for d in ("rx", "tx")]

    def rates(a, b):
        dt = samples[b][0] - samples[a][0]
        return [(samples[b][1][i][j] - samples[a][1][i][j]) / dt for i in range(len(names)) for j in (0, 1)]

    active = [k for k in range(1, len(samples)) if max(rates(k - 1, k)) > 0.05 * rate]
    if len(active) < 4:
        print(json.dumps({"busy": None, "bytes_per_s": None, "link": None}))
        return
    first, last = active[0], active[-1]
    a, b = first + (last - first) // 5, last - (last - first) // 5
    r = rates(a, b)
    # The busiest link by the whole run's bytes: picking the largest of the window's rates would
    # favour whichever link the window's edges happened to catch mid-burst.
    whole = rates(0, len(samples) - 1)
    i = max(range(len(whole)), key=lambda k: whole[k])
    print(json.dumps({"busy": r[i] / rate, "bytes_per_s": r[i], "link": f"{links[i][0]} {links[i][1]}"}))


if __name__ == "__main__":
    main()
