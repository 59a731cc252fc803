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
/usr/bin/python3 -m venv --system-site-packages "$venv"
export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
  HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_GLOO=1 MAKEFLAGS=-j"$(nproc)"
"$venv/bin/pip" install --no-cache-dir horovod
"$venv/bin/python" -c "import horovod.torch as hvd; print('horovod', hvd.__version__ if hasattr(hvd, '__version__') else '')"
