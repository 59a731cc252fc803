#!/usr/bin/env bash
# End-to-end checks of `sumo train` on the real data: a short run learns, an interrupted and
# resumed run (also one killed in the middle of writing a checkpoint) ends bit-identical to an
# uninterrupted one, damaged checkpoints and data are refused with a message naming the file,
# bad flag values, a method's flags given to methods that do not read them, an outer method's
# run too short to ever synchronise, and unwritable files are refused before training with a
# message naming the flag or file, and the MPI transport gives the same parameters as the
# threads transport.
#
# The crash-during-save check needs the test build of the command (sumo-crashtest, built by
# `make test-cli`): the shipped one has no fault hook.
set -uo pipefail
sumo=${1:?usage: test_train.sh path/to/sumo [path/to/sumo-crashtest]}
crashtest=${2:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0
ok()   { echo "ok   - $*"; passed=$((passed + 1)); }
fail() { echo "FAIL - $*"; failed=$((failed + 1)); }
checksum() { sed -n 's/.*fnv1a \([0-9a-f]*\).*/\1/p' "$1" | head -1; }
# Log rows without the wall-clock column, which is the only thing allowed to differ.
rows() { cut -d, -f1-6,8- "$1"; }

common=(--workers 2 --epochs 2 --batch 32 --train-limit 4000 --test-limit 1000 --eval-every 25 --no-progress --lr 0.05)

"$sumo" train "${common[@]}" --verify-ranks --log "$tmp/a.csv" > "$tmp/a.out" 2>&1
acc=$(awk '$1 == "avg" {print $3}' "$tmp/a.out" | tr -d %)
if [ -n "$acc" ] && awk -v a="$acc" 'BEGIN {exit !(a >= 70)}'; then ok "short run learns ($acc% >= 70%)"; else fail "short run accuracy '$acc'"; cat "$tmp/a.out"; fi
A=$(checksum "$tmp/a.out")

"$sumo" train "${common[@]}" --log "$tmp/a2.csv" > "$tmp/a2.out" 2>&1
[ "$(checksum "$tmp/a2.out")" = "$A" ] && cmp -s <(rows "$tmp/a.csv") <(rows "$tmp/a2.csv") \
  && ok "same flags and seed give bit-identical parameters and log" || fail "rerun differs"

latest_step() { sed -n '1s/.*step \([0-9]*\).*/\1/p' "$1/latest" 2>/dev/null; }
"$sumo" train "${common[@]}" --checkpoint-dir "$tmp/ck" --checkpoint-every 20 --stop-after 55 --log "$tmp/b.csv" > "$tmp/b1.out" 2>&1
[ "$(latest_step "$tmp/ck")" = 55 ] && ok "--stop-after 55 saves a checkpoint at step 55" \
  || fail "--stop-after 55 left latest at '$(latest_step "$tmp/ck")'"
"$sumo" train "${common[@]}" --checkpoint-dir "$tmp/ck" --checkpoint-every 20 --resume --log "$tmp/b.csv" > "$tmp/b2.out" 2>&1
if [ "$(checksum "$tmp/b2.out")" = "$A" ] && cmp -s <(rows "$tmp/a.csv") <(rows "$tmp/b.csv"); then
  ok "stopped at 55, resumed: bit-identical parameters and log"
else fail "resume differs ($(checksum "$tmp/b2.out") vs $A)"; diff <(rows "$tmp/a.csv") <(rows "$tmp/b.csv") | head; fi
n=$(ls "$tmp"/ck/step-*.rank-0.ckpt 2>/dev/null | wc -l)
[ "$n" -eq 2 ] && ok "the 2 latest checkpoints are kept by default" || fail "$n checkpoints of rank 0 kept, expected 2"

# A pid that surely no longer runs: a shell that has exited.
dead=$(sh -c 'echo $$')
if [ -n "$crashtest" ] && [ -x "$crashtest" ]; then
  SUMO_TEST_EXIT_DURING_SAVE=60 "$crashtest" train "${common[@]}" --checkpoint-dir "$tmp/ck2" --checkpoint-every 20 --log "$tmp/c.csv" > "$tmp/c1.out" 2>&1
  code=$?
  latest=$(latest_step "$tmp/ck2")
  [ $code -eq 86 ] && [ "$latest" = 40 ] && ls "$tmp"/ck2/*.tmp.* > /dev/null 2>&1 \
    && ok "killed while writing step 60: step 40 still the latest complete checkpoint" \
    || fail "crash during save: exit $code, latest '$latest'"
  touch "$tmp/ck2/latest.tmp.$dead"
  "$sumo" train "${common[@]}" --checkpoint-dir "$tmp/ck2" --checkpoint-every 20 --resume --log "$tmp/c.csv" > "$tmp/c2.out" 2>&1
  [ "$(checksum "$tmp/c2.out")" = "$A" ] && cmp -s <(rows "$tmp/a.csv") <(rows "$tmp/c.csv") \
    && ok "resumed after the crash: bit-identical" || fail "resume after crash differs"
  left=$(ls "$tmp"/ck2/ | grep -c '\.tmp\.')
  [ "$left" -eq 0 ] && ok "temporaries of the killed writer removed" || fail "$left temporaries left: $(ls "$tmp/ck2")"
else
  echo "skip - crash during save (no sumo-crashtest given)"
fi

f=$(ls "$tmp"/ck/step-*.rank-1.ckpt | head -1)
truncate -s -100 "$f"
sed -i 's/step [0-9]*/step '"$(basename "$f" | sed 's/step-\([0-9]*\).*/\1/')"'/' "$tmp/ck/latest"
"$sumo" train "${common[@]}" --checkpoint-dir "$tmp/ck" --resume > "$tmp/d.out" 2>&1
[ $? -ne 0 ] && grep -q "rank-1.ckpt" "$tmp/d.out" && grep -qi "truncated" "$tmp/d.out" \
  && ok "truncated checkpoint refused, naming the file" || { fail "truncated checkpoint"; cat "$tmp/d.out"; }

# A FIFO in a rank file's place would block the open (no deadline bounds it): refused at once.
rm -f "$f" && mkfifo "$f"
timeout 60 "$sumo" train "${common[@]}" --checkpoint-dir "$tmp/ck" --resume > "$tmp/d2.out" 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "not a regular file" "$tmp/d2.out" \
  && ok "a FIFO as a rank's checkpoint file refused at once, naming it" || { fail "FIFO checkpoint (rc $rc)"; tail -3 "$tmp/d2.out"; }
rm -f "$f"
# A checkpoint folder others may write is refused before anything in it is read.
chmod 0777 "$tmp/ck"
"$sumo" train "${common[@]}" --checkpoint-dir "$tmp/ck" --resume > "$tmp/d3.out" 2>&1
[ $? -ne 0 ] && grep -q "writable by nobody else" "$tmp/d3.out" \
  && ok "a checkpoint folder others may write refused" || { fail "open checkpoint folder"; tail -3 "$tmp/d3.out"; }
chmod 0700 "$tmp/ck"

"$sumo" train "${common[@]}" --checkpoint-dir "$tmp/none" --resume > "$tmp/e.out" 2>&1
[ $? -ne 0 ] && grep -q "no checkpoint" "$tmp/e.out" && ok "resume without a checkpoint refused" || fail "resume without checkpoint"

# ---- flags: wrong values are refused before any work, naming the flag (and the range) ----
quick=(--workers 1 --epochs 1 --batch 32 --train-limit 256 --test-limit 100 --no-progress)
# refused PATTERN ARGS...: exit status 2 and PATTERN (grep -E) in the message, no table.
refused() {
  local pattern=$1; shift
  "$sumo" train "${quick[@]}" "$@" > "$tmp/r.out" 2>&1
  local code=$?
  if [ $code -eq 2 ] && grep -E -- "$pattern" "$tmp/r.out" > /dev/null && ! grep -q fnv1a "$tmp/r.out"; then
    local args="$*" msg
    msg=$(head -1 "$tmp/r.out")
    ok "refused: ${args:0:80} (${msg:0:160})"
  else fail "not refused as expected ($pattern): $* -> exit $code: $(head -3 "$tmp/r.out")"; fi
}
refused "--reduce" --reduce ""
refused "--reduce" --reduce ,
refused "--reduce" --reduce avg,
refused "--reduce.*twice" --reduce avg,avg
refused "--workers.*1024" --workers 4294967297
refused "--batch.*65536" --batch 4294967360
refused "--batch.*65536" --batch 100000000
refused "--epochs" --epochs 99999999999999999999
refused "--seed.*abc" --seed abc
refused "--seed" --seed -1
refused "--lr.*above 0" --lr 0
refused "--lr" --lr -0.1
refused "--lr.*1000" --lr 1e300
refused "--lr-scaling" --lr-scaling 0
refused "--tau" --reduce slowmo --tau 2.5
# An unknown method names every method there is.
refused "unknown method 'foo' \(methods: sum, avg, adasum, adasum-delta, acga, slowmo, localsgd, bmuf, diloco, streaming-diloco, sgp, osgp, dpsgd, slowmo-sgp, slowmo-osgp, slowmo-dpsgd;" --reduce avg,foo
# SlowMo shorter than tau would never take its outer step (quick: 4 steps with 2 workers).
refused "--reduce slowmo: the run has 4 step.*fewer than --tau 12.*unsynchronised" --workers 2 --reduce slowmo
refused "--reduce bmuf: the run has 8 step.*fewer than --tau 9" --reduce bmuf --tau 9
refused "--train-limit" --train-limit -5
refused "--checkpoint-every needs --checkpoint-dir" --checkpoint-every 10
refused "--resume needs --checkpoint-dir" --resume
refused "--keep needs --checkpoint-dir" --keep 3
refused "--workers needs a value" --workers
refused "--fragments" --reduce diloco --fragments 0
refused "--fragments 9 exceeds --sync-every 4" --reduce diloco --sync-every 4 --fragments 9
refused "--delay 3 exceeds --sync-every / --fragments = 2" --reduce streaming-diloco --sync-every 8 --fragments 4 --delay 3
refused "--quantize" --reduce streaming-diloco --quantize e5m2
refused "--quantize-block 12" --reduce streaming-diloco --quantize-block 12
refused "--quantize needs --outer-combine average" --reduce streaming-diloco --outer-combine adasum
refused "--merge-alpha" --reduce streaming-diloco --merge-alpha 1.5
refused "--outer-momentum" --reduce diloco --outer-momentum 1
refused "--outer" --reduce diloco --outer adam
# Each method's own flags are refused, by name, where none of the --reduce methods reads them,
# even at their default value (which would change nothing either way).
refused "^sumo train: --inner-period applies to slowmo, localsgd and bmuf, not to --reduce diloco$" --workers 2 --reduce diloco --inner-period 4
refused "^sumo train: --tau applies to slowmo, localsgd, bmuf, sgp, osgp, dpsgd, slowmo-sgp, slowmo-osgp and slowmo-dpsgd, not to --reduce streaming-diloco$" --reduce streaming-diloco --tau 12
refused "^sumo train: --inner-period applies to slowmo, localsgd and bmuf, not to --reduce sgp \(a gossip base has neither inner averaging nor the sharded state\)$" --workers 2 --reduce sgp --inner-period 4
refused "^sumo train: --gossip-staleness applies to osgp and slowmo-osgp, not to --reduce sgp \(only OSGP overlaps its rounds\)$" --workers 2 --reduce sgp --gossip-staleness 2
refused "^sumo train: --memory-efficient applies to slowmo, localsgd and bmuf, not to --reduce diloco$" --reduce diloco --memory-efficient
refused "^sumo train: --sync-every applies to diloco and streaming-diloco, not to --reduce slowmo$" --reduce slowmo --sync-every 500
refused "^sumo train: --outer-combine applies to diloco and streaming-diloco, not to any of --reduce localsgd,bmuf@2$" --reduce localsgd,bmuf@2 --outer-combine average
refused "^sumo train: --fragment-ranges applies to diloco and streaming-diloco, not to --reduce bmuf$" --reduce bmuf --fragment-ranges
refused "^sumo train: --slow-beta applies to slowmo and bmuf, not to --reduce localsgd \(localsgd is SlowMo with beta 0\)$" --reduce localsgd --slow-beta 0.5
refused "^sumo train: --acga-beta applies to acga, not to --reduce diloco \(--outer-combine acga of diloco" --reduce diloco --outer-combine acga --acga-beta 0.9
refused "^sumo train: --acga-no-guard applies to acga, not to any of --reduce avg,adasum$" --reduce avg,adasum --acga-no-guard
refused "^sumo train: --adasum-group-size applies to adasum and adasum-delta, not to --reduce diloco \(--outer-combine adasum of diloco" --reduce diloco --outer-combine adasum --adasum-group-size 0
refused "^sumo train: --adasum-hierarchical applies to adasum and adasum-delta, not to --reduce acga$" --reduce acga --adasum-hierarchical
# A DiLoCo run shorter than its first synchronisation is refused as SlowMo's is (quick: 8 steps
# with one worker, 4 with two; Streaming's last fragment is applied --delay steps after H).
refused "^sumo train: --reduce diloco: the run has 8 step.*fewer than --sync-every 500: .*would never run\. Give --sync-every 8 or less" --reduce diloco
refused "^sumo train: --reduce streaming-diloco: the run has 4 step.*fewer than --sync-every 4 \+ --delay 1 = 5: .*fragment 2 of 2\) would never run and the workers would end unsynchronised" \
  --workers 2 --reduce streaming-diloco --sync-every 4 --fragments 2
refused "^sumo train: --reduce diloco@2: the run has 8 step.*fewer than --sync-every 9: " --reduce avg,diloco@2 --sync-every 9
grep -q "(null)" "$tmp/r.out" && fail "a message says (null)" || true
long=$(printf 'x%.0s' $(seq 1100))
refused "--log .*too long" --log "$tmp/$long.csv"
refused "--checkpoint-dir .*too long" --checkpoint-dir "$tmp/$long"

# ---- files: what cannot be written is an error before training, naming the file ----
# lost PATTERN ARGS...: a non-zero exit, PATTERN in the message, and no training done.
lost() {
  local pattern=$1; shift
  "$sumo" train "${quick[@]}" "$@" > "$tmp/l.out" 2>&1
  local code=$?
  if [ $code -ne 0 ] && grep -F -- "$pattern" "$tmp/l.out" > /dev/null && ! grep -q fnv1a "$tmp/l.out"; then
    ok "refused before training: $* ($(head -1 "$tmp/l.out"))"
  else fail "not refused: $* -> exit $code: $(head -3 "$tmp/l.out")"; fi
}
lost "/nonexistent/x.csv" --log /nonexistent/x.csv
lost "/nonexistent/x.avg.csv" --reduce avg,sum --log /nonexistent/x.csv
lost "/dev/full" --log /dev/full
lost "/nonexistent/s.csv" --summary /nonexistent/s.csv
"$sumo" train "${quick[@]}" --summary /dev/full > "$tmp/l.out" 2>&1
[ $? -ne 0 ] && grep -q "/dev/full" "$tmp/l.out" && ok "summary on a full disk: an error naming the file" \
  || fail "summary on a full disk: $(tail -2 "$tmp/l.out")"

# Several methods share --checkpoint-dir through a sub-folder each, and all can be resumed.
"$sumo" train "${quick[@]}" --reduce avg,sum --checkpoint-dir "$tmp/ck3" > "$tmp/g1.out" 2>&1
[ -f "$tmp/ck3/avg/latest" ] && [ -f "$tmp/ck3/sum/latest" ] && ok "several methods: a checkpoint folder each" \
  || fail "several methods: $(ls -R "$tmp/ck3" 2>&1 | head -5)"
"$sumo" train "${quick[@]}" --epochs 2 --reduce avg,sum --checkpoint-dir "$tmp/ck3" --resume > "$tmp/g2.out" 2>&1
[ $? -eq 0 ] && ok "several methods: each resumes from its own checkpoint" || fail "several methods resume: $(tail -2 "$tmp/g2.out")"

# A fresh run does not silently replace a checkpoint; --overwrite does, on request.
"$sumo" train "${quick[@]}" --checkpoint-dir "$tmp/ck4" > /dev/null 2>&1
"$sumo" train "${quick[@]}" --checkpoint-dir "$tmp/ck4" > "$tmp/h.out" 2>&1
[ $? -ne 0 ] && grep -q "$tmp/ck4 holds a checkpoint" "$tmp/h.out" && grep -q -- "--overwrite" "$tmp/h.out" \
  && ok "fresh run into a folder with a checkpoint refused, naming it" || fail "fresh run over a checkpoint: $(tail -2 "$tmp/h.out")"
touch "$tmp/ck4/step-999.rank-0.ckpt.tmp.$dead"
"$sumo" train "${quick[@]}" --checkpoint-dir "$tmp/ck4" --overwrite > "$tmp/h2.out" 2>&1
[ $? -eq 0 ] && [ ! -e "$tmp/ck4/step-999.rank-0.ckpt.tmp.$dead" ] && ok "--overwrite starts afresh; a dead writer's temporary is removed" \
  || fail "--overwrite: $(tail -2 "$tmp/h2.out"); $(ls "$tmp/ck4")"

# --keep K keeps the K latest.
"$sumo" train "${quick[@]}" --batch 8 --checkpoint-dir "$tmp/ck5" --checkpoint-every 5 --keep 3 > /dev/null 2>&1
n=$(ls "$tmp"/ck5/step-*.rank-0.ckpt 2>/dev/null | wc -l)
[ "$n" -eq 3 ] && ok "--keep 3 keeps 3 checkpoints" || fail "--keep 3 kept $n"

# Resuming with other flags names them; more epochs (constant schedule) are allowed.
"$sumo" train "${common[@]}" --lr 0.1 --checkpoint-dir "$tmp/ck" --resume > "$tmp/i.out" 2>&1
[ $? -ne 0 ] && grep -q -- "--lr 0.05.* in the checkpoint, 0.1.* now" "$tmp/i.out" \
  && ok "resume with another --lr refused, naming the flag and both values" || fail "resume with other flags: $(tail -2 "$tmp/i.out")"
"$sumo" train "${common[@]}" --epochs 1 --checkpoint-dir "$tmp/ck6" > /dev/null 2>&1
"$sumo" train "${common[@]}" --epochs 2 --checkpoint-dir "$tmp/ck6" --resume > "$tmp/j.out" 2>&1
[ "$(checksum "$tmp/j.out")" = "$A" ] && ok "resume with more --epochs trains on, bit-identical to one longer run" \
  || fail "resume with more epochs: $(tail -2 "$tmp/j.out")"

# ---- waiting and resources ----
# Under a memory limit most of 512 worker threads cannot start: the run fails at once (the
# runner tells the started ones), not after the peers' deadline.
# (AddressSanitizer reserves terabytes of address space: it cannot run under ulimit -v.)
if ldd "$sumo" | grep libasan > /dev/null; then echo "skip - threads that cannot start (an ASan build)"; else
start=$(date +%s)
(ulimit -v 1500000; SUMO_TIMEOUT=30 "$sumo" train --workers 512 --batch 1 --train-limit 2048 --test-limit 100 --no-progress) > "$tmp/k.out" 2>&1
code=$? took=$(( $(date +%s) - start ))
[ $code -ne 0 ] && [ $took -lt 15 ] && grep -q "could not be started" "$tmp/k.out" \
  && ok "worker threads that cannot start: fails in ${took}s, not at the 30 s deadline" \
  || fail "threads that cannot start: exit $code after ${took}s: $(tail -1 "$tmp/k.out")"
fi

# A malformed deadline is refused once, by name, before any worker starts: the workers'
# communicators and the room where joining threads wait read SUMO_TIMEOUT through the one
# settings table (not a bare number, not above 0, past its bound).
for v in soon 0 1e9; do
  for how in plain elastic; do
    extra=()
    [ $how = elastic ] && extra=(--workers 2 --elastic --join 2)
    SUMO_TIMEOUT=$v "$sumo" train "${quick[@]}" "${extra[@]}" > "$tmp/to.out" 2>&1
    code=$?
    [ $code -ne 0 ] && [ "$(grep -c "SUMO_TIMEOUT" "$tmp/to.out")" -eq 1 ] \
      && grep -q "^sumo train: avg: SUMO_TIMEOUT='$v' is not a deadline: expected seconds, a number > 0" "$tmp/to.out" \
      && ! grep -q fnv1a "$tmp/to.out" \
      && ok "SUMO_TIMEOUT=$v refused by name ($how)" || fail "SUMO_TIMEOUT=$v ($how): exit $code: $(head -3 "$tmp/to.out")"
  done
done

# ---- what a newcomer reads ----
"$sumo" train "${quick[@]}" --epochs 2 --reduce avg@linear > "$tmp/n.out" 2> "$tmp/n.err"
grep -q "to target  epochs until" "$tmp/n.out" && grep -q "^target: 85.00% test accuracy" "$tmp/n.out" \
  && ok "the table has a legend and names the target" || fail "no legend: $(head -5 "$tmp/n.out")"
"$sumo" train --workers 1 --epochs 2 --batch 32 --train-limit 256 --test-limit 100 --reduce avg@linear 2> "$tmp/p.err" > /dev/null
[ "$(grep -c '^\[avg@linear\] epoch [12]/2' "$tmp/p.err")" -eq 2 ] \
  && ok "stderr not a terminal: one progress line per epoch, labelled as given" || fail "progress: $(cat "$tmp/p.err" | head -3)"
"$sumo" train "${quick[@]}" --workers 2 --train-limit 2000 --lr 1000 --optimizer lamb --reduce sum > "$tmp/q.out" 2>&1
grep -q "^sum .* diverged .*DIVERGED" "$tmp/q.out" && ok "a diverged run is marked" || fail "diverged: $(grep '^sum ' "$tmp/q.out")"
# One worker exchanges nothing: no communication figures in its table or its summary row.
rm -f "$tmp/one.csv"
"$sumo" train "${quick[@]}" --reduce avg,adasum --summary "$tmp/one.csv" > "$tmp/one.out" 2>&1
[ "$(awk '$1 == "avg" || $1 == "adasum" { print $7, $8 }' "$tmp/one.out" | sort -u)" = "- -" ] \
  && grep -q "(-: one worker exchanges nothing)" "$tmp/one.out" \
  && [ "$(awk -F, 'NR > 1 { print $12, $13 }' "$tmp/one.csv" | sort -u)" = "0 0" ] \
  && ok "one worker: no communication figures (table: -, summary: 0)" \
  || fail "one worker's communication figures: $(grep -E '^(avg|adasum) ' "$tmp/one.out"); $(tail -1 "$tmp/one.csv")"
# With several methods a flag goes to those that read it: each entry of a mixed list has the
# bits of the same method run alone with its own flags, and the flags took effect.
mixed=(--workers 2 --epochs 1 --batch 32 --train-limit 1000 --test-limit 100 --no-progress)
hash_of() { sed -n "s/^$2: .*fnv1a \([0-9a-f]*\).*/\1/p" "$1"; }
"$sumo" train "${mixed[@]}" --reduce avg,slowmo,diloco --tau 5 --sync-every 3 > "$tmp/mx.out" 2>&1
"$sumo" train "${mixed[@]}" --reduce avg > "$tmp/mx1.out" 2>&1
"$sumo" train "${mixed[@]}" --reduce slowmo --tau 5 > "$tmp/mx2.out" 2>&1
"$sumo" train "${mixed[@]}" --reduce diloco --sync-every 3 > "$tmp/mx3.out" 2>&1
"$sumo" train "${mixed[@]}" --reduce slowmo,diloco --tau 3 --sync-every 5 > "$tmp/mx4.out" 2>&1
if [ -n "$(hash_of "$tmp/mx.out" avg)" ] && [ "$(hash_of "$tmp/mx.out" avg)" = "$(hash_of "$tmp/mx1.out" avg)" ] \
   && [ "$(hash_of "$tmp/mx.out" slowmo)" = "$(hash_of "$tmp/mx2.out" slowmo)" ] \
   && [ "$(hash_of "$tmp/mx.out" diloco)" = "$(hash_of "$tmp/mx3.out" diloco)" ] \
   && [ -n "$(hash_of "$tmp/mx4.out" slowmo)" ] && [ "$(hash_of "$tmp/mx4.out" slowmo)" != "$(hash_of "$tmp/mx2.out" slowmo)" ] \
   && [ "$(hash_of "$tmp/mx4.out" diloco)" != "$(hash_of "$tmp/mx3.out" diloco)" ]; then
  ok "--reduce avg,slowmo,diloco --tau 5 --sync-every 3: each method as alone with its own flags"
else fail "mixed list: $(grep fnv1a "$tmp/mx.out" "$tmp/mx1.out" "$tmp/mx2.out" "$tmp/mx3.out" "$tmp/mx4.out"; head -2 "$tmp/mx.out")"; fi
# At the bound a DiLoCo run is taken, and syncs (15 steps, H 15: one exchange); a run that
# stops before it (--stop-after) is not refused, since its resumption reaches it.
"$sumo" train "${mixed[@]}" --reduce diloco --sync-every 15 > "$tmp/b15.out" 2>&1
[ "$(awk '$1 == "diloco" { print $6, $8 }' "$tmp/b15.out")" = "15 1" ] && ok "diloco with --sync-every = its 15 steps runs, one exchange" \
  || fail "diloco at the bound: $(head -3 "$tmp/b15.out")"
"$sumo" train "${mixed[@]}" --reduce diloco --sync-every 15 --checkpoint-dir "$tmp/b15ck" --stop-after 3 > "$tmp/b15s.out" 2>&1 \
  && ok "diloco stopped before its first sync (--stop-after 3 of 15) is not refused" || fail "diloco --stop-after: $(head -3 "$tmp/b15s.out")"
# A SlowMo run whose last steps are local says that its workers end apart (62 steps, tau 12:
# 2 after the last exchange), and says nothing when the steps end on an exchange (tau 31).
short=(--workers 2 --epochs 1 --batch 32 --train-limit 4000 --test-limit 200 --no-progress)
"$sumo" train "${short[@]}" --reduce localsgd --tau 12 > "$tmp/u.out" 2>&1
"$sumo" train "${short[@]}" --reduce localsgd --tau 31 > "$tmp/u2.out" 2>&1
grep -q "^localsgd: the last 2 of 62 steps came after the last exchange" "$tmp/u.out" \
  && ! grep -q "after the last exchange" "$tmp/u2.out" \
  && ok "SlowMo ending between exchanges says the workers end apart; ending on one, says nothing" \
  || fail "SlowMo's unsynchronised end: $(grep -h 'exchange' "$tmp/u.out" "$tmp/u2.out")"
# The summary names what the bits depend on besides the code (machine.h).
head -1 "$tmp/one.csv" | grep -q ",fnv1a,blas_core,kernel_isa$" && grep -q "^bits depend on .*OpenBLAS core" "$tmp/one.out" \
  && ok "the summary and the output name the OpenBLAS core and sumo's kernels" || fail "machine columns: $(head -1 "$tmp/one.csv")"

mkdir -p "$tmp/data"
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  printf 'not an idx file' | gzip > "$tmp/data/$f.gz"
done
"$sumo" train --data "$tmp/data" --no-progress > "$tmp/f.out" 2>&1
[ $? -ne 0 ] && grep -q "$tmp/data/train-" "$tmp/f.out" && ok "corrupt data file refused, naming it" || { fail "corrupt data"; cat "$tmp/f.out"; }

# grep without -q reads all of its input: with pipefail, -q could make ldd die of SIGPIPE.
if command -v mpirun > /dev/null && ldd "$sumo" | grep libmpi > /dev/null; then
  # The debug log says whether the gradients' allreduce ran direct (sumo_mem_alloc'd buffers).
  SUMO_DEBUG=INFO mpirun -np 2 --oversubscribe --allow-run-as-root --mca btl self,vader "$sumo" train "${common[@]}" --transport mpi > "$tmp/m.out" 2>&1
  [ "$(checksum "$tmp/m.out")" = "$A" ] && ok "MPI transport (2 processes) = threads transport, bit for bit" \
    || { fail "MPI differs: $(checksum "$tmp/m.out") vs $A"; tail -5 "$tmp/m.out"; }
  grep -c "every rank's buffers are shared, direct" "$tmp/m.out" > "$tmp/direct.n"
  [ "$(cat "$tmp/direct.n")" -gt 0 ] && ok "MPI: gradients in shared memory, reduced without staging copies" \
    || fail "MPI: the gradients' allreduce was staged (no direct call in the debug log)"
  mpirun -np 2 --oversubscribe --allow-run-as-root --mca btl self,vader "$sumo" train "${common[@]}" --transport mpi \
    --checkpoint-dir "$tmp/mck" --checkpoint-every 20 --stop-after 55 > "$tmp/m1.out" 2>&1
  mpirun -np 2 --oversubscribe --allow-run-as-root --mca btl self,vader "$sumo" train "${common[@]}" --transport mpi \
    --checkpoint-dir "$tmp/mck" --checkpoint-every 20 --resume > "$tmp/m2.out" 2>&1
  n=$(ls "$tmp"/mck/step-*.rank-1.ckpt 2>/dev/null | wc -l)
  [ "$(checksum "$tmp/m2.out")" = "$A" ] && [ "$n" -eq 2 ] && ok "MPI: stopped, resumed: bit-identical; 2 checkpoints kept per rank" \
    || { fail "MPI resume: $(checksum "$tmp/m2.out") vs $A, $n files of rank 1"; tail -3 "$tmp/m2.out"; }
  # Under mpirun the ranks are the workers: another --workers is refused, saying how to set it.
  SUMO_TIMEOUT=60 timeout -k 10 50 mpirun -np 2 --oversubscribe --allow-run-as-root --mca btl self,vader "$sumo" train "${quick[@]}" \
    --workers 4 > "$tmp/mw.out" 2>&1
  code=$?
  [ $code -ne 0 ] && [ $code -ne 124 ] && grep -q -- "--workers 4, but under mpirun the processes are the workers (this job has 2).*mpirun -np 4" "$tmp/mw.out" \
    && [ "$(grep -c -- '--workers 4, but' "$tmp/mw.out")" -eq 1 ] && ! grep -q fnv1a "$tmp/mw.out" \
    && ok "MPI: --workers 4 on 2 processes refused once, naming mpirun -np" || fail "MPI --workers 4: exit $code: $(head -3 "$tmp/mw.out")"
  # Only rank 0 writes the log: the others must learn that it cannot, and every rank leave.
  SUMO_TIMEOUT=60 timeout -k 10 50 mpirun -np 2 --oversubscribe --allow-run-as-root --mca btl self,vader "$sumo" train "${quick[@]}" \
    --workers 2 --transport mpi --log /nonexistent/x.csv > "$tmp/m3.out" 2>&1
  code=$?
  [ $code -ne 0 ] && [ $code -ne 124 ] && grep -q "/nonexistent/x.csv" "$tmp/m3.out" \
    && ok "MPI: a log rank 0 cannot open ends every rank before training" || fail "MPI unwritable log: exit $code"
fi

# The tasks of an srun step, from the variables srun sets (tests/slurm/run.sh runs a real
# Slurm): two processes meet through a folder under TMPDIR, reduce over shared memory, get the
# threads transport's bits and leave no folder behind; a step across nodes, and shm outside a
# step, are refused by name.
step_env() { env SLURM_JOB_ID=$$ SLURM_STEP_ID=0 SLURM_NTASKS=2 SLURM_STEP_NUM_NODES=1 SLURM_SRUN_COMM_PORT=1 \
  SLURM_STEP_NODELIST=localhost SLURM_LOCALID=0 TMPDIR="$tmp" "$@"; }
no_workers=("${common[@]:2}")
step_env SLURM_PROCID=0 "$sumo" train "${no_workers[@]}" > "$tmp/srun0.out" 2>&1 &
p0=$!
step_env SLURM_PROCID=1 "$sumo" train "${no_workers[@]}" > "$tmp/srun1.out" 2>&1
wait $p0
[ "$(checksum "$tmp/srun0.out")" = "$A" ] && [ -z "$(checksum "$tmp/srun1.out")" ] \
  && [ -z "$(ls -d "$tmp"/sumo-* 2> /dev/null)" ] \
  && ok "two srun tasks (shm, meeting in a folder) = threads transport, bit for bit; the folder removed" \
  || { fail "srun tasks: $(checksum "$tmp/srun0.out") vs $A"; tail -3 "$tmp/srun0.out" "$tmp/srun1.out"; }
step_env SLURM_PROCID=0 SLURM_STEP_NUM_NODES=2 "$sumo" train "${quick[@]:2}" > "$tmp/srun2.out" 2>&1
[ $? -eq 2 ] && grep -q "spans 2 nodes.*--mpi=pmix" "$tmp/srun2.out" && ok "an srun step across nodes without MPI refused, naming srun --mpi=pmix" \
  || fail "srun across nodes: $(head -2 "$tmp/srun2.out")"
step_env SLURM_PROCID=zero "$sumo" train "${quick[@]:2}" > "$tmp/srun3.out" 2>&1
[ $? -eq 2 ] && grep -q "SLURM_PROCID=zero is not a number" "$tmp/srun3.out" && ok "a malformed SLURM_PROCID refused, naming it" \
  || fail "malformed SLURM_PROCID: $(head -2 "$tmp/srun3.out")"
refused "--transport shm joins the tasks of an srun step" --transport shm
# Launchers whose processes the command does not join are refused rather than each process
# training alone, unless --transport threads says that is meant.
env TORCHELASTIC_RUN_ID=t RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 "$sumo" train "${quick[@]}" \
  > "$tmp/tr.out" 2>&1
[ $? -eq 2 ] && grep -q "started by torchrun, whose processes .sumo train. does not join" "$tmp/tr.out" \
  && ok "sumo train under torchrun refused, naming it" || fail "under torchrun: $(head -2 "$tmp/tr.out")"
env SLURM_NTASKS=4 SLURM_JOB_ID=1 "$sumo" train "${quick[@]}" > "$tmp/sb.out" 2>&1
[ $? -eq 2 ] && grep -q "batch script.*SLURM_NTASKS=4.*--transport threads" "$tmp/sb.out" \
  && ok "sumo train in a batch script outside srun refused, naming --transport threads" \
  || fail "batch script: $(head -2 "$tmp/sb.out")"
env SLURM_NTASKS=4 SLURM_JOB_ID=1 "$sumo" train "${quick[@]}" --transport threads > "$tmp/sb2.out" 2>&1
[ $? -eq 0 ] && grep -q fnv1a "$tmp/sb2.out" && ok "... and run with --transport threads" \
  || fail "batch script, --transport threads: $(tail -2 "$tmp/sb2.out")"

# Streaming DiLoCo stopped while an exchange is in flight (fragment 0 starts at step 12 and is
# applied at 14) and resumed: the same parameters and log as the run that never stopped.
sd=(--reduce streaming-diloco --sync-every 8 --fragments 2 --delay 2 --quantize e4m3 --strided-fragments)
"$sumo" train "${common[@]}" "${sd[@]}" --log "$tmp/s.csv" > "$tmp/s.out" 2>&1
S=$(checksum "$tmp/s.out")
"$sumo" train "${common[@]}" "${sd[@]}" --checkpoint-dir "$tmp/sck" --stop-after 13 --log "$tmp/s2.csv" > "$tmp/s1.out" 2>&1
"$sumo" train "${common[@]}" "${sd[@]}" --checkpoint-dir "$tmp/sck" --resume --log "$tmp/s2.csv" > "$tmp/s2.out" 2>&1
if [ -n "$S" ] && [ "$(checksum "$tmp/s2.out")" = "$S" ] && cmp -s <(rows "$tmp/s.csv") <(rows "$tmp/s2.csv"); then
  ok "streaming-diloco stopped with an exchange in flight, resumed: bit-identical parameters and log"
else fail "streaming-diloco resume ($(checksum "$tmp/s2.out") vs $S)"; tail -3 "$tmp/s2.out"; fi
"$sumo" train "${common[@]}" --reduce streaming-diloco --sync-every 8 --fragments 2 --delay 3 --checkpoint-dir "$tmp/sck" --resume > "$tmp/s3.out" 2>&1
[ $? -ne 0 ] && grep -q -- "--delay" "$tmp/s3.out" && ok "resume with another --delay refused, naming it" \
  || { fail "resume with another --delay"; tail -3 "$tmp/s3.out"; }

# Bytes per step and peak bytes in flight against a hand count. The MLP 784-128-10 has
# tensors of 100352, 128, 1280 and 10 elements (101770); 2 workers x 32 over 4000 items is 62
# steps. DDP: 101770 x 4 = 407080 bytes every step. DiLoCo, H 8, fp32: the whole model at
# steps 8, 16, ..., 56, 7 x 407080 / 62 = 45960.6 a step, 407080 at once. Streaming, F 2,
# E3M0 in blocks of 128 (a 4-byte scale and 64 bytes of codes, a short block padded):
# fragment 0 closes at the first tensor boundary reaching ceil(101770 / 2), so it is the first
# weight, 100352 elements = 784 blocks = 53312 bytes, synced at 4, 12, ..., 60 (8 times);
# fragment 1 is the other 1418 elements = 12 blocks = 816 bytes, at 8, ..., 56 (7 times):
# (8 x 53312 + 7 x 816) / 62 = 6971.1 a step, 53312 at most in flight.
bytes=(--workers 2 --epochs 1 --batch 32 --train-limit 4000 --test-limit 200 --no-progress)
rm -f "$tmp/bytes.csv"
"$sumo" train "${bytes[@]}" --reduce avg --summary "$tmp/bytes.csv" > /dev/null 2>&1
"$sumo" train "${bytes[@]}" --reduce diloco --sync-every 8 --summary "$tmp/bytes.csv" > /dev/null 2>&1
"$sumo" train "${bytes[@]}" --reduce streaming-diloco --sync-every 8 --fragments 2 --delay 1 --quantize e3m0 \
  --quantize-block 128 --summary "$tmp/bytes.csv" > "$tmp/bytes.out" 2>&1
got=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
  { printf "%s %s %s %s;", $c["method"], $c["steps"], $c["bytes_per_step"], $c["peak_bytes_in_flight"] }' "$tmp/bytes.csv")
[ "$got" = "avg 62 407080.0 407080;diloco 62 45960.6 407080;streaming-diloco 62 6971.1 53312;" ] \
  && grep -q "^streaming-diloco: .*, 6971.1 bytes sent per step, at most 53312 in flight$" "$tmp/bytes.out" \
  && ok "bytes per step and peak bytes in flight: DDP, DiLoCo H 8, Streaming F 2 E3M0 as counted by hand" \
  || fail "bytes per step and peak in flight: $got; $(grep '^streaming-diloco:' "$tmp/bytes.out")"

for m in adasum adasum-delta acga slowmo localsgd bmuf diloco streaming-diloco; do
  h=(); case $m in *diloco) h=(--sync-every 8) ;; esac
  "$sumo" train "${common[@]}" --workers 3 --epochs 1 --reduce $m "${h[@]}" --verify-ranks > "$tmp/$m.out" 2>&1 \
    && grep -q "^$m " "$tmp/$m.out" && ok "--reduce $m runs, ranks agree after every synchronised step" \
    || { fail "--reduce $m"; tail -3 "$tmp/$m.out"; }
