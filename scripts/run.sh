#!/usr/bin/env bash
# The main job: dependencies, build, then a short run of the benchmark on the embedded
# (threads) transport: sum and average against the machine's memory bandwidth.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
make -j"$(nproc)"
exec ./build/sumo bench --ranks 2,4 --min 4K --max 64M "$@"
