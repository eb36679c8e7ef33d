#!/usr/bin/env bash
# Builds the fuzz targets with clang's libFuzzer (+ AddressSanitizer and UBSan) and runs each for
# SECONDS (default 30), starting from the seed corpus in tests/fuzz/corpus/<target> plus what
# earlier runs found (kept in BUILD_DIR/fuzz/corpus). Exit status 0: no target crashed, leaked
# or tripped a sanitizer; otherwise libFuzzer's report names the input (saved in BUILD_DIR/fuzz).
#   tests/fuzz/run.sh [SECONDS] [BUILD_DIR]        (make fuzz; ctest runs it for 20 s each)
set -euo pipefail
seconds=${1:-30}
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${2:-$root/build}/fuzz
mkdir -p "$out"
cxx=${FUZZ_CXX:-$(command -v clang++ || command -v clang++-14 || echo clang++)}
command -v "$cxx" >/dev/null || { echo "fuzz: $cxx not found (scripts/install-deps.sh installs clang)"; exit 1; }
flags=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -I"$root/include" -I"$root/src")
# Each target with the torch-free sources it exercises.
declare -A sources=(
  [config_fuzzer]="src/apps/image_classifier_options.cpp src/models/model_names.cpp"
  [idx_fuzzer]="src/data/idx.cpp"
)
declare -A libs=([config_fuzzer]="" [idx_fuzzer]="-lz")
status=0
for target in config_fuzzer idx_fuzzer; do
  srcs=()
  for s in ${sources[$target]}; do srcs+=("$root/$s"); done
  echo "fuzz: building $target"
  "$cxx" "${flags[@]}" "$root/tests/fuzz/$target.cpp" "${srcs[@]}" ${libs[$target]} -o "$out/$target"
  corpus="$out/corpus/$target"
  mkdir -p "$corpus"
  echo "fuzz: running $target for $seconds s"
  if ! (cd "$out" && "./$target" -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -print_final_stats=1 \
        "$corpus" "$root/tests/fuzz/corpus/$target" 2>"$out/$target.log"); then
    echo "fuzz: $target FAILED; the report:"; tail -40 "$out/$target.log"; status=1
  else
    grep -E "stat::number_of_executed_units|stat::new_units_added" "$out/$target.log" | sed "s/^/fuzz: $target: /"
  fi
done
exit $status
