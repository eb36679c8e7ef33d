#!/usr/bin/env bash
# How the driver and the control plane grow with the ranks: `dsgd train` with the simulated model
# (sleeps for compute, 100k-float gradients) on N workers, 8 a pseudo-host, one standby, for each
# N given (default 8 16 32 64 128): start to the first step, step time against its model, the
# driver's CPU and memory, control-plane calls a second, a worker's unique memory, kill -9 of a
# member to resumed, a SIGSTOPped member found. One JSON line per N, then a table; docs/SCALE.md
# fits its cost model to them. About 10 minutes for the default sizes.
#   bench/scale.sh [N ...]        env: SIM_MS (50), PARAMS (100000), PER_HOST (8), WINDOW (15 s),
#                                 TRAIN_FLAGS (more `dsgd train` flags, e.g. --no-tls)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x "${DSGD_BINARY:-build/dsgd}" ] || { echo "scale.sh: build/dsgd is not built (make build)"; exit 1; }
exec /usr/bin/python3 bench/scale.py "$@"
