#!/usr/bin/env bash
# Kill-to-resumed on the demo workload (the CNN on Fashion-MNIST, 2 workers of 1 thread, batch
# 128, a snapshot every 20 steps): RUNS jobs with one standby, then RUNS without, each killing
# (-9) KILLS training workers at random moments (at least GAP seconds apart, plus up to as
# much), and one fault-free job of the same settings. Prints a table: per mode the median and
# max kill-to-resumed time (the kill's time here to the driver's resumed_at_unix_s), the
# driver's own recovery_s, each run's test accuracy against the fault-free run's, and any
# orphan process or /dev/shm segment left. Then, with one standby: two kills 3 s apart, a
# SIGSTOP (stop to resumed), and a kill while the job starts (it must finish, exit status 0).
# About 14 minutes with the defaults.
#
#   bench/recovery.sh [RUNS=4] [KILLS=5] [EPOCHS=2] [bench/recovery.py options: --modes, --no-scenarios]
#   JSON=FILE also writes every run
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-4} kills=${2:-5} epochs=${3:-2}
[ -x build/dsgd ] || cmake --build build --target dsgd
exec /usr/bin/python3 bench/recovery.py --runs "$runs" --kills "$kills" --epochs "$epochs" ${JSON:+--json "$JSON"} "${@:4}"
