#!/usr/bin/env bash
# The MPI fault suite: under `mpirun -np 3`, one rank is stopped (SIGSTOP), killed (SIGKILL)
# or leaves early, in `sumo train` and in a bare allreduce program (allreduce_fault.c). Every
# other rank must report within the deadline (SUMO_TIMEOUT) and the job must end with a
# non-zero exit status, leaving no process behind: a stopped rank must not keep the others
# waiting in MPI_Finalize.
#
#   tests/faults/run.sh path/to/sumo path/to/allreduce_fault
set -uo pipefail
sumo=${1:?usage: run.sh path/to/sumo path/to/allreduce_fault}
prog=${2:?usage: run.sh path/to/sumo path/to/allreduce_fault}
if ! command -v mpirun > /dev/null || ! ldd "$sumo" | grep libmpi > /dev/null; then
  echo "fault suite: skipped (no mpirun, or $sumo built without MPI)"
  exit 0
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
deadline=5
# What the job may take beyond the deadline on two shared cores: Open MPI's clean-up and
# the ranks' start-up.
slack=${FAULT_SLACK:-20}
export SUMO_TIMEOUT=$deadline
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpi=(mpirun --oversubscribe --mca btl self,vader)
passed=0 failed=0
ok()   { echo "ok   - $*"; passed=$((passed + 1)); }
fail() { echo "FAIL - $*"; failed=$((failed + 1)); }

# Each rank records its pid, so the suite can signal one and check that none outlives the job.
wrap=(sh -c 'echo $$ > "$SUMO_FAULT_PIDS/pid.$OMPI_COMM_WORLD_RANK"; exec "$0" "$@"')
export SUMO_FAULT_PIDS=$tmp

# check NAME STATUS SECONDS OUTPUT PATTERN: the job ended in time, non-zero, saying PATTERN
# (grep -E; empty: anything), and every rank's process is gone within a few seconds.
check() {
  local name=$1 code=$2 took=$3 out=$4 pattern=$5 left=""
  for _ in $(seq 50); do
    left=""
    for f in "$tmp"/pid.*; do [ -f "$f" ] && kill -0 "$(cat "$f")" 2> /dev/null && left+=" $(cat "$f")"; done
    [ -z "$left" ] && break
    sleep 0.2
  done
  if [ "$code" -eq 0 ] || [ "$code" -eq 124 ]; then fail "$name: exit status $code after ${took}s"; tail -5 "$out"
  elif [ "$took" -gt $((deadline + slack)) ]; then fail "$name: took ${took}s (deadline ${deadline}s)"
  elif [ -n "$pattern" ] && ! grep -E "$pattern" "$out" > /dev/null; then fail "$name: no '$pattern' in the output"; tail -5 "$out"
  elif [ -n "$left" ]; then fail "$name: processes left:$left"; kill -9 $left 2> /dev/null
  else ok "$name: ended in ${took}s with status $code"; fi
}

reported='SUMO_ERR_TIMEOUT|SUMO_ERR_PEER_FAILURE'

# ---- the bare allreduce program: the faulty rank acts on itself ----
rm -f "$tmp"/pid.*
timeout -k 10 120 "${mpi[@]}" -np 3 "${wrap[@]}" "$prog" none > "$tmp/none.out" 2>&1
code=$?
[ $code -eq 0 ] && grep -q "allreduce_fault: ok" "$tmp/none.out" && ok "allreduce, no fault: completes" \
  || { fail "allreduce, no fault: status $code"; tail -5 "$tmp/none.out"; }
for mode in stop kill exit; do
  rm -f "$tmp"/pid.*
  start=$(date +%s)
  timeout -k 10 120 "${mpi[@]}" -np 3 "${wrap[@]}" "$prog" $mode > "$tmp/$mode.out" 2>&1
  code=$?
  pattern=$reported
  [ $mode = kill ] && pattern=""  # Open MPI itself ends the job when a process dies
  check "allreduce, a rank that ${mode}s" $code $(( $(date +%s) - start )) "$tmp/$mode.out" "$pattern"
done

# ---- sumo train: the suite signals the last rank once training is under way ----
train=(train --batch 8 --epochs 50 --train-limit 6000 --test-limit 300 --eval-every 5 --no-progress)
# run_train NAME SIGNAL [mpirun arguments...]: SIGNAL (or "none") goes to rank 2 once the log
# shows training.
run_train() {
  local name=$1 sig=$2; shift 2
  rm -f "$tmp"/pid.* "$tmp/log.csv"
  local start
  start=$(date +%s)
  timeout -k 10 180 "${mpi[@]}" "$@" > "$tmp/train.out" 2>&1 &
  local job=$!
  if [ "$sig" != none ]; then
    for _ in $(seq 300); do
      [ -f "$tmp/pid.2" ] && [ "$(cat "$tmp/log.csv" 2> /dev/null | wc -l)" -ge 2 ] && break
      sleep 0.1
    done
    start=$(date +%s)
    kill -"$sig" "$(cat "$tmp/pid.2")"
  fi
  wait $job
  local code=$?
  local pattern=$reported
  [ "$sig" = KILL ] && pattern=""
  check "$name" $code $(( $(date +%s) - start )) "$tmp/train.out" "$pattern"
}
run_train "train, a rank stopped" STOP -np 3 "${wrap[@]}" "$sumo" "${train[@]}" --log "$tmp/log.csv"
run_train "train, a rank killed" KILL -np 3 "${wrap[@]}" "$sumo" "${train[@]}" --log "$tmp/log.csv"
# A rank that leaves early: the last one is told to stop after 3 steps, the others are not.
run_train "train, a rank leaving early" none -np 2 "${wrap[@]}" "$sumo" "${train[@]}" --log "$tmp/log.csv" \
  : -np 1 "${wrap[@]}" "$sumo" "${train[@]}" --stop-after 3

echo "fault suite: $passed passed, $failed failed"
[ $failed -eq 0 ]
