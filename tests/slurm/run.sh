#!/usr/bin/env bash
# sumo under a real Slurm on this one machine: munged, slurmctld and slurmd started here with a
# minimal configuration in a scratch folder (their own ports, socket and state; nothing of the
# machine's Slurm is read or touched), then
#   - srun -n 2 and -n 3 of `sumo train` (shared memory between the tasks): the same bits as
#     the threads transport with --workers 2 and 3;
#   - srun --mpi=pmix -n 2 of `sumo train` (Open MPI through PMIx), the same bits again;
#   - srun -n 2 and -n 3 of the binding's check (tests/slurm/binding_check.py: init() joins the
#     step as srun numbered it, closed forms for sum, average, Adasum and a DDP step);
#   - examples/slurm.sbatch through sbatch, as docs/cli.md shows it;
# and the daemons are stopped and the folder removed on every way out. Skipped, with one line,
# where Slurm cannot start here: not root (slurmd starts tasks as their user), or its programs
# missing (scripts/deps.sh --slurm installs them), or SUMO_SKIP_SLURM=1. SUMO_SKIP_TORCH=1 (or
# debian: it runs Debian's torch) leaves out the binding's check and the sbatch example (which runs PyTorch).
# Needs build/sumo (make). About 40 s on two busy cores.
set -euo pipefail
cd "$(dirname "$0")/../.."

skip() { echo "slurm tests skipped: $*"; exit 0; }
[ "${SUMO_SKIP_SLURM:-0}" = 1 ] && skip "SUMO_SKIP_SLURM=1"
[ "$(id -u)" = 0 ] || skip "slurmd must start as root to start tasks as their user, and this runs as $(id -un)"
for p in munged slurmctld slurmd srun sbatch sinfo scontrol; do
  command -v $p > /dev/null || skip "$p is not installed (scripts/deps.sh --slurm installs Slurm and munge)"
done
[ -x build/sumo ] || { echo "tests/slurm/run.sh: build/sumo is missing: run make first" >&2; exit 1; }

scratch=$(mktemp -d "${TMPDIR:-/tmp}/sumo-slurm.XXXXXX")
chmod 700 "$scratch"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2> /dev/null || break; sleep 0.1; done
    kill -9 "$p" 2> /dev/null || true
  done
  rm -rf "$scratch"
}
trap cleanup EXIT

# Two ports nobody listens on, for the two daemons.
free_port() {
  local p
  for _ in $(seq 100); do
    p=$((20000 + RANDOM % 10000))
    (exec 3<> /dev/tcp/127.0.0.1/$p) 2> /dev/null || { echo $p; return; }
  done
  echo "tests/slurm/run.sh: no free port found" >&2
  exit 1
}
ctld_port=$(free_port)
d_port=$(free_port)
while [ "$d_port" = "$ctld_port" ]; do d_port=$(free_port); done

mkdir -m 700 "$scratch/munge" "$scratch/state" "$scratch/spool" "$scratch/log"
head -c 1024 /dev/urandom > "$scratch/munge.key"
chmod 600 "$scratch/munge.key"
munged --foreground --force --socket="$scratch/munge/sock" --key-file="$scratch/munge.key" \
  --pid-file="$scratch/munge/pid" --log-file="$scratch/log/munge.log" \
  --seed-file="$scratch/munge/seed" > "$scratch/log/munged.out" 2>&1 &
pids+=($!)

host=$(hostname -s)
conf=$scratch/slurm.conf
# CPUs=4 on a machine of two (config_overrides believes the file): -n 3 and the sbatch
# example's 4 tasks fit on the one node of a two-core CI machine.
cat > "$conf" <<EOF
ClusterName=sumotest
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$scratch/munge/sock
CredType=cred/munge
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
StateSaveLocation=$scratch/state
SlurmdSpoolDir=$scratch/spool
SlurmctldPidFile=$scratch/slurmctld.pid
SlurmdPidFile=$scratch/slurmd.pid
SlurmctldLogFile=$scratch/log/slurmctld.log
SlurmdLogFile=$scratch/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
NodeName=$host CPUs=4 State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
export SLURM_CONF=$conf
for _ in $(seq 50); do [ -S "$scratch/munge/sock" ] && break; sleep 0.1; done
slurmctld -D -f "$conf" > "$scratch/log/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -f "$conf" > "$scratch/log/slurmd.out" 2>&1 &
pids+=($!)
state=
for _ in $(seq 150); do
  state=$(sinfo -h -o %T 2> /dev/null || true)
  [ "$state" = idle ] && break
  sleep 0.2
