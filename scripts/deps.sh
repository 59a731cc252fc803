#!/usr/bin/env bash
# Installs the Debian packages sumo builds, tests and trains with, if any is missing.
# Debian 12 (bookworm); needs root or sudo only when something is missing.
#
#   scripts/deps.sh            everything, the PyTorch binding's packages included
#   SUMO_NO_PYTHON=1 scripts/deps.sh
#                              without python3-torch, python3-pytest and python3-venv (and
#                              the ~270 packages torch pulls in): the C library, the tool, the
#                              C tests and the experiments need none of them; the binding's
#                              tests then skip, saying so. Also through run.sh and test.sh.
#   scripts/deps.sh --slurm    also Slurm's daemons and munge, for the test command's real
#                              single-node Slurm (tests/slurm/run.sh); the library needs neither
#   scripts/deps.sh --print    the packages it would make sure of, one a line; installs nothing
#
# What it installs on a Debian 12 base image, and how that was measured: docs/contributing.md, "Set-up".
set -euo pipefail

case ${SUMO_NO_PYTHON:-0} in
  0|"") python=1 ;;
  1) python=0 ;;
  *) echo "deps.sh: SUMO_NO_PYTHON='$SUMO_NO_PYTHON': 1 skips the Python packages, 0 (or unset) installs them" >&2; exit 2 ;;
esac
print=0 slurm=0
for a in "$@"; do
  case $a in
    --print) print=1 ;;
    --slurm) slurm=1 ;;
    *) echo "deps.sh: unknown argument '$a' (accepted: --print, --slurm; SUMO_NO_PYTHON=1 in the environment skips the Python packages)" >&2; exit 2 ;;
  esac
done

packages=(
  build-essential      # gcc, make
  libcmocka-dev        # the test framework
  libopenmpi-dev       # the MPI transport (mpicc)
  openmpi-bin          # mpirun for the MPI tests and benchmarks
  libopenblas-dev      # matrix products in the training driver
  zlib1g-dev           # gzipped IDX files
  dataset-fashion-mnist # the training data
  gnuplot-nox          # experiment plots (PNG without a display)
  iproute2             # ip/tc: hosts as network namespaces (scripts/net-hosts.sh, bench-net.sh)
  nftables             # nft: packets dropped on those hosts' links
  clang                # libFuzzer (-fsanitize=fuzzer) for `make fuzz`
)
if [ $python -eq 1 ]; then
  packages+=(
    python3-torch      # the PyTorch binding (python/sumo) and its tests, under /usr/bin/python3
    python3-pytest     # the binding's tests
    python3-venv       # scripts/torch-venv.sh: the torch 2.x environment the tests also run under
  )
fi

if [ $slurm -eq 1 ]; then
  packages+=(
    slurmctld slurmd   # a one-node cluster the tests start and stop themselves
    slurm-client       # srun, sbatch, sinfo
    munge              # Slurm's authentication
  )
fi

if [ $print -eq 1 ]; then
  printf '%s\n' "${packages[@]}"
  exit 0
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep "install ok installed" > /dev/null || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "installing: ${missing[*]}"
[ $python -eq 1 ] || echo "(SUMO_NO_PYTHON=1: without python3-torch, python3-pytest, python3-venv)"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
