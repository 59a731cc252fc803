#!/usr/bin/env bash
# Checks of the project's scripts that do not fit a unit test: scripts/deps.sh's switch that
# leaves out the Python packages, scripts/check-recorded (a recorded hash that no longer comes
# out fails it, a row recorded with other kernels and another OpenBLAS core is run with them
# and compared, --every-isa runs the rows under each kernel set this CPU has, a row whose
# kernels or core cannot run here is skipped saying why, a command of another shape is
# refused),
# scripts/experiment's refusals and its --kernels check of a figure's claims, and scripts/check-layers refusing a violation made in a copy
# of the tree. Run from anywhere; needs build/sumo (make).
set -uo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0
ok()   { echo "ok   - $*"; passed=$((passed + 1)); }
fail() { echo "FAIL - $*"; failed=$((failed + 1)); }

# ---- scripts/deps.sh ----
all=$(scripts/deps.sh --print 2>&1)
nopy=$(SUMO_NO_PYTHON=1 scripts/deps.sh --print 2>&1)
if echo "$all" | grep -qx python3-torch && echo "$all" | grep -qx build-essential \
   && ! echo "$nopy" | grep -qE '^python3-(torch|pytest|venv)$' && echo "$nopy" | grep -qx build-essential \
   && [ "$(echo "$all" | wc -l)" -eq $(( $(echo "$nopy" | wc -l) + 3 )) ]; then
  ok "deps.sh: SUMO_NO_PYTHON=1 leaves out python3-torch, python3-pytest and python3-venv, nothing else"
else fail "deps.sh --print: all '$(echo $all)', SUMO_NO_PYTHON=1 '$(echo $nopy)'"; fi
SUMO_NO_PYTHON=yes scripts/deps.sh --print > "$tmp/d.out" 2>&1
code=$?
[ $code -eq 2 ] && grep -q "SUMO_NO_PYTHON='yes'.*1 skips" "$tmp/d.out" \
  && ok "deps.sh: SUMO_NO_PYTHON=yes refused, naming the accepted values" || fail "deps.sh SUMO_NO_PYTHON=yes: exit $code: $(cat "$tmp/d.out")"

# ---- scripts/check-recorded ----
cmd="./build/sumo train --seed 1 --no-progress --workers 2 --epochs 1 --batch 32 --train-limit 2000 --test-limit 200 --reduce avg"
$cmd --summary "$tmp/row.csv" > /dev/null 2>&1 || fail "the short row does not run: $cmd"
# recorded FILE HASH BLAS ISA [COMMAND]: a CSV of one row as scripts/experiment writes it.
recorded() {
  { echo "label,$(head -1 "$tmp/row.csv"),command"
    tail -1 "$tmp/row.csv" | awk -F, -v OFS=, -v h="$2" -v b="$3" -v i="$4" '{ $(NF - 2) = h; $(NF - 1) = b; $NF = i; print }' \
      | sed "s|^|short,|; s|\$|,\"${5:-$cmd}\"|"; } > "$1"
}
here_blas=$(tail -1 "$tmp/row.csv" | awk -F, '{ print $(NF - 1) }')
here_isa=$(tail -1 "$tmp/row.csv" | awk -F, '{ print $NF }')
right=$(tail -1 "$tmp/row.csv" | awk -F, '{ print $(NF - 2) }')
recorded "$tmp/same.csv" "$right" "$here_blas" "$here_isa"
scripts/check-recorded "$tmp/same.csv" > "$tmp/c1.out" 2>&1 && grep -q "^ok .*as recorded" "$tmp/c1.out" \
  && ok "check-recorded: a row that reproduces passes" || fail "check-recorded, same hash: $(tail -3 "$tmp/c1.out")"
recorded "$tmp/moved.csv" 0123456789abcdef "$here_blas" "$here_isa"
scripts/check-recorded "$tmp/moved.csv" > "$tmp/c2.out" 2>&1
code=$?
[ $code -eq 1 ] && grep -q "fnv1a $right, recorded 0123456789abcdef" "$tmp/c2.out" && grep -q "regenerate the results" "$tmp/c2.out" \
  && ok "check-recorded: a hash that no longer comes out fails, naming both" || fail "check-recorded, moved bits: exit $code: $(tail -3 "$tmp/c2.out")"
