#!/usr/bin/env bash
# ZeRO stages 1 to 3 (step.zero_stage) against plain allreduce and against PyTorch's
# ZeroRedundancyOptimizer (stage 1), side by side in one run, on PyTorch's recipe: 20 x Linear(2000, 2000),
# Adam, 2 ranks of one thread, global batch 20. dsgd runs each stage ROUNDS times (interleaved,
# fresh workers each run), PyTorch each once (its steps are slow here). Prints both sides' seconds
# per step, largest per-rank peak RSS (VmHWM: counts every shared page a rank touched whole) and
# peak PSS (sampled every 100 ms: a page shared by n processes counts 1/n in each, so dsgd's
# shared-memory gradient regions count once over the ranks), and dsgd's saving against the formula;
# step-time ratios of the best runs and of the medians.
#   bench/zero.sh [ROUNDS]            (default 3; RESULTS_JSON=FILE also writes dsgd's runs)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
bench=${DSGD_ZERO_BENCH:-build/dsgd_zero_bench}
py=/usr/bin/python3
[ -x "$bench" ] || { echo "zero.sh: $bench not built (make build)"; exit 1; }
$py -c 'import torch' 2>/dev/null || { echo "zero.sh: $py lacks torch (scripts/install-deps.sh)"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
OMP_NUM_THREADS=1 "$bench" --workers 2 --rounds "$rounds" --json "$tmp/dsgd.json" 2>/dev/null | grep -v '^\['
OMP_NUM_THREADS=1 $py bench/peers/zero_peer.py --world-size 2 > "$tmp/peer.json"
[ -n "${RESULTS_JSON:-}" ] && cp "$tmp/dsgd.json" "$RESULTS_JSON"
$py - "$tmp/dsgd.json" "$tmp/peer.json" <<'PY'
import json, sys
d, p = (json.load(open(f)) for f in sys.argv[1:3])
def best(runs, zero, key):
    vals = [r[key] for r in runs if r["zero"] == zero]
    return min(vals) if vals else float("nan")
stages = (0, 1, 2, 3)
print("| | " + " | ".join(f"s/step zero {z}" for z in stages) + " | peak RSS MiB zero " +
      " / ".join(map(str, stages)) + " | peak PSS MiB zero " + " / ".join(map(str, stages)) + " |")
print("|---" * (len(stages) + 3) + "|")
for name, runs in (("dsgd", d["runs"]), ("PyTorch DDP + ZeroRedundancyOptimizer (stage 1)", p["runs"])):
    cells = [f"{best(runs, z, 'step_s'):.3f}" for z in stages] + \
            [" / ".join(f"{best(runs, z, k):.0f}" for z in stages) for k in ("peak_rss_mib", "peak_pss_mib")]
    print(f"| {name} | " + " | ".join(c.replace("nan", "-") for c in cells) + " |")
for z, s in sorted(d["stages"].items()):
    print(f"dsgd zero {z} saves {s['saved_mib']:.0f} MiB per rank (formula {s['formula_saved_mib']:.0f}); "
          f"step time zero {z} / zero 0 = {s['step_ratio']:.3f} (best), {s['median_step_ratio']:.3f} (medians); "
          f"dsgd / PyTorch zero 1: peak RSS "
          f"{best(d['runs'], int(z), 'peak_rss_mib') / best(p['runs'], 1, 'peak_rss_mib'):.2f}, peak PSS "
          f"{best(d['runs'], int(z), 'peak_pss_mib') / best(p['runs'], 1, 'peak_pss_mib'):.2f}")
PY
