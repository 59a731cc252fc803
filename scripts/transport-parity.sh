#!/usr/bin/env bash
# Runs bench/transport_parity.py for P = 1..5 over sumo's MPI transport (mpirun), its
# shared-memory transport and the process group's own calls (torchrun, torch 2.x from
# scripts/torch-venv.sh), and prints where the paths give the same bits and by how much they
# differ where they do not (a markdown table; docs/torch/launching.md states the result).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONPATH=$PWD/python
py=$(scripts/torch-venv.sh | tail -1)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for P in ${PARITY_RANKS:-1 2 3 4 5}; do
  mpirun --oversubscribe --mca btl self,vader -np "$P" "$py" bench/transport_parity.py --transport mpi --out "$out" > /dev/null
  for t in shm group; do
    [ "$P" = 1 ] && [ "$t" = shm ] && continue  # one rank joins a group of one: "group"
    "$py" -m torch.distributed.run --standalone --nproc_per_node "$P" \
      bench/transport_parity.py --transport $t --out "$out" > /dev/null 2>&1
  done
done
"$py" bench/transport_parity.py --compare "$out"