# A row as another CPU records it: portable kernels and OpenBLAS's Sandybridge core (AVX), run
# here with both forced. check-recorded, from a plain environment, forces the same and compares.
if grep -qw avx /proc/cpuinfo; then
  OPENBLAS_CORETYPE=Sandybridge SUMO_KERNEL_ISA=portable $cmd --summary "$tmp/other_row.csv" > /dev/null 2>&1
  other_hash=$(tail -1 "$tmp/other_row.csv" | awk -F, '{ print $(NF - 2) }')
  other_ran=$(tail -1 "$tmp/other_row.csv" | awk -F, '{ print $(NF - 1) "," $NF }')
  recorded "$tmp/other.csv" "$other_hash" Sandybridge portable
  scripts/check-recorded "$tmp/other.csv" > "$tmp/c3.out" 2>&1
  code=$?
  [ "$other_ran" = Sandybridge,portable ] && [ $code -eq 0 ] \
    && grep -q "^ok .* under portable kernels, OpenBLAS Sandybridge: fnv1a $other_hash as recorded" "$tmp/c3.out" \
    && ok "check-recorded: a row recorded with other kernels and another OpenBLAS core runs with them and compares" \
    || fail "check-recorded, another CPU's row: recorded with $other_ran, exit $code: $(tail -3 "$tmp/c3.out")"
else ok "check-recorded: another CPU's row (# SKIP: this CPU has no AVX for OpenBLAS's Sandybridge core)"; fi
# --every-isa: the rows under every kernel set this CPU has, forced in turn. The average's
# row is compared under each (the elementwise kernels give the same bits on every set); an
# Adasum row, whose dot products follow the vector width, is compared under the record's set
# and run, its hash said, not compared, under each other one. A run that skipped a set
# would compare fewer.
sets=0
for s in portable avx2 avx512; do SUMO_KERNEL_ISA=$s ./build/sumo environment --check 2> /dev/null && sets=$((sets + 1)); done
if [ $sets -ge 2 ]; then
  acmd="./build/sumo train --seed 1 --no-progress --workers 2 --epochs 1 --batch 32 --train-limit 2000 --test-limit 200 --reduce adasum"
  $acmd --summary "$tmp/arow.csv" > /dev/null 2>&1 || fail "the short Adasum row does not run: $acmd"
  cp "$tmp/same.csv" "$tmp/every.csv"
  tail -1 "$tmp/arow.csv" | sed "s|^|short adasum,|; s|\$|,\"$acmd\"|" >> "$tmp/every.csv"
  scripts/check-recorded --every-isa "$tmp/every.csv" > "$tmp/c6.out" 2>&1
  code=$?
  [ $code -eq 0 ] && [ "$(grep -c '^ok .*(avg, 2 workers) under .* as recorded' "$tmp/c6.out")" -eq $sets ] \
    && [ "$(grep -c "^ok .*(adasum, 2 workers) under $here_isa kernels.* as recorded" "$tmp/c6.out")" -eq 1 ] \
    && [ "$(grep -c '^note .*(adasum, 2 workers) under .*not compared' "$tmp/c6.out")" -eq $((sets - 1)) ] \
    && grep -q "^check-recorded: $((sets + 1)) row run(s) compared" "$tmp/c6.out" \
    && ok "check-recorded --every-isa: each of this CPU's $sets kernel sets forced in turn, the average compared under each, Adasum under the record's" \
    || fail "check-recorded --every-isa: exit $code: $(cat "$tmp/c6.out")"
else ok "check-recorded --every-isa (# SKIP: this CPU runs one kernel set)"; fi
recorded "$tmp/lacks.csv" 0123456789abcdef "$here_blas" avx1024
recorded "$tmp/core.csv" 0123456789abcdef OtherCore "$here_isa"
scripts/check-recorded "$tmp/lacks.csv" "$tmp/core.csv" > "$tmp/c5.out" 2>&1
code=$?
[ $code -eq 0 ] && grep -q "^skip .*recorded with avx1024 kernels: SUMO_KERNEL_ISA='avx1024' is not an instruction set" "$tmp/c5.out" \
  && grep -q "^skip .*recorded with OpenBLAS core OtherCore: .*OtherCore kernels" "$tmp/c5.out" \
  && grep -q "0 row run(s) compared.* 2 skipped" "$tmp/c5.out" \
  && ok "check-recorded: rows whose kernels or OpenBLAS core cannot run here are skipped, saying why" \
  || fail "check-recorded, kernels or core not here: exit $code: $(cat "$tmp/c5.out")"
recorded "$tmp/shape.csv" "$right" "$here_blas" "$here_isa" "./build/sumo train --seed 1; touch $tmp/ran"
scripts/check-recorded "$tmp/shape.csv" > "$tmp/c4.out" 2>&1
code=$?
recorded "$tmp/shape2.csv" "$right" "$here_blas" "$here_isa" "touch $tmp/ran"
scripts/check-recorded "$tmp/shape2.csv" >> "$tmp/c4.out" 2>&1
code2=$?
[ $code -eq 2 ] && [ $code2 -eq 2 ] && [ ! -e "$tmp/ran" ] && [ "$(grep -c "not a './build/sumo train ...' command" "$tmp/c4.out")" -eq 2 ] \
  && ok "check-recorded: a command of another shape is refused, not run" || fail "check-recorded, other shape: exit $code: $(tail -3 "$tmp/c4.out")"

