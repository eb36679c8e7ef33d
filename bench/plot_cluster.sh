#!/usr/bin/env bash
# Scaling efficiency against hosts, one panel per link rate, from bench/cluster.sh's JSON rows:
# measured allreduce, ps (one shard per host) and simple, with allreduce's two bounds dashed and,
# where the rows have it, allreduce on unshaped links (this machine's own floor) dotted.
#   bench/plot_cluster.sh ROWS.jsonl OUT.png      (needs gnuplot: gnuplot-nox)
set -euo pipefail
rows=$1 png=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# One data file per rate: hosts, then efficiency of allreduce, ps-h, simple, bound, backward-overlap
# bound, unshaped allreduce.
/usr/bin/python3 - "$rows" "$tmp" <<'PY'
import json, sys
rows, tmp = [json.loads(l) for l in open(sys.argv[1])], sys.argv[2]
rates = sorted({r["gbit"] for r in rows if r["gbit"] > 0})
open(f"{tmp}/rates", "w").write(" ".join(f"{g:g}" for g in rates) + "\n")
for g in rates:
    with open(f"{tmp}/{g:g}.dat", "w") as out:
        for h in sorted({r["hosts"] for r in rows if r["gbit"] == g}):
            by = {r["config"]: r for r in rows if r["gbit"] == g and r["hosts"] == h}
            t = next(iter(by.values()))["compute_ms"]
            b, bw = 4 * next(iter(by.values()))["parameters"], g * 1e9 / 8
            comm = 1000 * 2 * (h - 1) / h * b / bw
            bwd = 2 / 3 * float(next(iter(by.values())).get("sim_step_ms", 52))
            eff = lambda c: f"{t / by[c]['step_ms']:.3f}" if c in by else "NaN"
            floor = [r for r in rows if r["gbit"] == 0 and r["hosts"] == h and r["config"] == "allreduce"]
            floor_eff = f"{floor[0]['compute_ms'] / floor[0]['step_ms']:.3f}" if floor else "NaN"
            out.write(f"{h} {eff('allreduce')} {eff(f'ps{h}')} {eff('simple')} {t / max(t, comm):.3f} "
                      f"{t / (t + max(0, comm - bwd)):.3f} {floor_eff}\n")
PY
read -r -a rates <"$tmp/rates"
{
  echo "set terminal pngcairo size $((360 * ${#rates[@]})),440 font 'sans,9'"
  echo "set output '$png'"
  echo "set multiplot layout 1,${#rates[@]} title 'Simulated cluster: scaling efficiency (one worker alone / step time), 32 samples per worker'"
  echo "set yrange [0:1.05]; set xrange [1.5:8.5]; set xtics (2, 4, 8); set grid; set key below"
  echo "set xlabel 'hosts'; set ylabel 'efficiency'"
  for g in "${rates[@]}"; do
    echo "set title '$g Gbit/s links'"
    echo "plot '$tmp/$g.dat' using 1:2 with linespoints lw 2 title 'allreduce', \
      '' using 1:3 with linespoints lw 2 title 'ps, a shard per host', \
      '' using 1:4 with linespoints lw 2 title 'simple', \
      '' using 1:5 with lines dt 2 lc 'black' title 'bound, allreduce', \
      '' using 1:6 with lines dt 3 lc 'black' title 'backward-overlap bound', \
      '' using 1:7 with linespoints dt 3 pt 1 lc 'gray40' title 'allreduce, unshaped (this machine)'"
  done
  echo "unset multiplot"
} >"$tmp/plot.gp"
gnuplot "$tmp/plot.gp"
echo "wrote $png" >&2
