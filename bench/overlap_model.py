#!/usr/bin/python3
"""What the forward overlap's schedule can reach with no overheads at all: a model of one step.

bench/cluster.sh measures the step; this says what the schedule itself allows, so a table's
"step / bound" can be read as schedule plus machine. The model, per step of synchronous SGD:

  - backward produces N buckets, bucket b (0 = the last layer's) after (b + 1) * bwd / N;
  - one link carries them one at a time, C / N each (C: the strategy's communication time at
    the link's rate, bench/cluster.sh's formula), in the schedule's launch order; a deferred
    bucket goes only after backward (strategy::overlap_schedule);
  - the next forward starts when backward ends (with T = 0, when every bucket has arrived) and
    runs the layers first to last, fwd / N per bucket, each waiting for its bucket to arrive;
  - the next backward starts when forward ends.

Two schedules of T deferred buckets: "tail", the last T (the first layers'; dsgd before
2026-11-23), and "spread", T spread evenly over buckets 1..N-1 (dsgd now). No order can beat
C + (fwd + bwd) / N where the links are the limit: the link idles at least while forward runs
the last layers after their bucket arrives and backward produces its first bucket.

  bench/overlap_model.py [BUCKETS...]      (default: 16, bench/cluster.sh's 256 KiB buckets)

Prints, per host count and link rate, the best T of each schedule and its step over
bench/cluster.sh's bound max(compute, C).
"""
import sys

STEP_MS = 52.0          # bench/cluster.sh's simulated step: forward 1/3, backward 2/3
FWD, BWD = STEP_MS / 3, STEP_MS * 2 / 3
GRADIENT_BYTES = 4.096e6  # 1.024M float32 parameters


def deferred_set(schedule, n, t):
    if t >= n:
        return set(range(n))
    if schedule == "tail":
        return set(range(n - t, n))
    return {1 + i * (n - 1) // t for i in range(t)}  # strategy::overlap_schedule


def step_ms(n, deferred, comm_ms, steps=30):
    """Steady-state period of the schedule: the mean over the last 10 of `steps` steps."""
    b1, fb, c = BWD / n, FWD / n, comm_ms / n
    order = [b for b in range(n) if b not in deferred] + sorted(deferred, reverse=True)
    start, link, starts = 0.0, 0.0, []
    for _ in range(steps):
        starts.append(start)
        arrive = {}
        for b in order:
            ready = start + (n if b in deferred else b + 1) * b1
            link = max(link, ready) + c
            arrive[b] = link
        t = start + BWD if deferred else max(start + BWD, max(arrive.values()))
        for b in range(n - 1, -1, -1):
            t = max(t, arrive[b]) + fb
        start = t
    return (starts[-1] - starts[-11]) / 10


def allreduce_ms(hosts, gbit):
    return 2 * (hosts - 1) / hosts * GRADIENT_BYTES * 8 / (gbit * 1e9) * 1e3


def main():
    for n in [int(a) for a in sys.argv[1:]] or [16]:
        print(f"{n} buckets, allreduce, {STEP_MS:g} ms step (forward 1/3, backward 2/3): step / bound at the best T")
        print("| hosts | link Gbit/s | communication ms | bound ms | T = 0 | tail: best T | step / bound "
              "| spread: best T | step / bound | floor: C + step / N |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for hosts in (2, 4, 8):
            for gbit in (0.5, 1, 2):
                comm = allreduce_ms(hosts, gbit)
                bound = max(comm, STEP_MS)
                best = {}
                for schedule in ("tail", "spread"):
                    times = {t: step_ms(n, deferred_set(schedule, n, t), comm) for t in range(n + 1)}
                    t = min(times, key=lambda k: (round(times[k], 6), k))
                    best[schedule] = (t, times[t] / bound)
                floor = max(bound, comm + STEP_MS / n) / bound
                print(f"| {hosts} | {gbit:g} | {comm:.1f} | {bound:.1f} | {step_ms(n, set(), comm) / bound:.2f} "
                      f"| {best['tail'][0]} | {best['tail'][1]:.2f} | {best['spread'][0]} | {best['spread'][1]:.2f} "
                      f"| {floor:.2f} |")
        print()


if __name__ == "__main__":
    main()
