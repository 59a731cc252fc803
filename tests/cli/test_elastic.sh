#!/usr/bin/env bash
# `sumo train --elastic`: a lost worker costs the step in flight, not the run. Checked against
# runs that take no failure path: an elastic run with no loss has the plain run's bits; one
# whose worker leaves before step 0 has the bits of a plain run without it; a staged death
# (threads: an abort; srun tasks: SIGKILL) has the bits of a clean leave at the same step, and
# so does kill -9 from outside at a random moment, whatever step it caught (the survivors say
# which step they went back to). Nothing is left in /dev/shm or in the meeting folder.
set -uo pipefail
sumo=${1:?usage: test_elastic.sh path/to/sumo}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0
ok()   { echo "ok   - $*"; passed=$((passed + 1)); }
fail() { echo "FAIL - $*"; failed=$((failed + 1)); }
checksum() { sed -n 's/.*fnv1a \([0-9a-f]*\).*/\1/p' "$1" | head -1; }
export SUMO_TIMEOUT=10 TMPDIR=$tmp

common=(--train-limit 6000 --test-limit 500 --batch 16 --epochs 2 --eval-every 10 --no-progress)
run() { local out=$1; shift; "$sumo" train "${common[@]}" "$@" > "$tmp/$out" 2>&1; }

for m in avg adasum; do
  run plain4 --reduce $m --workers 4
  run el4 --reduce $m --workers 4 --elastic
  [ -n "$(checksum "$tmp/plain4")" ] && [ "$(checksum "$tmp/el4")" = "$(checksum "$tmp/plain4")" ] \
    && ok "$m: elastic with no loss = the plain run" || fail "$m: elastic with no loss differs"
  run plain3 --reduce $m --workers 3
  run leave0 --reduce $m --workers 4 --elastic --leave 2@0
  [ "$(checksum "$tmp/leave0")" = "$(checksum "$tmp/plain3")" ] && grep -q "ended with 3 workers (started with 4)" "$tmp/leave0" \
    && ok "$m: a worker that leaves before step 0 = a plain run of 3" || fail "$m: leave@0 differs from 3 workers"
  run leave --reduce $m --workers 4 --elastic --leave 1@40 --leave 3@77
  run kill --reduce $m --workers 4 --elastic --kill 1@40 --kill 3@77
  [ -n "$(checksum "$tmp/leave")" ] && [ "$(checksum "$tmp/kill")" = "$(checksum "$tmp/leave")" ] \
    && grep -q "ended with 2 workers (started with 4)" "$tmp/kill" \
    && ok "$m: threads, two workers die at steps 40 and 77 = they leave there" || { fail "$m: threads kill differs"; cat "$tmp/kill"; }
  # Joining (threads): at step 0 it is a plain run of 4; later, the joiner gets the state (the
  # ranks check each step that they hold the same parameters); a joiner that dies at once leaves
  # the run as it was.
  run join0 --reduce $m --workers 3 --elastic --join 0
  [ "$(checksum "$tmp/join0")" = "$(checksum "$tmp/plain4")" ] \
    && ok "$m: a worker that joins at step 0 = a plain run of 4" || fail "$m: join@0 differs from 4 workers"
  run join30 --reduce $m --workers 3 --elastic --join 30 --join 30 --verify-ranks
  [ -n "$(checksum "$tmp/join30")" ] && grep -q "ended with 5 workers (started with 3)" "$tmp/join30" \
    && ok "$m: two join at step 30 and hold the workers' parameters from there on" || { fail "$m: join@30"; cat "$tmp/join30"; }
  run joinkill --reduce $m --workers 3 --elastic --join 30 --kill 3@30
  [ "$(checksum "$tmp/joinkill")" = "$(checksum "$tmp/plain3")" ] \
    && ok "$m: a joiner that dies on its first step = a plain run of 3" || fail "$m: join then die differs"
done

