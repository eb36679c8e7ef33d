#!/usr/bin/env bash
# Samples/s per system, one panel per workload, from bench/train_peers.sh's RESULTS_JSON: bars at
# the median, error bars from the slowest to the fastest repeat.
#   bench/plot_peers.sh RESULTS.json OUT.png "TITLE"      (needs gnuplot: gnuplot-nox)
set -euo pipefail
results=$1 png=$2 title=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
/usr/bin/python3 - "$results" "$tmp" <<'PY'
import json, sys
d, tmp = json.load(open(sys.argv[1])), sys.argv[2]
workloads = list(d["throughput"])
open(f"{tmp}/workloads", "w").write(" ".join(workloads) + "\n")
for w in workloads:
    with open(f"{tmp}/{w}.dat", "w") as out:
        for i, (name, r) in enumerate(d["throughput"][w].items()):
            out.write(f"{i} {name} {r['median']:.1f} {min(r['runs']):.1f} {max(r['runs']):.1f}\n")
PY
read -r -a workloads <"$tmp/workloads"
{
  echo "set terminal pngcairo noenhanced size $((480 * ${#workloads[@]})),380 font 'sans,9'"
  echo "set output '$png'"
  echo "set multiplot layout 1,${#workloads[@]} title '$title'"
  echo "set style fill solid 0.6; set boxwidth 0.7; set grid ytics; set yrange [0:*]; unset key"
  echo "set ylabel 'samples/s'; set xtics rotate by -40 left"
  for w in "${workloads[@]}"; do
    echo "set title '$w'"
    echo "plot '$tmp/$w.dat' using 1:3:xtic(2) with boxes lc 'steelblue', '' using 1:3:4:5 with yerrorbars lc 'black' pt 0"
  done
  echo "unset multiplot"
} >"$tmp/plot.gp"
gnuplot "$tmp/plot.gp"
echo "wrote $png" >&2
