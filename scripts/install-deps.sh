#!/usr/bin/env bash
# Installs the Debian 12 packages that dsgd's build, tests, demo and benchmarks need.
# Idempotent: installs only what is missing and prints nothing when everything is present.
#   scripts/install-deps.sh            everything (build, tests, demo, benchmarks)
#   scripts/install-deps.sh --build    only what building and testing need
#   scripts/install-deps.sh --demo     only what building and running `make demo` needs
set -euo pipefail

demo_pkgs=(
  cmake ninja-build ccache g++ make pkg-config
  libtorch-dev            # LibTorch 1.13 (CPU)
  libopenblas0-openmp     # without it LibTorch runs on the reference BLAS: CNN 2.3x, MLP 4.7x slower
  libgloo-dev             # cross-host data plane
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler   # control plane
  libssl-dev              # OpenSSL's libcrypto: the HMAC in every data connection's hello
  libcpp-httplib-dev      # the driver's metrics endpoint and dashboard (--metrics-port)
  libjs-chart.js          # the dashboard's charts, served by the driver (no download at run time)
  libspdlog-dev libcli11-dev nlohmann-json3-dev libgtest-dev zlib1g-dev
  dataset-fashion-mnist   # /usr/share/datasets/fashion-mnist
)
build_pkgs=(
  "${demo_pkgs[@]}"
  iproute2                # network namespaces for multi-host tests
  tcpdump                 # the TLS test captures a job's traffic and searches it for secrets
  openssh-client openssh-server   # the ssh launcher's test runs its own sshd in a namespace
  slurmctld slurmd slurm-client munge   # `make test-cluster`: a real Slurm, nodes in namespaces
  clang libclang-rt-14-dev     # libFuzzer for the parsers' fuzz targets (tests/fuzz)
  gnuplot-nox             # `dsgd tune`'s plot (its test checks it), and the plots in docs/BENCHMARKS.md
  python3-prometheus-client   # its parser reads the metrics endpoint in the tests, as Prometheus would
  python3-torch           # TorchScript models made in Python (tests); PyTorch DDP, the peer in bench/
  python3-pytest          # the tests written in Python (tests/python)
  chromium                # headless: the dashboard's test opens the page and checks its charts
  pybind11-dev python3-dev   # the Python module (python/: import dsgd)
)
bench_pkgs=(
  openmpi-bin libopenmpi-dev   # MPI_Allreduce peer
  dict-gcide              # the language model's corpus: 40 MB of English (dsgd prepare-text's default)
)

case "${1:-}" in
  --demo) pkgs=("${demo_pkgs[@]}") ;;
  --build) pkgs=("${build_pkgs[@]}") ;;
  "") pkgs=("${build_pkgs[@]}" "${bench_pkgs[@]}") ;;
  *) echo "install-deps: unknown option '$1'; use --demo, --build or nothing (everything)" >&2; exit 2 ;;
esac

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "install-deps: installing ${missing[*]}"
sudo=""
[[ $(id -u) -eq 0 ]] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
# Packages with a service (openssh-server, munge, slurmctld, slurmd) must not start it: the tests run their own daemons,
# on addresses of their own namespaces. Debian's way: a policy-rc.d that denies every start.
policy=/usr/sbin/policy-rc.d
if [[ ! -e $policy ]]; then
  printf '#!/bin/sh\nexit 101\n' | $sudo tee $policy >/dev/null
  $sudo chmod +x $policy
  trap '$sudo rm -f $policy' EXIT
fi
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
