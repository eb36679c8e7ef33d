#!/usr/bin/env bash
# A driver killed (-9) mid-epoch and started again in place (`--driver-state DIR`), on the demo
# workload (the CNN on Fashion-MNIST, 2 workers of 1 thread, batch 128, a snapshot every 20
# steps): RUNS jobs for each delay between the kill and the new driver's start, after one
# fault-free job of the same settings. Prints each run, then a table: the new driver's start (the
# command launched here) to training resumed (the driver's resumed_at_unix_s), the kill to
# resumed, the steps trained again, whether every run finished with the workers it had, and
# whether the result equals the fault-free run's. About 5 minutes with the defaults.
#
#   bench/driver_restart.sh [RUNS=3] [bench/driver_restart.py options: --delays 0,5 --epochs 1 --json FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
[ -x build/dsgd ] || cmake --build build --target dsgd
exec /usr/bin/python3 bench/driver_restart.py --runs "$runs" "${@:2}"
