#!/usr/bin/env bash
# The benchmark's peer: Horovod built from source (pip) in a venv that sees Debian's torch, so
# bench/torch_ddp.py can run hvd.DistributedOptimizer beside sumo. Not part of the README's
# commands: it downloads from the Python package index and compiles for several minutes.
#
#   bench/torch_ddp_setup.sh [VENV]        (default build/hvd-venv; Horovod 0.28.1 built here
#                                          in about 4 minutes at nice 19 on two cores)
#   mpirun -np 2 --oversubscribe build/hvd-venv/bin/python bench/torch_ddp.py
#   mpirun -np 4 --oversubscribe build/hvd-venv/bin/python bench/torch_ddp.py --check-only
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-build/hvd-venv}
# Horovod compiles against torch's C++ headers (torch/extension.h): Debian ships them in
# libtorch-dev, not in python3-torch; they include pybind11's headers, which libtorch-dev
# does not pull in (without pybind11-dev: "torch/csrc/Exceptions.h: fatal error:
# pybind11/pybind11.h: No such file or directory" in horovod/torch/mpi_ops_v2.cc).
missing=()
for pkg in libtorch-dev pybind11-dev; do
  dpkg-query -W -f='${Status}' "$pkg" 2> /dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
/usr/bin/python3 -m venv --system-site-packages "$venv"
export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
  HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_GLOO=1 MAKEFLAGS=-j"$(nproc)"
"$venv/bin/pip" install --no-cache-dir horovod
"$venv/bin/python" -c "import horovod.torch as hvd; print('horovod', hvd.__version__ if hasattr(hvd, '__version__') else '')"
