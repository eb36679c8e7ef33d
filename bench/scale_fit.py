"""docs/SCALE.md's cost model: each of bench/scale.sh's figures as a sum of terms in N (1, N, N^2:
which, per figure, below), fitted to its JSON lines by least squares on relative error (each
point counts alike, small N as much as large), with each measurement against the fit and the fit
carried to 1,000 and 10,000 ranks.
    bench/scale.sh > scale.txt; /usr/bin/python3 bench/scale_fit.py scale.txt
"""
import json
import sys

import numpy as np

# figure, unit, powers of N in its model
FIGURES = [
    ("first_step_s", "s", (0, 1)),     # every worker's process start, over this machine's cores
    ("kill_s", "s", (0, 1, 2)),        # re-formation (N) and the snapshot sent by the driver to each (N)
                                       # while N processes contend for the cores (N^2 on one machine)
    ("hang_s", "s", (0,)),             # the heartbeat timeout
    ("driver_cpu", "core", (0, 1)),    # heartbeats and progress, a rank each
    ("calls_per_s", "calls/s", (0, 1)),
    ("driver_rss_mib", "MiB", (0, 1)),
    ("worker_mib", "MiB", (0, 1)),
]


def fit(xs, ys, powers):
    """Coefficients of N^p for p in powers, least squares on (fit - y) / y."""
    a = np.array([[x ** p / y for p in powers] for x, y in zip(xs, ys)])
    coef, *_ = np.linalg.lstsq(a, np.ones(len(ys)), rcond=None)
    return coef


def show(coef, powers):
    names = {0: "", 1: " N", 2: " N^2"}
    return " + ".join(f"{c:.3g}{names[p]}" for c, p in zip(coef, powers))


def main():
    rows = []
    with open(sys.argv[1]) as f:
        for line in f:
            if line.startswith("{"):
                rows.append(json.loads(line))
    ns = [r["workers"] for r in rows]
    print("| figure | fit (N ranks) | " + " | ".join(f"N={n}: measured / fit" for n in ns) +
          " | N=1,000 | N=10,000 |")
    print("|---|---|" + "---|" * len(ns) + "---|---|")
    worst = 0.0
    for key, unit, powers in FIGURES:
        pts = [(r["workers"], r[key]) for r in rows if key in r]
        coef = fit([p[0] for p in pts], [p[1] for p in pts], powers)
        model = lambda n: sum(c * n ** p for c, p in zip(coef, powers))  # noqa: E731
        cells = []
        for n, y in pts:
            predicted = model(n)
            ratio = y / predicted if predicted else float("nan")
            worst = max(worst, abs(ratio - 1))
            cells.append(f"{y:.3g} / {predicted:.3g}")
        print(f"| {key} ({unit}) | {show(coef, powers)} | " + " | ".join(cells) +
              f" | {model(1000):.3g} | {model(10000):.3g} |")
    print(f"\nworst measurement against its fit: {100 * worst:.0f}% off")


if __name__ == "__main__":
    main()
