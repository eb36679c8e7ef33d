#!/usr/bin/env bash
# What TLS on the control plane costs: the demo workload (the CNN on Fashion-MNIST, 2 workers,
# allreduce, batch 64, one thread each) for one epoch with --no-tls and with TLS (the default:
# keys made for the job), alternating, ROUNDS times; then the simple strategy, whose gradients
# cross the control plane every step (the worst case), for 300 steps each way. Prints samples/s
# of each run and the ratio TLS / plaintext per pair.
#   bench/tls.sh [ROUNDS]        (default 2)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
dsgd=${DSGD_BINARY:-build/dsgd}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
demo=(--workers 2 --strategy allreduce --model cnn --batch-size 64 --lr 0.02 --momentum 0.9 --threads 1 --no-eval -q)

rate() { /usr/bin/python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(f"{r[\"samples_per_s\"]:.1f} {r[\"control_plane\"]}")' "$1"; }

pair() {  # pair NAME FLAGS...: one run with --no-tls, one with TLS; prints both and the ratio
  local name=$1
  shift
  "$dsgd" train "$@" --no-tls --json-out "$out/plain.json" >/dev/null
  "$dsgd" train "$@" --json-out "$out/tls.json" >/dev/null
  read -r plain plain_mode < <(rate "$out/plain.json")
  read -r tls tls_mode < <(rate "$out/tls.json")
  [ "$plain_mode" = plaintext ] && [ "$tls_mode" = tls ] || { echo "tls.sh: modes were $plain_mode/$tls_mode"; exit 1; }
  /usr/bin/python3 -c "import sys; p,t=map(float,sys.argv[2:]); print(f'{sys.argv[1]:<28} plaintext {p:8.1f}  tls {t:8.1f} samples/s  tls/plaintext {t/p:.3f}')" \
    "$name" "$plain" "$tls"
}

for r in $(seq "$rounds"); do pair "demo, epoch (round $r)" "${demo[@]}" --epochs 1; done
pair "simple strategy, 300 steps" "${demo[@]}" --strategy simple --max-steps 300
