#!/usr/bin/env bash
# The PyTorch binding's tests, under each torch sumo.torch supports: Debian's python3-torch
# (1.13, /usr/bin/python3) and the current torch 2.x wheel from PyPI in build/torch-venv
# (scripts/torch-venv.sh makes it the first time, about 3 to 5 minutes, and reuses it).
# Under each: pytest alone (one rank, threads transport; it also runs the Horovod-style
# example under mpirun -np 2 and torchrun, and test_elastic.py's jobs of processes started
# each on its own, one of them SIGKILLed), under mpirun (sumo's MPI transport), over a
# torch.distributed process group (torchrun where it starts, else mpirun), a rank that works
# on after its peers left, models DDP refuses, and a rank killed mid-training (DDP hook and
# delta optimizer): every rank must end, with an error where there is one, by itself.
#
# An interpreter that cannot import torch and pytest fails the run, unless told to skip:
#   SUMO_SKIP_TORCH=1        skip every PyTorch test
#   SUMO_SKIP_TORCH=venv     skip the torch 2.x environment (no PyPI, or no 5 GB of disk)
#   SUMO_SKIP_TORCH=debian   skip Debian's torch 1.13
#   SUMO_PYTHON=PATH         run under that interpreter alone
# SUMO_NO_PYTHON=1 (scripts/deps.sh installed no Python packages) skips them all, as =1 does.
set -uo pipefail
cd "$(dirname "$0")/../.."
skip=${SUMO_SKIP_TORCH:-}
why=SUMO_SKIP_TORCH=$skip
if [ "${SUMO_NO_PYTHON:-0}" = 1 ] && [ -z "$skip" ]; then skip=1 why=SUMO_NO_PYTHON=1; fi
case "$skip" in
  "" | 0 | venv | debian) ;;
  1 | all) echo "python tests: skipped ($why): neither torch 1.13 nor torch 2.x ran"; exit 0 ;;
  *) echo "SUMO_SKIP_TORCH=$skip: expected 1, venv or debian"; exit 2 ;;
esac
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH} SUMO_TIMEOUT=${SUMO_TIMEOUT:-60}
mpi=(mpirun --oversubscribe --mca btl self,vader -x PYTHONPATH -x SUMO_TIMEOUT)
status=0
summary=()

# A job that must end by itself (124/137: the guard killed it): its output in $out, its exit
# code in $rc, its seconds in $took.
job() {
  local guard=$1; shift
  local start
  start=$(date +%s)
  out=$(timeout -k 10 "$guard" "$@" 2>&1)
  rc=$?
  took=$(( $(date +%s) - start ))
}

