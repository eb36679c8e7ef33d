#!/usr/bin/env bash
# What TLS on the control plane costs: the demo workload (the CNN on Fashion-MNIST, 2 workers,
# allreduce, batch 64, one thread each) for STEPS steps with --no-tls and with TLS (the default:
# keys made for the job), one after the other (alternating which goes first), ROUNDS times; then
# the simple strategy, whose gradients cross the control plane every step (the worst case), for
# STEPS steps each way, in both orders.
# Prints samples/s of each run and the ratio TLS / plaintext per pair.
#   bench/tls.sh [ROUNDS] [STEPS]        (default 3, 400)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
steps=${2:-400}
dsgd=${DSGD_BINARY:-build/dsgd}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
demo=(--workers 2 --model cnn --batch-size 64 --lr 0.02 --momentum 0.9 --threads 1 --no-eval -q --max-steps "$steps")

rate() { /usr/bin/python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("%.1f %s" % (r["samples_per_s"], r["control_plane"]))' "$1"; }

pair() {  # pair NAME FIRST FLAGS...: one run with --no-tls, one with TLS, FIRST (plain or tls) first
  local name=$1 first=$2
  shift 2
  if [ "$first" = tls ]; then "$dsgd" train "$@" --json-out "$out/tls.json" >/dev/null; fi
  "$dsgd" train "$@" --no-tls --json-out "$out/plain.json" >/dev/null
  if [ "$first" = plain ]; then "$dsgd" train "$@" --json-out "$out/tls.json" >/dev/null; fi
  read -r plain plain_mode < <(rate "$out/plain.json")
  read -r tls tls_mode < <(rate "$out/tls.json")
  [ "$plain_mode" = plaintext ] && [ "$tls_mode" = tls ] || { echo "tls.sh: modes were $plain_mode/$tls_mode"; exit 1; }
  /usr/bin/python3 -c "import sys; p,t=map(float,sys.argv[2:]); print(f'{sys.argv[1]:<28} plaintext {p:8.1f}  tls {t:8.1f} samples/s  tls/plaintext {t/p:.3f}')" \
    "$name" "$plain" "$tls"
}

# The second run of a pair tends to be the faster (caches): the order alternates.
for r in $(seq "$rounds"); do
  first=plain
  [ $((r % 2)) = 0 ] && first=tls
  pair "demo, allreduce ($first first)" "$first" "${demo[@]}" --strategy allreduce
done
pair "simple strategy (plain first)" plain "${demo[@]}" --strategy simple
pair "simple strategy (tls first)" tls "${demo[@]}" --strategy simple
