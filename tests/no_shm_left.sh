#!/usr/bin/env bash
# Run after a test suite: fails if /dev/shm holds a dsgd shared-memory segment of this user (names
# "dsgd-<creator pid>-..."). A group's name is removed once every rank has mapped it, and a
# driver removes the names of dead creators when it starts and stops, so one left here is a leak:
# named with its size and creator, then removed (if its creator is gone) so the next run starts
# clean.
set -euo pipefail
shopt -s nullglob
left=()
for f in /dev/shm/dsgd-*; do
  [ -O "$f" ] && left+=("$f")
done
[ ${#left[@]} -eq 0 ] && { echo "no_shm_left: /dev/shm holds no dsgd segment"; exit 0; }
echo "no_shm_left: the tests left ${#left[@]} dsgd segment(s) in /dev/shm:" >&2
for f in "${left[@]}"; do
  pid=$(basename "$f" | cut -d- -f2)
  if kill -0 "$pid" 2>/dev/null; then
    echo "  $f ($(stat -c %s "$f") bytes; creator $pid still runs: $(ps -o args= -p "$pid" | cut -c1-80))" >&2
  else
    echo "  $f ($(stat -c %s "$f") bytes; creator $pid gone: removed)" >&2
    rm -f "$f"
  fi
done
exit 1