# One interpreter's whole suite; returns non-zero if any part failed. Each path into sumo is
# run once: one rank; mpirun (sumo's MPI transport); the torch.distributed process group on
# one host (sumo's shared memory, rendezvous through the group's store) and through the
# group's own calls (SUMO_TEST_TRANSPORT=group), under torchrun where the torch has one that
# starts (2.x), else under mpirun with the group made from MPI's environment (Debian's 1.13,
# whose torchrun cannot parse its own defaults on Python 3.11).
suite() {
  local py=$1 failed=0
  # No .pytest_cache (several ranks would write it at once), no colour codes in CI logs; the
  # torch 2.x wheel warns at import that numpy is missing, which sumo does not need.
  local pytest=(-m pytest -q --color=no -p no:cacheprovider
                -W "ignore:Failed to initialize NumPy" tests/python)
  local torchrun=()
  if "$py" -c "import sys, torch; sys.exit(0 if int(torch.__version__.split('.')[0]) >= 2 else 1)"; then
    torchrun=("$py" -m torch.distributed.run --standalone)
  fi
  echo "== pytest, one rank"
  timeout -k 10 600 "$py" "${pytest[@]}" || failed=1
  local have_mpi=0
  command -v mpirun > /dev/null && "$py" -c "import sys; sys.path.insert(0, 'python'); import sumo._lib as l; sys.exit(0 if l.HAVE_MPI else 1)" 2> /dev/null && have_mpi=1
  if [ $have_mpi = 1 ]; then
    echo "== mpirun -np 2 pytest (sumo's MPI transport)"
    timeout -k 10 300 "${mpi[@]}" -np 2 "$py" "${pytest[@]}" || failed=1
  else
    echo "python tests under mpirun: skipped (no mpirun, or libsumo built without MPI)"
  fi
  if [ ${#torchrun[@]} -gt 0 ]; then
    echo "== torchrun --nproc_per_node 3 pytest (the process group on one host: sumo's shared memory)"
    timeout -k 10 600 "${torchrun[@]}" --nproc_per_node 3 "${pytest[@]}" || failed=1
    echo "== torchrun --nproc_per_node 2 pytest, SUMO_TEST_TRANSPORT=group (through the group's own calls)"
    SUMO_TEST_TRANSPORT=group timeout -k 10 600 "${torchrun[@]}" --nproc_per_node 2 "${pytest[@]}" || failed=1
    # Across hosts, simulated, hosts of 2 ranks: on 4 ranks init()'s two-level communicator
    # (2+2), on 3 the flat one (2+1: unequal hosts); in each also two-level communicators of
    # hosts of 1 and of one host, and init()'s choice for {0,2}+{1}; the two-level
    # communicator against the flat one over TCP bit for bit, DDP hooks, join, then a rank
    # that leaves.
    for n in 4 3; do
      echo "== torchrun --nproc_per_node $n, SUMO_LOCAL_SIZE=2: the two-level communicator across hosts"
      SUMO_LOCAL_SIZE=2 timeout -k 10 300 "${torchrun[@]}" --nproc_per_node $n tests/python/hier.py || failed=1
    done
    # The flat communicator across hosts over sumo's TCP transport (init(transport="tcp"))
    # against the group's own calls bit for bit, 4 ranks as 2 hosts of 2; then a rank that
    # leaves.
    echo "== torchrun --nproc_per_node 4, SUMO_LOCAL_SIZE=2: the TCP transport across hosts"
    SUMO_LOCAL_SIZE=2 timeout -k 10 300 "${torchrun[@]}" --nproc_per_node 4 tests/python/tcp.py || failed=1
  elif [ $have_mpi = 1 ]; then
    local port=$(( 29500 + RANDOM % 2000 ))
    echo "== mpirun -np 3 pytest over a torch.distributed group on one host (sumo's shared memory)"
    SUMO_TEST_TRANSPORT=shm SUMO_TEST_PORT=$port timeout -k 10 300 "${mpi[@]}" -x SUMO_TEST_TRANSPORT -x SUMO_TEST_PORT -np 3 "$py" "${pytest[@]}" || failed=1
    echo "== mpirun -np 2 pytest over a torch.distributed group, SUMO_TEST_TRANSPORT=group"
    SUMO_TEST_TRANSPORT=group SUMO_TEST_PORT=$((port + 1)) timeout -k 10 300 "${mpi[@]}" -x SUMO_TEST_TRANSPORT -x SUMO_TEST_PORT -np 2 "$py" "${pytest[@]}" || failed=1
  fi
  [ $have_mpi = 1 ] || return $failed

  # A rank still working long after its peers left (rank 0 saving for twice the deadline)
  # must neither be killed nor keep the others.
  local launch saved
  for launch in mpirun torchrun; do
    [ $launch = torchrun ] && [ ${#torchrun[@]} -eq 0 ] && continue
    echo "== $launch, 2 ranks: rank 0 works on after the last collective, the deadline 3 s"
    saved=$(mktemp -u)
    if [ $launch = mpirun ]; then
      SUMO_TIMEOUT=3 job 120 "${mpi[@]}" -np 2 "$py" tests/python/lifetime.py linger 6 "$saved"
    else
      SUMO_TIMEOUT=3 job 120 "${torchrun[@]}" --nproc_per_node 2 tests/python/lifetime.py linger 6 "$saved"
    fi
    if [ "$rc" -ne 0 ] || [ ! -s "$saved" ]; then
      echo "FAIL - linger under $launch: exit $rc, rank 0's work $( [ -s "$saved" ] && echo finished || echo was cut off)"; tail -20 <<< "$out"; failed=1
    else
      echo "ok   - linger under $launch: both ranks ended cleanly, rank 0 finished its work (${took}s)"
    fi
    rm -f "$saved"
  done
  echo "== mpirun -np 2: models that differ in size under DDP, deadline 5 s"
  SUMO_TIMEOUT=5 job 120 "${mpi[@]}" -np 2 "$py" tests/python/lifetime.py ddp-mismatch
  local raised
  raised=$(grep -oE "rank [0-9] raised" <<< "$out" | sort -u | wc -l)
  grep "raised" <<< "$out" | cut -c1-160
  if [ "$raised" -ne 2 ] || [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "FAIL - ddp-mismatch: $raised of 2 ranks raised, job exit $rc after ${took}s"; tail -20 <<< "$out"; failed=1
  else
    echo "ok   - ddp-mismatch: both ranks raised, the job ended by itself in ${took}s"
  fi

  local deadline=5
  for mode in hook optimizer; do
    echo "== mpirun -np 3: a rank killed mid-training ($mode), deadline ${deadline}s"
    # --enable-recovery: without it Open MPI itself kills the job when a process dies, and
    # what sumo does about a dead peer is never seen.
    SUMO_TIMEOUT=$deadline job 120 "${mpi[@]}" --enable-recovery -np 3 "$py" tests/python/kill_rank.py $mode
    # Count matches, not lines: two ranks printing at once may share a line.
    raised=$(grep -oE "raised SUMO_ERR_(TIMEOUT|PEER_FAILURE)" <<< "$out" | wc -l)
    grep "raised" <<< "$out"
    # The job must end by itself (sumo aborts it after the error); 124/137: the guard
    # killed it. How long it took is start-up as much as the deadline, so it is shown, not
    # judged (torch 2.x on a busy machine starts three ranks in tens of seconds).
    if [ "$raised" -ne 2 ] || [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      echo "FAIL - $mode: $raised of 2 ranks raised, job exit $rc after ${took}s"; tail -20 <<< "$out"; failed=1
    else
      echo "ok   - $mode: both other ranks raised, job ended in ${took}s"
    fi
  done
  return $failed
}

pythons=()
if [ -n "${SUMO_PYTHON:-}" ]; then
  pythons=("$SUMO_PYTHON")
else
  [ "$skip" = debian ] && summary+=("torch 1.13 (/usr/bin/python3): skipped (SUMO_SKIP_TORCH=debian)") || pythons+=(/usr/bin/python3)
  if [ "$skip" = venv ]; then
    summary+=("torch 2.x (build/torch-venv): skipped (SUMO_SKIP_TORCH=venv)")
  elif venv_py=$(scripts/torch-venv.sh | tail -1) && [ -n "$venv_py" ]; then
    pythons+=("$venv_py")
  else
    echo "FAIL - scripts/torch-venv.sh could not make the torch 2.x environment (SUMO_SKIP_TORCH=venv skips it)"
    summary+=("torch 2.x (build/torch-venv): FAILED to set up"); status=1
  fi
fi

for py in "${pythons[@]}"; do
  if ! "$py" -c "import torch, pytest" 2> /dev/null; then
    echo "FAIL - $py cannot import torch and pytest (Debian: apt-get install python3-torch python3-pytest; SUMO_SKIP_TORCH=1, venv or debian skips)"
    summary+=("$py: FAILED, no torch or pytest"); status=1
    continue
  fi
  version=$("$py" -c "import torch; print(torch.__version__)" 2> /dev/null)
  echo "=== torch $version ($py)"
  start=$(date +%s)
  if suite "$py"; then verdict=passed; else verdict=FAILED; status=1; fi
  summary+=("torch $version ($py): $verdict in $(( $(date +%s) - start )) s")
done

# torchft's DiLoCo next to sumo's on the same model and data (tests/python/diloco_torchft.py),
# in build/torch-venv, where scripts/torch-venv.sh adds torchft when its torch is new enough.
if [ "$skip" = venv ] || [ -n "${SUMO_PYTHON:-}" ]; then
  summary+=("torchft comparison: skipped (${SUMO_PYTHON:+SUMO_PYTHON=$SUMO_PYTHON}${SUMO_PYTHON:-SUMO_SKIP_TORCH=venv})")
elif [ -z "${venv_py:-}" ]; then
  summary+=("torchft comparison: FAILED, no torch 2.x environment"); status=1
elif ! "$venv_py" -c "import torchft" 2> /dev/null; then
  if "$venv_py" -c "import sys, torch; sys.exit(0 if tuple(int(x) for x in torch.__version__.split('+')[0].split('.')[:2]) < (2, 7) else 1)"; then
    summary+=("torchft comparison: skipped (torchft 0.2.0 needs torch >= 2.7; SUMO_TORCH_SPEC asked for an older one)")
  else
    echo "FAIL - torchft does not import in $venv_py (scripts/torch-venv.sh installs it)"
    summary+=("torchft comparison: FAILED, torchft does not import"); status=1
  fi
else
  # In float64, to 1e-12 of the largest parameter; the float32 runs time the first two. The
  # others are settings at which the float32 comparison flipped a ReLU unit on some CPU.
  for options in "--F 1" "--F 2 --merge 0.5" "--F 2 --merge 0.5 --outer-lr 0.68 --no-timing" \
      "--F 2 --merge 0.5 --outer-lr 0.69 --no-timing" "--F 2 --merge 0.5 --outer-lr 0.74 --no-timing" \
      "--F 2 --merge 0.7 --no-timing"; do
    echo "=== sumo.torch.DiLoCo against torchft's DiLoCo, $options (torchrun, 2 replicas)"
    # shellcheck disable=SC2086
    job 300 "$venv_py" -m torch.distributed.run --standalone --nproc_per_node 2 tests/python/diloco_torchft.py $options
    grep -E "^(torch [0-9]|max \||per outer step|  (sumo|torchft|local)|sumo's exchanges|PASS|FAIL)" <<< "$out"
    if [ "$rc" -ne 0 ]; then
      tail -20 <<< "$out"; summary+=("torchft comparison, $options: FAILED (exit $rc)"); status=1
    else
      summary+=("torchft comparison, $options: passed in ${took} s")
    fi
  done
fi

echo "=== python tests:"
printf '  %s\n' "${summary[@]}"
exit $status
