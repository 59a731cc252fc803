#!/usr/bin/env bash
# Installs the Debian packages sumo builds, tests and trains with, if any is missing.
# Debian 12 (bookworm); needs root or sudo only when something is missing.
set -euo pipefail

packages=(
  build-essential      # gcc, make
  libcmocka-dev        # the test framework
  libopenmpi-dev       # the MPI transport (mpicc)
  openmpi-bin          # mpirun for the MPI tests and benchmarks
  libopenblas-dev      # matrix products in the training driver
  zlib1g-dev           # gzipped IDX files
  dataset-fashion-mnist # the training data
  gnuplot-nox          # experiment plots (PNG without a display)
  iproute2             # ip/tc for the shaped-network benchmark
  clang                # libFuzzer (-fsanitize=fuzzer) for `make fuzz`
  python3-torch        # the PyTorch binding (python/sumo) and its tests, under /usr/bin/python3
  python3-pytest       # the binding's tests
  python3-venv         # scripts/torch-venv.sh: the torch 2.x environment the tests also run under
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep "install ok installed" > /dev/null || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "installing: ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
