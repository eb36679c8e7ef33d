#!/usr/bin/python3
"""Where a step's communication pauses, from a `dsgd train --trace` file.

A step runs from one "forward" span's start to the next one's. Communication is every span on a
worker's communication threads (each allreduce, push and pull, on every lane); the step's idle
time is the part of it with none of them in flight on that worker, and its gaps are those
stretches, the longest first. On a link that is the limit, that idle time is what the step loses
to the schedule and to the CPU work around it (docs/BENCHMARKS.md).

  bench/trace_gaps.py TRACE.json [SKIP]    (SKIP: leading steps left out, default 5)

Prints, per worker, medians over the steps: the step, its idle time, its longest gap and the
phases of the replica's own thread (forward, backward, optimizer; each with the waits for buckets
inside it, which "waits" also sums on its own).
"""
import json
import statistics
import sys


def merged(intervals):
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def gaps(busy, a, b):
    """Stretches of [a, b) outside the merged `busy` intervals."""
    out, cur = [], a
    for s, e in busy:
        if e <= cur:
            continue
        if s >= b:
            break
        if s > cur:
            out.append(s - cur)
        cur = max(cur, e)
    if cur < b:
        out.append(b - cur)
    return out


def main():
    path = sys.argv[1]
    skip = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    events = json.load(open(path))["traceEvents"]
    rows, names = {}, {}
    for e in events:
        if e["ph"] == "M" and e["name"] == "thread_name":
            rows[(e["pid"], e["tid"])] = e["args"]["name"]
        if e["ph"] == "M" and e["name"] == "process_name":
            names[e["pid"]] = e["args"]["name"]
    print(f"{path}: medians over the steps after the first {skip} (ms)")
    print("| worker | steps | step | no communication in flight | longest gap | forward | backward | optimizer | waits |")
    print("|---|---|---|---|---|---|---|---|---|")
    for pid in sorted(names):
        mine = [e for e in events if e["ph"] == "X" and e["pid"] == pid]
        replica = [e for e in mine if rows.get((pid, e["tid"]), "").startswith("replica")]
        comm = merged((e["ts"], e["ts"] + e["dur"]) for e in mine
                      if not rows.get((pid, e["tid"]), "").startswith("replica"))
        starts = sorted(e["ts"] for e in replica if e["name"] == "forward")[skip:]
        steps, idle, longest, phase = [], [], [], {k: [] for k in ("forward", "backward", "optimizer", "waits")}
        for a, b in zip(starts, starts[1:]):
            g = gaps(comm, a, b)
            steps.append((b - a) / 1e3)
            idle.append(sum(g) / 1e3)
            longest.append(max(g, default=0) / 1e3)
            inside = [e for e in replica if a <= e["ts"] < b]
            for k in ("forward", "backward", "optimizer"):
                phase[k].append(sum(e["dur"] for e in inside if e["name"] == k) / 1e3)
            phase["waits"].append(sum(e["dur"] for e in inside if e["name"].startswith("wait")) / 1e3)
        if not steps:
            print(f"| {names[pid]} | 0 | | | | | | | |")
            continue
        m = statistics.median
        print(f"| {names[pid]} | {len(steps)} | {m(steps):.1f} | {m(idle):.1f} | {m(longest):.1f} | "
              + " | ".join(f"{m(phase[k]):.1f}" for k in ("forward", "backward", "optimizer", "waits")) + " |")


if __name__ == "__main__":
    main()