# ---- scripts/experiment ----
scripts/experiment e1 --seeds 1,x > "$tmp/e.out" 2>&1
code=$?
[ $code -eq 2 ] && grep -q -- "--seeds '1,x'" "$tmp/e.out" && ok "experiment: a bad --seeds refused, naming it" \
  || fail "experiment --seeds 1,x: exit $code: $(cat "$tmp/e.out")"
scripts/experiment e2 --replot --out "$tmp/none" > "$tmp/e.out" 2>&1
code=$?
[ $code -eq 2 ] && grep -q -- "--replot needs $tmp/none/e2.csv" "$tmp/e.out" && ok "experiment: --replot without a CSV refused" \
  || fail "experiment --replot without a CSV: exit $code: $(cat "$tmp/e.out")"

scripts/experiment e2 --replot --resume > "$tmp/e.out" 2>&1
code=$?
[ $code -eq 2 ] && grep -q -- "give one" "$tmp/e.out" && ok "experiment: --replot with --resume refused" \
  || fail "experiment --replot --resume: exit $code: $(cat "$tmp/e.out")"
# --kernels checks the claims of an experiment's figure (eN_claims) on rows run under other
# kernels against the record, results/eN.csv; here on copies of the record's rows (--replot:
# no training). kcsv DIR ISA CORE [ACC [EXP]]: EXP's rows (e2 unless given) as if run under
# ISA and CORE, E2's 8-worker AR-SGD rows' final accuracy set to ACC if given.
kcsv() {
  mkdir -p "$1"
  awk -F, -v OFS=, -v isa="$2" -v core="$3" -v acc="${4:-}" 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; print; next }
    { $c["kernel_isa"] = isa; $c["blas_core"] = core
      if (acc != "" && $c["label"] == "AR-SGD" && $c["workers"] == 8) $c["final_accuracy"] = acc
      print }' "results/${5:-e2}.csv" > "$1/${5:-e2}.csv"
}
kcsv "$tmp/k1" portable Sandybridge
scripts/experiment e2 --replot --kernels portable,Sandybridge --record results/e2.csv --out "$tmp/k1" > "$tmp/k.out" 2>&1
code=$?
[ $code -eq 0 ] && grep -q "^| SlowMo beta 0.5 ahead of AR-SGD beyond the spread, 8 workers | holds: .* | holds: " "$tmp/k1/e2-claims.md" \
  && grep -q "^1[01] of the claims that hold on the record hold under portable,Sandybridge; 0 do not" "$tmp/k.out" \
  && ok "experiment --kernels: the record's claims hold on the same rows, each with its figures" \
  || fail "experiment --kernels, the same rows: exit $code: $(tail -5 "$tmp/k.out")"
# AR-SGD at 8 workers level with SlowMo (86.40 against 86.43 +- 0.12): the claim that SlowMo
# is ahead fails here, and so does Local SGD's (85.74 against 86.40: behind beyond the spread).
kcsv "$tmp/k2" portable Sandybridge 0.8640
scripts/experiment e2 --replot --kernels portable,Sandybridge --out "$tmp/k2" > "$tmp/k.out" 2>&1
code=$?
[ $code -eq 1 ] && grep -q "^| SlowMo beta 0.5 ahead of AR-SGD beyond the spread, 8 workers | holds: .* | \*\*does not hold\*\*: 86.43 ± 0.12 against 86.40 ± 0.00" "$tmp/k.out" \
  && grep -q "^| SlowMo beta 0.5 ahead of AR-SGD beyond the spread, 16 workers | holds: .* | holds: " "$tmp/k.out" \
  && grep -q "2 claim(s) of the record fail under --kernels portable,Sandybridge" "$tmp/k.out" \
  && ok "experiment --kernels: a claim of the record that fails under the other kernels fails the run, naming it" \
  || fail "experiment --kernels, a claim lost: exit $code: $(tail -5 "$tmp/k.out")"
kcsv "$tmp/k3" avx2 Zen
scripts/experiment e2 --replot --kernels portable,Sandybridge --out "$tmp/k3" > "$tmp/k.out" 2>&1
code=$?
[ $code -eq 1 ] && grep -q "rows of $tmp/k3/e2.csv ran with avx2,Zen" "$tmp/k.out" \
  && ok "experiment --kernels: rows that ran under other kernels than asked are refused" \
  || fail "experiment --kernels, rows of other kernels: exit $code: $(tail -3 "$tmp/k.out")"
