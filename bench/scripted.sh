#!/usr/bin/env bash
# A model defined in Python (TorchScript, `--model FILE.pt`) against the same model built in C++,
# side by side in one run: the reference CNN (tests/python/scripted_models.py, layer for layer
# dsgd's `cnn`), Fashion-MNIST, 2 workers, batch 128, STEPS steps, ROUNDS interleaved runs each.
# Prints each side's median samples/s and the ratio scripted / C++.
#   bench/scripted.sh [ROUNDS] [STEPS]        (defaults 3, 150)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
steps=${2:-150}
dsgd=${DSGD_BINARY:-build/dsgd}
py=/usr/bin/python3
[ -x "$dsgd" ] || { echo "scripted.sh: $dsgd not built (make build)"; exit 1; }
$py -c 'import torch' 2>/dev/null || { echo "scripted.sh: $py lacks torch (scripts/install-deps.sh)"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
$py tests/python/scripted_models.py cnn "$tmp/cnn.pt"
for ((r = 1; r <= rounds; r++)); do
  for model in cnn "$tmp/cnn.pt"; do
    side=$([ "$model" = cnn ] && echo cpp || echo scripted)
    "$dsgd" train --model "$model" --workers 2 --batch-size 128 --max-steps "$steps" \
      --json-out "$tmp/$side-$r.json" >/dev/null 2>"$tmp/log" || { cat "$tmp/log"; exit 1; }
  done
done
$py - "$tmp" "$rounds" <<'PY'
import json, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
rates = {side: [json.load(open(f"{tmp}/{side}-{r}.json"))["samples_per_s"] for r in range(1, rounds + 1)]
         for side in ("cpp", "scripted")}
for side, xs in rates.items():
    print(f"{side:9s} samples/s: median {statistics.median(xs):.0f} (runs: {', '.join(f'{x:.0f}' for x in xs)})")
print(f"scripted / C++ = {statistics.median(rates['scripted']) / statistics.median(rates['cpp']):.3f}")
PY
