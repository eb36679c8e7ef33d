#!/usr/bin/env bash
# Installs dsgd into a temporary prefix and builds examples/downstream against it with
# find_package(dsgd), then runs the results: the model zoo, a custom TrainingOperator and a
# two-model operator, each trained by 2 worker processes (they exit 1 if they did not learn). Usage: downstream_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1 build=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$src/examples/downstream" -B "$tmp/build" -G Ninja -DCMAKE_PREFIX_PATH="$tmp/prefix" "${launcher[@]}" > "$tmp/configure.log" 2>&1 || { tail -40 "$tmp/configure.log"; exit 1; }
cmake --build "$tmp/build" > "$tmp/build.log" 2>&1 || { tail -40 "$tmp/build.log"; exit 1; }
"$tmp/build/model_zoo" | tee "$tmp/zoo.txt"
grep -Eq 'resnet50 +[0-9]+ parameters, logits \[8, 10\]' "$tmp/zoo.txt"
cd "$tmp"
"$tmp/build/custom_operator"
"$tmp/build/gan"
echo "downstream: all examples built and passed"
