#!/usr/bin/env bash
# The PyTorch binding's tests: pytest alone (one rank, threads transport) and under
# mpirun -np 2 and 3, then a rank killed mid-training (DDP hook and delta optimizer) must make
# the others raise within the deadline. Skipped, saying so, without /usr/bin/python3's torch.
set -uo pipefail
cd "$(dirname "$0")/../.."
py=${SUMO_PYTHON:-/usr/bin/python3}
if ! "$py" -c "import torch, pytest" 2> /dev/null; then
  echo "python tests: skipped ($py cannot import torch and pytest: apt-get install python3-torch python3-pytest)"
  exit 0
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH} SUMO_TIMEOUT=${SUMO_TIMEOUT:-60}
# No .pytest_cache (several ranks would write it at once), no colour codes in CI logs.
pytest=("$py" -m pytest -q --color=no -p no:cacheprovider tests/python)
mpi=(mpirun --oversubscribe --mca btl self,vader -x PYTHONPATH -x SUMO_TIMEOUT)
status=0
echo "== pytest, one rank"
timeout -k 10 300 "${pytest[@]}" || status=1
if command -v mpirun > /dev/null && "$py" -c "import sys; sys.path.insert(0, 'python'); import sumo._lib as l; sys.exit(0 if l.HAVE_MPI else 1)"; then
  for np in 2 3; do
    echo "== mpirun -np $np pytest"
    timeout -k 10 300 "${mpi[@]}" -np $np "${pytest[@]}" || status=1
  done
  deadline=5 slack=${FAULT_SLACK:-20}
  for mode in hook optimizer; do
    echo "== mpirun -np 3: a rank killed mid-training ($mode), deadline ${deadline}s"
    start=$(date +%s)
    # --enable-recovery: without it Open MPI itself kills the job when a process dies, and
    # what sumo does about a dead peer is never seen.
    out=$(SUMO_TIMEOUT=$deadline timeout -k 10 120 "${mpi[@]}" --enable-recovery -np 3 "$py" tests/python/kill_rank.py $mode 2>&1)
    took=$(( $(date +%s) - start ))
    # Count matches, not lines: two ranks printing at once may share a line.
    raised=$(grep -oE "raised SUMO_ERR_(TIMEOUT|PEER_FAILURE)" <<< "$out" | wc -l)
    grep "raised" <<< "$out"
    if [ "$raised" -ne 2 ] || [ "$took" -gt $((deadline + slack)) ]; then
      echo "FAIL - $mode: $raised of 2 ranks raised, job took ${took}s"; tail -20 <<< "$out"; status=1
    else
      echo "ok   - $mode: both other ranks raised, job ended in ${took}s"
    fi
  done
else
  echo "python tests under mpirun: skipped (no mpirun, or libsumo built without MPI)"
fi
exit $status
