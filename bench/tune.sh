#!/usr/bin/env bash
# dsgd tune's schedulers on one search, side by side: the same trials (same space, same seed,
# so the same sampled configurations) run by fifo (every trial to the end: the reference), asha
# and pbt, each in a directory of its own.
#   bench/tune.sh [SPACE] [TRIALS]        (defaults: examples/tune/cnn.json, its own trial count)
# Prints each scheduler's best test accuracy, its compute (iterations run, and wall seconds)
# against fifo's, and the targets: asha's best within 0.5 point of fifo's for at most 40% of
# its compute; pbt's best at least fifo's (the best fixed configuration it started from).
# KEEP=DIR keeps the three searches (their tune.json, checkpoints and plots) in DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
space=${1:-examples/tune/cnn.json}
trials=${2:+--trials $2}
dsgd=$(realpath "${DSGD:-build/dsgd}")
out=${KEEP:-$(mktemp -d)}
[[ -n "${KEEP:-}" ]] || trap 'rm -rf "$out"' EXIT
mkdir -p "$out"
for s in fifo asha pbt; do
  echo "$(date +%T) tune.sh: $s" >&2
  # shellcheck disable=SC2086
  "$dsgd" tune --space "$space" $trials --scheduler "$s" --dir "$out/$s" --json-out "$out/$s.json" \
    >"$out/$s.table" 2>"$out/$s.log" || { tail -20 "$out/$s.log" >&2; exit 1; }
done
/usr/bin/python3 - "$out" "$space" <<'PY'
import json, sys
out, space = sys.argv[1], sys.argv[2]
r = {s: json.load(open(f"{out}/{s}.json")) for s in ("fifo", "asha", "pbt")}
m = r["fifo"]["metric"]
best = {s: r[s]["best"][m] for s in r}
print(f"#### dsgd tune on {space}: {len(r['fifo']['trials'])} trials\n")
print(f"| scheduler | best {m} | best trial's config | iterations run | vs fifo | wall s | vs fifo | stopped early |")
print("|---|---|---|---|---|---|---|---|")
for s in ("fifo", "asha", "pbt"):
    x = r[s]
    cfg = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in x["best"]["params"].items())
    print(f"| {s} | {best[s]:.4f} | {cfg} | {x['iterations']} | {x['iterations'] / r['fifo']['iterations']:.2f} | "
          f"{x['wall_s']:.0f} | {x['wall_s'] / r['fifo']['wall_s']:.2f} | {x['trials_stopped_early']} |")
a_gap = 100 * (best["fifo"] - best["asha"])
a_share = r["asha"]["iterations"] / r["fifo"]["iterations"]
print(f"\nTarget asha: best within 0.5 point of fifo's for <= 40% of its compute; measured {a_gap:+.2f} points "
      f"behind, {100 * a_share:.0f}% of the iterations ({'met' if a_gap <= 0.5 and a_share <= 0.4 else 'not met'}).")
print(f"Target pbt: ends at least as good as the best fixed configuration it started from (fifo's best); "
      f"measured {best['pbt']:.4f} against {best['fifo']:.4f} ({'met' if best['pbt'] >= best['fifo'] else 'not met'}).")
PY
