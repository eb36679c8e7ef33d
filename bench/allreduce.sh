#!/usr/bin/env bash
# Allreduce across local processes, side by side in one run: dsgd's shared-memory path (shm,
# zero-copy), dsgd over Gloo TCP (ring, auto), plain Gloo (its AllreduceRingChunked class,
# bench/peers/gloo_allreduce.cpp), OpenMPI's MPI_Allreduce (vader shared memory),
# and a one-core memcpy / sum bandwidth probe. Each in its default placement: dsgd shm pins rank r
# to core r % cores, Gloo ranks are not pinned, OpenMPI binds as it does by default. Prints a markdown table of algorithm bandwidth
# (GB/s) and latency per size, for each process count.
#   bench/allreduce.sh [PROCS...]        (default: 2 4)
#   WRITE_DOCS=1 bench/allreduce.sh      also replace the tables in docs/BENCHMARKS.md (between
#                                        the allreduce-tables markers; DOC=path for another file)
#                                        and draw docs/img/allreduce-busbw.png (gnuplot)
# Needs a built tree (make build: dsgd and dsgd_gloo_peer), mpicc and mpirun (openmpi-bin,
# libopenmpi-dev).
set -euo pipefail
cd "$(dirname "$0")/.."
procs=("${@:-2 4}")
read -r -a procs <<<"${procs[*]}"
dsgd=${DSGD:-build/dsgd}
out=build/bench-peers
mkdir -p "$out"
mpicc -O2 -o "$out/mpi_allreduce" bench/peers/mpi_allreduce.c
cc -O3 -o "$out/memcpy_bw" bench/peers/memcpy_bw.c
sizes=(4 4096 65536 1048576 16777216 104857600)
iters=${ITERS:-20}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

report=$tmp/report.md
exec 3>&1 >"$report"   # the report goes to a file, then to stdout (and the docs)
read -r copy sum < <("$out/memcpy_bw" 104857600)
echo "$(date +%F), \`bench/allreduce.sh ${procs[*]}\`, $iters timed runs per size."
echo "memcpy probe (one core, 100 MB): copy $copy GB/s, a[i] += b[i] $sum GB/s"
for n in "${procs[@]}"; do
  for algo in shm ring auto; do
    "$dsgd" bench allreduce --procs "$n" --algo "$algo" --iters "$iters" --bytes "${sizes[@]}" --json >"$tmp/dsgd-$algo-$n.json"
  done
  mpirun --allow-run-as-root --oversubscribe -np "$n" "$out/mpi_allreduce" "$iters" "${sizes[@]}" >"$tmp/mpi-$n.txt"
  rm -rf "$tmp/gloo-store" && mkdir -p "$tmp/gloo-store"
  pids=()
  for r in $(seq 1 $((n - 1))); do
    build/dsgd_gloo_peer "$r" "$n" "$tmp/gloo-store" chunked "$iters" "${sizes[@]}" >/dev/null &
    pids+=($!)
  done
  build/dsgd_gloo_peer 0 "$n" "$tmp/gloo-store" chunked "$iters" "${sizes[@]}" >"$tmp/gloo-$n.txt"
  wait "${pids[@]}"
done

/usr/bin/python3 - "$tmp" "${procs[@]}" <<'PY'
import json, sys
tmp, procs = sys.argv[1], sys.argv[2:]
def fmt(b):
    if b >= 1 << 20 and b % (1 << 20) == 0: return f"{b >> 20} MiB"
    if b >= 1e6: return f"{b / 1e6:g} MB"
    if b >= 1024 and b % 1024 == 0: return f"{b >> 10} KiB"
    return f"{b} B"
for n in procs:
    rows = {}
    for algo in ("shm", "ring", "auto"):
        for r in json.load(open(f"{tmp}/dsgd-{algo}-{n}.json"))["results"]:
            rows.setdefault(r["bytes"], {})[algo] = (r["algbw_gbps"], r["latency_us"])
    for peer in ("mpi", "gloo"):
        for line in open(f"{tmp}/{peer}-{n}.txt"):
            b, lat, algbw, _ = line.split()
            rows.setdefault(int(float(b)), {})[peer] = (float(algbw), float(lat))
    print(f"\n{n} processes: algorithm bandwidth GB/s (latency us)\n")
    print("| bytes | dsgd shm | dsgd gloo ring | dsgd gloo auto | plain Gloo (ring chunked) | OpenMPI | shm / MPI |")
    print("|---|---|---|---|---|---|---|")
    for b in sorted(rows):
        r = rows[b]
        cell = lambda k: f"{r[k][0]:.3f} ({r[k][1]:.1f})" if k in r else "-"
        ratio = f"{r['mpi'][1] / r['shm'][1]:.2f}x" if "shm" in r and "mpi" in r else "-"  # = bandwidth ratio
        print(f"| {fmt(b)} | {cell('shm')} | {cell('ring')} | {cell('auto')} | {cell('gloo')} | {cell('mpi')} | {ratio} |")
    # For the plot: bus bandwidth (algorithm bandwidth x 2(n-1)/n, what each rank's link carries).
    with open(f"{tmp}/busbw-{n}.dat", "w") as out:
        f = 2 * (int(n) - 1) / int(n)
        for b in sorted(rows):
            out.write(f"{b} " + " ".join(f"{rows[b][k][0] * f:.4f}" if k in rows[b] else "NaN"
                                         for k in ("shm", "ring", "gloo", "mpi")) + "\n")
PY
exec 1>&3
cat "$report"
if [[ "${WRITE_DOCS:-0}" == 1 ]]; then
  bench/write_docs.py allreduce-tables "$report"
  # Bus bandwidth against size, a panel per process count, with the one-core memcpy line.
  {
    echo "set terminal pngcairo noenhanced size $((480 * ${#procs[@]})),360 font 'sans,9'"
    echo "set output 'docs/img/allreduce-busbw.png'"
    echo "set multiplot layout 1,${#procs[@]} title 'Allreduce bus bandwidth: $(date +%F), bench/allreduce.sh ${procs[*]}, $iters timed runs'"
    echo "set logscale x 2; set logscale y; set grid; set key bottom right; set xlabel 'bytes'; set ylabel 'GB/s'"
    echo "set xtics ('4 B' 4, '4 KiB' 4096, '64 KiB' 65536, '1 MiB' 1048576, '16 MiB' 16777216, '100 MiB' 104857600)"
    for n in "${procs[@]}"; do
      echo "set title '$n processes'"
      echo "plot '$tmp/busbw-$n.dat' using 1:2 with linespoints lw 2 title 'dsgd shm', \
        '' using 1:3 with linespoints title 'dsgd gloo ring', '' using 1:4 with linespoints title 'plain Gloo', \
        '' using 1:5 with linespoints lw 2 title 'OpenMPI', $copy with lines dt 2 lc 'black' title 'memcpy, one core'"
    done
    echo "unset multiplot"
  } >"$tmp/plot.gp"
  gnuplot "$tmp/plot.gp"
fi
