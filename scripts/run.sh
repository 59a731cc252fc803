#!/usr/bin/env bash
# The main job: dependencies, build, then a short training comparison on the embedded
# (threads) transport: 32 workers x 64 = a total batch of 2048 on Fashion-MNIST, averaging
# (at the single-worker rate, and with linear scaling and warm-up) against Adasum on
# gradients and on the optimizer's deltas (Horovod's mode), all at the single-worker rate.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
make -j"$(nproc)" > /dev/null
exec ./build/sumo train --workers 32 --batch 64 --epochs 6 --lr 0.05 --warmup-epochs 1 \
  --reduce avg,avg@linear,adasum,adasum-delta "$@"