done
if [ "$state" != idle ]; then
  tail -n 5 "$scratch"/log/*.log "$scratch"/log/*.out >&2 || true
  skip "slurmctld and slurmd did not bring the node up within 30 s (node state '${state:-none}'; their logs above)"
fi
echo "slurm $(sinfo -V | cut -d' ' -f2) up on $host in a scratch configuration"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export SUMO_TIMEOUT=${SUMO_TIMEOUT:-120}
failed=0
check() { # name, then the command
  local name=$1 t0=$SECONDS; shift
  if "$@" > "$scratch/out" 2>&1; then echo "ok   $name ($((SECONDS - t0)) s)"; else
    echo "FAIL $name:"; tail -n 20 "$scratch/out"; failed=1; fi
}
train=(build/sumo train --train-limit 2000 --test-limit 500 --no-progress --reduce avg,adasum)
hashes() { grep -o 'fnv1a [0-9a-f]*' "$1" | tr '\n' ' '; }
same_bits() { # launcher words..., then the reference's worker count as the last argument
  local n=${*: -1}
  "${train[@]}" --workers "$n" > "$scratch/ref" 2>&1
  "${@:1:$#-1}" "${train[@]}" > "$scratch/got" 2>&1 || { cat "$scratch/got"; return 1; }
  local want got
  want=$(hashes "$scratch/ref") got=$(hashes "$scratch/got")
  [ -n "$want" ] && [ "$want" = "$got" ] || { echo "threads: $want; srun: $got"; cat "$scratch/got"; return 1; }
  [ -z "$(ls -d "${TMPDIR:-/tmp}"/sumo-"$(id -u)"-* 2> /dev/null)" ] || { echo "the meeting folder was left behind"; return 1; }
}
check "srun -n 2 sumo train: the threads transport's bits" same_bits srun -n 2 2
check "srun -n 3 sumo train: the threads transport's bits" same_bits srun -n 3 3
if [ -x /usr/bin/mpirun ]; then
  check "srun --mpi=pmix -n 2 sumo train (MPI): the same bits" same_bits srun --mpi=pmix -n 2 2
fi
refused() {
  ! srun -n 2 build/sumo train --workers 3 > "$scratch/got" 2>&1 &&
    grep -q "under srun the processes are the workers" "$scratch/got"
}
check "srun -n 2 sumo train --workers 3: refused, saying why" refused

case ${SUMO_SKIP_TORCH:-0} in
  1|debian) torch=skip ;;
  *) torch=run ;;
esac
if [ $torch = skip ]; then
  echo "the binding's check and the sbatch example skipped: SUMO_SKIP_TORCH=$SUMO_SKIP_TORCH"
elif [ -n "$(/usr/bin/python3 -c 'import torch' 2>&1)" ]; then
  echo "FAIL the binding's check: /usr/bin/python3 cannot import torch (SUMO_SKIP_TORCH=1 skips it)"
  failed=1
else
  export PYTHONPATH=$PWD/python SUMO_LIBRARY=$PWD/build/libsumo.so
  check "srun -n 2 binding check" srun -n 2 /usr/bin/python3 tests/slurm/binding_check.py
  check "srun -n 3 binding check" srun -n 3 /usr/bin/python3 tests/slurm/binding_check.py
  sbatch_example() {
    # Two tasks rather than the example's four: the same path, half the time on two cores.
    sbatch --wait --ntasks 2 --chdir="$PWD" -o "$scratch/sbatch.out" examples/slurm.sbatch \
      --train-limit 2000 --test-limit 500 --no-progress > /dev/null || { cat "$scratch/sbatch.out"; return 1; }
    grep -q '^adasum: .*fnv1a' "$scratch/sbatch.out" && grep -q 'replicas identical: True' "$scratch/sbatch.out" &&
      ! grep -q 'replicas identical: False' "$scratch/sbatch.out" ||
      { cat "$scratch/sbatch.out"; return 1; }
  }
  check "sbatch examples/slurm.sbatch" sbatch_example
fi
[ $failed = 0 ] && echo "slurm tests passed" || echo "slurm tests FAILED"
exit $failed