# ACGA (its per-rank history starts afresh on a new membership), SlowMo and Streaming DiLoCo
# (a worker lost during its local steps is left out of the next outer step; a joiner starts
# from worker 0's replica): a death and a join, against a clean leave and the same join.
# Streaming DiLoCo syncs every 40 steps here (its default of 500 is more than the run has).
for m in acga slowmo streaming-diloco; do
  own=(); [ $m = streaming-diloco ] && own=(--sync-every 40)
  run dj --reduce $m "${own[@]}" --workers 4 --elastic --kill 1@45 --join 70
  run lj --reduce $m "${own[@]}" --workers 4 --elastic --leave 1@45 --join 70
  [ -n "$(checksum "$tmp/dj")" ] && [ "$(checksum "$tmp/dj")" = "$(checksum "$tmp/lj")" ] \
    && grep -q "ended with 4 workers" "$tmp/dj" \
    && ok "$m: a death at step 45 and a join at 70 = a leave there and the same join" \
    || { fail "$m: death and join"; tail -3 "$tmp/dj"; }
done

# The tasks of a plain srun step, started by hand: shared memory, a store in a folder. Each runs
# in the background, where exec makes the job's pid the task's own (kill -9 reaches it).
task() { exec env SLURM_JOB_ID=$$ SLURM_STEP_ID=$1 SLURM_NTASKS=4 SLURM_STEP_NUM_NODES=1 SLURM_SRUN_COMM_PORT=9 \
           SLURM_STEP_NODELIST=localhost SLURM_PROCID=$2 SLURM_LOCALID=$2 "$sumo" train "${common[@]}" --reduce adasum --elastic "${@:3}"; }
for r in 0 1 2 3; do task 1 $r --kill 2@33 > "$tmp/self$r" 2>&1 & done
wait
run ref --reduce adasum --workers 4 --elastic --leave 2@33
[ -n "$(checksum "$tmp/ref")" ] && [ "$(checksum "$tmp/self0")" = "$(checksum "$tmp/ref")" ] && [ -z "$(checksum "$tmp/self2")" ] \
  && ok "srun tasks: one SIGKILLs itself at step 33 = threads where it leaves there" \
  || { fail "srun tasks, self-kill"; head -3 "$tmp"/self*; }

# kill -9 during set-up (after the tasks met, before the first step, while the data loads):
# the survivors set up again without it, a plain run of 3. Where the kill lands later on a
# fast machine, they go back to a step instead, as below.
run plain3 --reduce adasum --workers 3
for r in 0 1 2 3; do task 5 $r > "$tmp/setup$r" 2>&1 & pids[$r]=$!; done
sleep 0.3
kill -9 "${pids[2]}" 2>/dev/null
wait 2>/dev/null
back=$(sed -n 's/.*going on with 3 from step \([0-9]*\).*/\1/p' "$tmp"/setup* | head -1)
if grep -q "during set-up" "$tmp/setup0"; then ref=plain3
else run ref --reduce adasum --workers 4 --elastic --leave "2@${back:-0}"; ref=ref; fi
[ -n "$(checksum "$tmp/$ref")" ] && [ "$(checksum "$tmp/setup0")" = "$(checksum "$tmp/$ref")" ] \
  && ok "kill -9 at 0.3 s ($(grep -q "during set-up" "$tmp/setup0" && echo "during set-up" || echo "at step $back")): the survivors' bits = $ref" \
  || { fail "kill -9 at 0.3 s"; head -3 "$tmp"/setup*; }

# kill -9 from outside, after training started, at a random moment and on a random task.
for trial in 1 2 3; do
  rm -f "$tmp/log.csv"
  pids=()
  for r in 0 1 2 3; do task $((trial + 1)) $r --log "$tmp/log.csv" > "$tmp/ext$r" 2>&1 & pids[$r]=$!; done
  victim=$((RANDOM % 4))
  for _ in $(seq 500); do [ "$(cat "$tmp/log.csv" 2>/dev/null | wc -l)" -ge 2 ] && break; sleep 0.02; done
  sleep "0.0$((RANDOM % 10))"
  kill -9 "${pids[$victim]}" 2>/dev/null
  wait 2>/dev/null
  back=$(sed -n 's/.*going on with 3 from step \([0-9]*\).*/\1/p' "$tmp"/ext* | head -1)
  if [ -z "$back" ]; then
    # The run ended before the kill landed: every task finished, all with the same bits.
    [ "$(grep -l "ended with 4 workers" "$tmp"/ext* | wc -l)" -ge 1 ] && ok "trial $trial: finished before the kill" \
      || { fail "trial $trial: no recovery and no end"; head -3 "$tmp"/ext*; }
    continue
  fi
  survivor=$(grep -l "fnv1a" "$tmp"/ext* | head -1)
  run ref --reduce adasum --workers 4 --elastic --leave "$victim@$back"
  [ -n "$survivor" ] && [ "$(checksum "$survivor")" = "$(checksum "$tmp/ref")" ] \
    && ok "trial $trial: kill -9 of task $victim, survivors went back to step $back = it leaves there" \
    || { fail "trial $trial: task $victim killed, back to $back: bits differ"; head -3 "$tmp"/ext*; }