kcsv "$tmp/k4" portable Sandybridge "" e1
scripts/experiment e1 --replot --kernels portable,Sandybridge --out "$tmp/k4" > "$tmp/k.out" 2>&1
code=$?
[ $code -eq 0 ] && grep -q "^| SGD at 2048: Adasum on deltas ahead of the average beyond the spread | holds: .* | holds: " "$tmp/k.out" \
  && grep -q "of the claims that hold on the record hold under portable,Sandybridge; 0 do not" "$tmp/k.out" \
  && ok "experiment --kernels: E1's claims on the same rows hold" || fail "experiment e1 --kernels, the same rows: exit $code: $(tail -5 "$tmp/k.out")"
for bad in "e2 --kernels portable" "e3 --kernels portable,Sandybridge" \
           "e2 --kernels avx1024,Zen --out $tmp/k1" "e2 --kernels portable,Zen --out results" "e2 --record results/e2.csv"; do
  scripts/experiment $bad > "$tmp/k.out" 2>&1
  code=$?
  [ $code -eq 2 ] || { fail "experiment $bad: exit $code, not 2: $(cat "$tmp/k.out")"; refused=0; }
done
[ "${refused:-1}" -eq 1 ] && ok "experiment --kernels: a bad ISA,CORE, E3 (timings), an unknown set, the record as the output, --record alone refused"

# ---- scripts/check-layers ----
# layers NAME FILE TEXT EXPECT: the tree copied, TEXT appended to FILE, must be refused with a
# line matching EXPECT.
layers() {
  rm -rf "$tmp/tree" && mkdir "$tmp/tree" && cp -r src include cuda tools bench python "$tmp/tree/"
  printf '%s\n' "$3" >> "$tmp/tree/$2"
  scripts/check-layers "$tmp/tree" > "$tmp/l.out" 2>&1
  code=$?
  [ $code -eq 1 ] && grep -qE "$4" "$tmp/l.out" && ok "check-layers: $1 refused" \
    || fail "check-layers, $1: exit $code: $(cat "$tmp/l.out")"
}
scripts/check-layers > "$tmp/l.out" 2>&1 && ok "check-layers: the tree passes" \
  || fail "check-layers on the tree: $(tail -5 "$tmp/l.out")"
layers "the CUDA plugin including an internal header" cuda/table_cuda.c '#include "collectives/comm.h"' \
  '^cuda/table_cuda includes collectives/comm: cuda/ includes the public headers and its own alone$'
layers "a public header including an internal one" include/sumo_shm.h '#include "transport/shm.h"' \
  '^include/sumo_shm includes transport/shm: include/ includes the public headers alone$'
layers "the command including bench's header" tools/sumo/main.c '#include "../../bench/bench_util.h"' \
  '^tools/sumo/main includes bench/bench_util: tools/ includes'
layers "the ctypes binding importing sumo.torch" python/sumo/_lib.py 'from .torch import _runtime' \
  '^sumo._lib imports sumo.torch._runtime, a layer above it$'
layers "two sumo.torch modules importing each other" python/sumo/torch/compression.py \
  'from .optimizer import DistributedOptimizer' '^circle: .*sumo.torch.compression -> sumo.torch.optimizer'
# Calls between the files of one folder: no include says them.
layers "two CUDA files calling each other" cuda/device_cuda.c \
  'void sumo_cuda__probe(void) { sumo_cuda__fill_ipc(0); }' \
  '^circle: .*cuda/ipc_cuda \(calls sumo_cuda__fill_ipc\)'
layers "two files of the command calling each other" tools/sumo/args.c \
  'void args_probe(void) { bench_algo_name(0); }' \
  '^circle: tools/sumo/args -> tools/sumo/bench_options \(calls bench_algo_name\) -> tools/sumo/args$'
layers "two files of a layer calling each other" src/common/settings.c \
  'const char *sumo__probe(void) { return sumo__op_name(0); }' \
  '^circle: .*common/common \(calls sumo__op_name\)'
rm -rf "$tmp/tree" && mkdir "$tmp/tree" && cp -r src include cuda tools bench python "$tmp/tree/"
# ipc_cuda.c stands on device_cuda.c: a call back named in a comment or a string, or one to
# a function of ipc_cuda.c's own (static), is no dependency.
printf '%s\n' '/* sumo_cuda__fill_ipc(k) */' \
  'static void fill_probe(void) { (void)"sumo_cuda__fill_ipc(k)"; k_share(0, 0, 0, 0, 0, 0, 0, 0); }' \
  >> "$tmp/tree/cuda/device_cuda.c"
scripts/check-layers "$tmp/tree" > "$tmp/l.out" 2>&1 \
  && ok "check-layers: a name in a comment or a string, or another file's static function, is no call" \
  || fail "check-layers, comments, strings and static functions: $(cat "$tmp/l.out")"

echo "scripts: $passed passed, $failed failed"
[ $failed -eq 0 ]
