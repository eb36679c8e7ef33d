#!/usr/bin/env bash
# Prepares, on a Debian 12 machine with a package registry, the folder of Debian packages that
# building dsgd needs on the GPU machine, which reaches no registry and has no Debian packages
# (it has LibTorch with CUDA, nvcc, CMake and ninja): Gloo, gRPC, protobuf, spdlog, CLI11,
# nlohmann-json and GoogleTest, with what they link. bench/gpu/run.sh builds against it.
#   scripts/gpu-deps.sh [DIR]      default DIR: .gpu-deps (ignored by git)
# The packages are unpacked with dpkg -x (no installation) and packed as DIR/deps.tar.xz, whose
# usr/{include,lib,bin} bench/gpu/run.sh unpacks (about 10 MB: small enough to carry).
set -euo pipefail
dir=${1:-.gpu-deps}
pkgs=(
  libgloo-dev libgloo0 libhiredis-dev libhiredis0.14 libibverbs-dev libibverbs1 libnl-3-200 libnl-route-3-200
  libgrpc++-dev libgrpc++1.51 libgrpc-dev libgrpc29 protobuf-compiler-grpc
  libprotobuf-dev libprotobuf32 libprotobuf-lite32 libprotoc32 protobuf-compiler
  libabsl-dev libabsl20220623 libre2-dev libre2-9 libc-ares-dev libc-ares2 libssl-dev libssl3 zlib1g-dev zlib1g
  libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 libcli11-dev nlohmann-json3-dev libgtest-dev
  libcpp-httplib-dev libcpp-httplib0.11 libbrotli-dev libbrotli1
)
rm -rf "$dir"
mkdir -p "$dir/debs" "$dir/root"
(cd "$dir/debs" && apt-get download -qq "${pkgs[@]}")
for deb in "$dir"/debs/*.deb; do dpkg -x "$deb" "$dir/root"; done
rm -rf "$dir/debs" "$dir/root/usr/share/doc" "$dir/root/usr/share/man" "$dir/root/usr/src"
# Static libraries are never linked (the CMake packages name the shared ones), except GoogleTest's.
find "$dir/root" -name '*.a' ! -name 'libgtest*' ! -name 'libgmock*' -delete
# Debian's links into /etc/alternatives and absolute links would point outside the folder there.
find "$dir/root" -xtype l -print0 | while IFS= read -r -d '' link; do
  target=$(readlink "$link")
  if [[ $target == /* && -e "$dir/root$target" ]]; then ln -sfn "$(realpath --relative-to="$(dirname "$link")" "$dir/root$target")" "$link"; fi
done
tar -C "$dir/root" -cJf "$dir/deps.tar.xz" .
rm -rf "$dir/root"
echo "gpu-deps: $dir/deps.tar.xz, $(du -h "$dir/deps.tar.xz" | cut -f1) (${#pkgs[@]} packages)"
