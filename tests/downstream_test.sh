#!/usr/bin/env bash
# Installs dsgd into a temporary prefix and builds examples/downstream against it with
# find_package(dsgd), then runs the result. Usage: downstream_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1 build=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$src/examples/downstream" -B "$tmp/build" -G Ninja -DCMAKE_PREFIX_PATH="$tmp/prefix" "${launcher[@]}" >/dev/null
cmake --build "$tmp/build" >/dev/null
"$tmp/build/model_zoo"
