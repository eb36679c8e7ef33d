#!/usr/bin/env bash
# Two steps of one worker from `dsgd train --trace` files, one panel per file on one time scale:
# the replica's thread (forward, backward, the optimizer; waits for buckets in red) above its
# communication threads (each operation a box, labelled with its bucket).
#   bench/plot_trace.sh OUT.png TRACE.json[=TITLE]...      (needs gnuplot: gnuplot-nox)
# Env: STEP (the first step drawn, default 10), WORKER (default 0).
set -euo pipefail
png=$1
shift
[[ $# -ge 1 ]] || { echo "usage: bench/plot_trace.sh OUT.png TRACE.json[=TITLE]..." >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Per panel: boxes.dat (x0 x1 y0 y1 color), labels.dat (x y text), rows (y:name,...), span (ms).
/usr/bin/python3 - "$tmp" "${STEP:-10}" "${WORKER:-0}" "$@" <<'PY'
import json, sys
tmp, first, worker, panels = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
colors = {"forward": 0x4477aa, "backward": 0x228833, "optimizer": 0xccbb44, "next batch": 0xbbbbbb,
          "deferred step": 0xccbb44, "wait": 0xee6677, "wait for every bucket": 0xee6677}
longest = 0
for k, arg in enumerate(panels):
    path, _, title = arg.partition("=")
    ev = json.load(open(path))["traceEvents"]
    rows = {e["tid"]: e["args"]["name"] for e in ev
            if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == worker}
    starts = sorted(e["ts"] for e in ev if e.get("name") == "forward" and e["pid"] == worker)
    if len(starts) < first + 3:
        sys.exit(f"{path}: {len(starts)} steps of worker {worker}; STEP={first} needs {first + 3}")
    a, b = starts[first], starts[first + 2]
    longest = max(longest, (b - a) / 1e3)
    order = sorted(rows, key=lambda t: (not rows[t].startswith("replica"), t))
    y = {t: len(order) - i for i, t in enumerate(order)}
    with open(f"{tmp}/{k}.boxes", "w") as boxes, open(f"{tmp}/{k}.labels", "w") as labels:
        for e in ev:
            if e["ph"] != "X" or e["pid"] != worker or e["tid"] not in y:
                continue
            s, f = (e["ts"] - a) / 1e3, (e["ts"] + e["dur"] - a) / 1e3
            if f < 0 or s >= (b - a) / 1e3:
                continue
            replica = rows[e["tid"]].startswith("replica")
            name = e["name"]
            color = colors.get(name, 0x66ccee if not replica else 0xaaaaaa)
            h = 0.35 if (replica and name.startswith("wait")) or name == "deferred step" else 0.3
            boxes.write(f"{max(s, 0):.3f} {f:.3f} {y[e['tid']] - h:.2f} {y[e['tid']] + h:.2f} {color}\n")
            bucket = e.get("args", {}).get("bucket")
            if not replica and bucket is not None and name.find("shm") < 0 and f - s > 1.5:
                labels.write(f"{(max(s, 0) + f) / 2:.3f} {y[e['tid']]} {bucket}\n")
    with open(f"{tmp}/{k}.meta", "w") as meta:
        ytics = ", ".join(f'"{rows[t]}" {y[t]}' for t in order)
        meta.write(f"{len(order)}\n{ytics}\n{title or path}\n")
open(f"{tmp}/span", "w").write(f"{longest:.1f}\n")
PY
span=$(cat "$tmp/span")
n=$#
{
  echo "set terminal pngcairo size 1100,$((200 * n + 60)) font ',9'"
  echo "set output '$png'"
  echo "set multiplot layout $n,1"
  echo "set xrange [0:$span]"
  echo "set style fill solid 0.9 noborder"
  for k in $(seq 0 $((n - 1))); do
    mapfile -t meta <"$tmp/$k.meta"
    echo "set title \"${meta[2]}\""
    echo "set yrange [0.4:${meta[0]}.6]"
    echo "set ytics (${meta[1]})"
    [[ $k -eq $((n - 1)) ]] && echo "set xlabel 'ms from the start of a step (two steps)'"
    labels=""
    [[ -s "$tmp/$k.labels" ]] && labels=", '$tmp/$k.labels' using 1:2:3 with labels font ',7' notitle"
    echo "plot '$tmp/$k.boxes' using ((\$1+\$2)/2):((\$3+\$4)/2):1:2:3:4:5 with boxxyerror lc rgb variable notitle$labels"
  done
  echo "unset multiplot"
} >"$tmp/plot.gp"
/usr/bin/gnuplot "$tmp/plot.gp"
echo "wrote $png" >&2