done
# Processes started on their own that meet through a directory store (--store): TCP between
# them, heartbeats and each membership's commit in the store. With no loss they hold the
# threads' bits; one that SIGKILLs itself at step 33 leaves survivors that each hold the bits
# of threads where it leaves there; a process that joins (--joiner) is taken in at the
# members' next step, and all four hold the bits of threads where one joins at that step.
storejob=(--reduce adasum --workers 3 --elastic)
members() {  # members NAME EXTRA...: three member processes on the store $tmp/st-NAME
  local name=$1; shift
  for r in 0 1 2; do "$sumo" train "${common[@]}" "${storejob[@]}" --store "$tmp/st-$name" --rank $r "$@" \
    > "$tmp/$name$r" 2>&1 & done
}
same_in() {  # same_in HASH FILE...: every file's result line has HASH
  local want=$1 f; shift
  [ -n "$want" ] || return 1
  for f in "$@"; do [ "$(checksum "$f")" = "$want" ] || return 1; done
}
export SUMO_LIVENESS_TIMEOUT=1
run tref "${storejob[@]}"
members sp; wait
same_in "$(checksum "$tmp/tref")" "$tmp"/sp0 "$tmp"/sp1 "$tmp"/sp2 \
  && ok "--store, 3 processes: every one holds the threads' bits" || { fail "--store, no loss"; tail -n 2 "$tmp"/sp*; }
members sk --kill 2@33; wait 2>/dev/null
run tref --leave 2@33 "${storejob[@]}"
same_in "$(checksum "$tmp/tref")" "$tmp"/sk0 "$tmp"/sk1 && [ -z "$(checksum "$tmp/sk2")" ] \
  && grep -q "ended with 2 workers (started with 3)" "$tmp/sk0" \
  && ok "--store: one of 3 SIGKILLs itself at step 33, both survivors = threads where it leaves there" \
  || { fail "--store, a process killed"; tail -n 3 "$tmp"/sk*; }
members sj
for _ in $(seq 200); do [ -s "$tmp/st-sj/k.sumo-train_2Fa0_2Foutcome" ] && break; sleep 0.02; done
"$sumo" train "${common[@]}" "${storejob[@]}" --store "$tmp/st-sj" --joiner > "$tmp/sj3" 2>&1 &
wait
at=$(sed -n 's/.*joined after step \([0-9]*\);.*/\1/p' "$tmp/sj0")
run tref "${storejob[@]}" --join "${at:-0}"
[ -n "$at" ] && same_in "$(checksum "$tmp/tref")" "$tmp"/sj0 "$tmp"/sj1 "$tmp"/sj2 "$tmp"/sj3 \
  && grep -q "ended with 4 workers (started with 3)" "$tmp/sj0" \
  && ok "--store: a process joins after step $at; all four = threads where one joins there" \
  || { fail "--store, a joiner"; tail -n 3 "$tmp"/sj*; }
"$sumo" train "${common[@]}" --workers 2 --store "$tmp/st-x" --rank 0 > "$tmp/bad" 2>&1
[ $? = 2 ] && grep -q -- "--store DIR runs the processes of an --elastic job" "$tmp/bad" \
  && ok "--store without --elastic is refused by name" || { fail "--store without --elastic"; cat "$tmp/bad"; }
rm -rf "$tmp"/st-*
unset SUMO_LIVENESS_TIMEOUT

left=$(ls /dev/shm | grep -c "^sumo\.") ; stores=$(ls "$tmp" | grep -c "^sumo-")
[ "$left" = 0 ] && [ "$stores" = 0 ] && ok "nothing left in /dev/shm or the meeting folder" \
  || fail "left behind: $left in /dev/shm, $stores meeting folders"

echo "elastic cli: $passed passed, $failed failed"
[ $failed -eq 0 ]
