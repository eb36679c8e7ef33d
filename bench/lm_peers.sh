#!/usr/bin/env bash
# dsgd's language model against PyTorch DDP on the same work, side by side in one run: the same
# GPT shape, token file, sequences per worker, AdamW and 1 thread per process, 2 workers, in float32
# and under bf16 autocast. Only ratios within a run mean anything on this shared machine.
#   bench/lm_peers.sh [STEPS] [REPEATS] [MODEL]      (defaults: 30 steps, 2 repeats, gpt-small)
# The token file is gcide's (dsgd prepare-text, made once under build/lm-bench); TOKENS=FILE
# takes another. Each run trains STEPS steps of 8 sequences per worker; tokens/s counts every step
# on both sides (dsgd's train_s, DDP's timed loop with no warm-up steps left out). Both then report
# the validation loss on the same first VAL_SEQUENCES (default 64) sequences of val.tok, after the
# same tokens with the same warmup (WARMUP, default STEPS/4) and cosine decay to STEPS, and the
# largest peak resident memory of their worker processes. Prints a markdown table of medians and
# dsgd / DDP per precision; RESULTS_JSON=FILE also writes every measurement. PEER_ATTENTION=blocked
# gives the peer dsgd's attention (ddp_gpt.py --attention): what is left is the systems' part.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-30}
repeats=${2:-2}
model=${3:-gpt-small}
dsgd=${DSGD:-build/dsgd}
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
[ -x "$dsgd" ] || { echo "lm_peers: $dsgd not built (make build)"; exit 1; }
$py -c 'import torch, numpy' 2>/dev/null || { echo "lm_peers: $py lacks torch or numpy (scripts/install-deps.sh)"; exit 1; }
tokens=${TOKENS:-}
if [ -z "$tokens" ]; then
  dir=build/lm-bench
  [ -f $dir/train.tok ] || $dsgd prepare-text --out $dir >/dev/null
  tokens=$dir/train.tok
fi
[ -f "$tokens" ] || { echo "lm_peers: no token file $tokens"; exit 1; }
tokdir=$(dirname "$tokens")
[ -f "$tokdir/val.tok" ] || { echo "lm_peers: no $tokdir/val.tok beside the token file"; exit 1; }
val=${VAL_SEQUENCES:-64}
warmup=${WARMUP:-$((steps / 4))}
lmconfig="{\"val_sequences\": $val, \"warmup_steps\": $warmup, \"decay_steps\": $((steps - warmup))}"
b=8
for r in $(seq "$repeats"); do
  for p in fp32 bf16; do
    out="$tmp/dsgd.$p.$r.json"
    OMP_NUM_THREADS=1 $dsgd train --model "$model" --dataset "text:$tokdir" --workers 2 --threads 1 \
      --batch-size $((2 * b)) --max-steps "$steps" --config "$lmconfig" --quiet --precision "$p" --json-out "$out" \
      >/dev/null 2>"$tmp/err" || { echo "lm_peers: dsgd $p failed:" >&2; tail -5 "$tmp/err" >&2; exit 1; }
    echo "  dsgd $p (repeat $r): $($py -c "import json;print(round(json.load(open('$out'))['tokens_per_s']))") tokens/s" >&2
    out="$tmp/ddp.$p.$r.json"
    OMP_NUM_THREADS=1 $py bench/peers/ddp_gpt.py --world-size 2 --model "$model" --tokens "$tokens" --batch-size $b \
      --max-steps "$steps" --skip-steps 0 --threads 1 --precision "$p" --val-tokens "$tokdir/val.tok" \
      --val-sequences "$val" --warmup-steps "$warmup" --decay-steps $((steps - warmup)) --json-out "$out" \
      --attention "${PEER_ATTENTION:-plain}" \
      >/dev/null 2>"$tmp/err" ||
      { echo "lm_peers: ddp $p failed:" >&2; tail -5 "$tmp/err" >&2; exit 1; }
    echo "  ddp $p (repeat $r): $($py -c "import json;print(round(json.load(open('$out'))['tokens_per_s']))") tokens/s" >&2
  done
done
$py - "$tmp" "$steps" "$repeats" "$model" <<'PY'
import glob, json, os, statistics, sys
tmp, steps, repeats, model = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
runs, vals, rss = {}, {}, {}
for f in glob.glob(os.path.join(tmp, "*.*.*.json")):
    system, precision, _r, _ = os.path.basename(f).split(".")
    j = json.load(open(f))
    runs.setdefault((system, precision), []).append(j["tokens_per_s"])
    vals.setdefault((system, precision), []).append(j["test_loss"] if system == "dsgd" else j["val_loss"])
    rss.setdefault((system, precision), []).append(j["worker_peak_rss_mib"] if system == "dsgd" else j["max_rss_mb"])
med = {k: statistics.median(v) for k, v in runs.items()}
mval = {k: statistics.median(v) for k, v in vals.items()}
mrss = {k: max(v) for k, v in rss.items()}
print(f"\n#### {model}, 2 workers x 1 thread, 8 sequences per worker ({steps} steps, median of {repeats}; "
      f"the peer's attention {os.environ.get('PEER_ATTENTION', 'plain')})\n")
print("| precision | dsgd tokens/s | DDP tokens/s | dsgd / DDP | val loss dsgd; DDP (dsgd / DDP) "
      "| peak RSS per worker, MiB, dsgd; DDP | runs (dsgd; DDP) |")
print("|---|---|---|---|---|---|---|")
for p in ("fp32", "bf16"):
    d, t = med[("dsgd", p)], med[("ddp", p)]
    vd, vt = mval[("dsgd", p)], mval[("ddp", p)]
    print(f"| {p} | {d:.0f} | {t:.0f} | {d / t:.2f}x | {vd:.4f}; {vt:.4f} ({vd / vt:.3f}) "
          f"| {mrss[('dsgd', p)]:.0f}; {mrss[('ddp', p)]:.0f} "
          f"| {', '.join(f'{x:.0f}' for x in sorted(runs[('dsgd', p)]))}; "
          f"{', '.join(f'{x:.0f}' for x in sorted(runs[('ddp', p)]))} |")
if os.environ.get("RESULTS_JSON"):
    json.dump({"model": model, "steps": steps, "runs": {f"{s}-{p}": v for (s, p), v in runs.items()},
               "val_loss": {f"{s}-{p}": v for (s, p), v in vals.items()},
               "peak_rss": {f"{s}-{p}": v for (s, p), v in rss.items()}},
              open(os.environ["RESULTS_JSON"], "w"), indent=2)
PY
