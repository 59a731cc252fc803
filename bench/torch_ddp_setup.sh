#!/usr/bin/env bash
# The benchmark's peer: Horovod built from source (pip) in a venv that sees Debian's torch, so
# bench/torch_ddp.py can run hvd.DistributedOptimizer beside sumo. Not part of the README's
# commands: it downloads from the Python package index and compiles for several minutes.
#
#   bench/torch_ddp_setup.sh [VENV]        (default build/hvd-venv)
#   mpirun -np 2 --oversubscribe build/hvd-venv/bin/python bench/torch_ddp.py
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-build/hvd-venv}
# Horovod compiles against torch's C++ headers (torch/extension.h): Debian ships them in
# libtorch-dev, not in python3-torch.
if ! dpkg-query -W -f='${Status}' libtorch-dev 2> /dev/null | grep -q "install ok installed"; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends libtorch-dev
fi
/usr/bin/python3 -m venv --system-site-packages "$venv"
export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
  HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_GLOO=1 MAKEFLAGS=-j"$(nproc)"
"$venv/bin/pip" install --no-cache-dir horovod
"$venv/bin/python" -c "import horovod.torch as hvd; print('horovod', hvd.__version__ if hasattr(hvd, '__version__') else '')"