done

# The gossip bases: one model's worth a round (SGP, OSGP: one out-peer a step; D-PSGD on 3
# workers: both neighbours, twice that), and a run of SlowMo over OSGP stopped with a round in
# flight resumes bit-identical.
rm -f "$tmp/gossip.csv"
for m in sgp osgp; do "$sumo" train "${bytes[@]}" --reduce $m --summary "$tmp/gossip.csv" > /dev/null 2>&1; done
"$sumo" train "${bytes[@]}" --workers 3 --reduce dpsgd --summary "$tmp/gossip.csv" > /dev/null 2>&1
got=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
  { printf "%s %s;", $c["method"], $c["bytes_per_step"] }' "$tmp/gossip.csv")
[ "$got" = "sgp 407080.0;osgp 407080.0;dpsgd 814160.0;" ] \
  && ok "gossip bytes per step: SGP and OSGP one model a step, D-PSGD on 3 workers two" \
  || fail "gossip bytes per step: $got"
g=("${common[@]}" --epochs 1 --workers 3 --reduce slowmo-osgp --tau 8)
"$sumo" train "${g[@]}" > "$tmp/g.out" 2>&1
G=$(checksum "$tmp/g.out")
"$sumo" train "${g[@]}" --checkpoint-dir "$tmp/gck" --checkpoint-every 10 --stop-after 29 > /dev/null 2>&1
"$sumo" train "${g[@]}" --checkpoint-dir "$tmp/gck" --checkpoint-every 10 --resume > "$tmp/g2.out" 2>&1
[ -n "$G" ] && [ "$(checksum "$tmp/g2.out")" = "$G" ] \
  && ok "slowmo-osgp stopped at step 29 (a round in flight) resumes bit-identical" \
  || fail "slowmo-osgp resume: $G vs $(checksum "$tmp/g2.out")"
for m in sgp osgp dpsgd slowmo-sgp slowmo-osgp slowmo-dpsgd; do
  "$sumo" train "${common[@]}" --workers 3 --epochs 1 --reduce $m --tau 8 > "$tmp/$m.out" 2>&1 \
    && grep -q "^$m " "$tmp/$m.out" && ok "--reduce $m runs" || { fail "--reduce $m"; tail -3 "$tmp/$m.out"; }
done

echo "train cli: $passed passed, $failed failed"
[ $failed -eq 0 ]
