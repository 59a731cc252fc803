#!/usr/bin/env bash
# End-to-end checks of `sumo train` on the real data: a short run learns, an interrupted and
# resumed run (also one killed in the middle of writing a checkpoint) ends bit-identical to an
# uninterrupted one, damaged checkpoints and data are refused with a message naming the file,
# and the MPI transport gives the same parameters as the threads transport.
set -uo pipefail
sumo=${1:?usage: test_train.sh path/to/sumo}
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

"$sumo" train "${common[@]}" --checkpoint-dir "$tmp/ck" --checkpoint-every 20 --stop-after 55 --log "$tmp/b.csv" > "$tmp/b1.out" 2>&1
"$sumo" train "${common[@]}" --checkpoint-dir "$tmp/ck" --checkpoint-every 20 --resume --log "$tmp/b.csv" > "$tmp/b2.out" 2>&1
if [ "$(checksum "$tmp/b2.out")" = "$A" ] && cmp -s <(rows "$tmp/a.csv") <(rows "$tmp/b.csv"); then
  ok "stopped at 55, resumed from 40: bit-identical parameters and log"
else fail "resume differs ($(checksum "$tmp/b2.out") vs $A)"; diff <(rows "$tmp/a.csv") <(rows "$tmp/b.csv") | head; fi

SUMO_FAULT_EXIT_DURING_SAVE=60 "$sumo" train "${common[@]}" --checkpoint-dir "$tmp/ck2" --checkpoint-every 20 --log "$tmp/c.csv" > "$tmp/c1.out" 2>&1
code=$?
latest=$(sed -n 's/.*step \([0-9]*\).*/\1/p' "$tmp/ck2/latest" 2>/dev/null)
[ $code -eq 86 ] && [ "$latest" = 40 ] && ok "killed while writing step 60: step 40 still the latest complete checkpoint" \
  || fail "crash during save: exit $code, latest '$latest'"
"$sumo" train "${common[@]}" --checkpoint-dir "$tmp/ck2" --checkpoint-every 20 --resume --log "$tmp/c.csv" > "$tmp/c2.out" 2>&1
[ "$(checksum "$tmp/c2.out")" = "$A" ] && cmp -s <(rows "$tmp/a.csv") <(rows "$tmp/c.csv") \
  && ok "resumed after the crash: bit-identical" || fail "resume after crash differs"

f=$(ls "$tmp"/ck/step-*.rank-1.ckpt | head -1)
truncate -s -100 "$f"
sed -i 's/step [0-9]*/step '"$(basename "$f" | sed 's/step-\([0-9]*\).*/\1/')"'/' "$tmp/ck/latest"
"$sumo" train "${common[@]}" --checkpoint-dir "$tmp/ck" --resume > "$tmp/d.out" 2>&1
[ $? -ne 0 ] && grep -q "rank-1.ckpt" "$tmp/d.out" && grep -qi "truncated" "$tmp/d.out" \
  && ok "truncated checkpoint refused, naming the file" || { fail "truncated checkpoint"; cat "$tmp/d.out"; }

"$sumo" train "${common[@]}" --checkpoint-dir "$tmp/none" --resume > "$tmp/e.out" 2>&1
[ $? -ne 0 ] && grep -q "no checkpoint" "$tmp/e.out" && ok "resume without a checkpoint refused" || fail "resume without checkpoint"

mkdir -p "$tmp/data"
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  printf 'not an idx file' | gzip > "$tmp/data/$f.gz"
done
"$sumo" train --data "$tmp/data" --no-progress > "$tmp/f.out" 2>&1
[ $? -ne 0 ] && grep -q "$tmp/data/train-" "$tmp/f.out" && ok "corrupt data file refused, naming it" || { fail "corrupt data"; cat "$tmp/f.out"; }

# grep without -q reads all of its input: with pipefail, -q could make ldd die of SIGPIPE.
if command -v mpirun > /dev/null && ldd "$sumo" | grep libmpi > /dev/null; then
  mpirun -np 2 --oversubscribe --allow-run-as-root --mca btl self,vader "$sumo" train "${common[@]}" --transport mpi > "$tmp/m.out" 2>&1
  [ "$(checksum "$tmp/m.out")" = "$A" ] && ok "MPI transport (2 processes) = threads transport, bit for bit" \
    || { fail "MPI differs: $(checksum "$tmp/m.out") vs $A"; tail -5 "$tmp/m.out"; }
fi

for m in adasum adasum-delta acga slowmo localsgd bmuf; do
  "$sumo" train "${common[@]}" --workers 3 --epochs 1 --reduce $m --verify-ranks > "$tmp/$m.out" 2>&1 \
    && grep -q "^$m " "$tmp/$m.out" && ok "--reduce $m runs, ranks agree after every synchronised step" \
    || { fail "--reduce $m"; tail -3 "$tmp/$m.out"; }
done

echo "train cli: $passed passed, $failed failed"
[ $failed -eq 0 ]
