#!/bin/sh
# sumo's models against PyTorch's, one thread each: runs bench/model_throughput (C) and
# bench/torch_throughput.py alternately ROUNDS times and prints, per row, the best samples/s
# of each and their ratio. Alternating and keeping the best makes the ratio robust to other
# load on a shared machine (which only ever slows a run down).
#
# Usage: bench/compare_throughput.sh [build dir (build)] [rounds (3)] [seconds per row (1)]
set -eu
BUILD=${1:-build}
ROUNDS=${2:-3}
SECS=${3:-1}
BIN=$BUILD/model_throughput
if [ ! -x "$BIN" ] || [ bench/model_throughput.c -nt "$BIN" ] || [ "$BUILD/libsumo_train.a" -nt "$BIN" ]; then
    ${CC:-cc} -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc bench/model_throughput.c \
        "$BUILD/libsumo_train.a" "$BUILD/libsumo.a" -lopenblas -lz -lm -pthread -o "$BIN"
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
i=0
while [ "$i" -lt "$ROUNDS" ]; do
    "$BIN" "$SECS" | awk 'NR > 1' >> "$TMP/sumo"
    /usr/bin/python3 bench/torch_throughput.py "$SECS" > "$TMP/torch.out"
    awk '!/^#/ && NR > 2' "$TMP/torch.out" >> "$TMP/torch"
    i=$((i + 1))
done
grep '^#' "$TMP/torch.out" || true
echo "# best of $ROUNDS alternating rounds, $SECS s per row; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
awk '
    FNR == 1 { f++ }
    { key = $1 " " $2; if ($3 > best[f, key]) best[f, key] = $3; keys[key] = 1 }
    END {
        printf "%-6s %6s %14s %14s %7s\n", "model", "batch", "sumo samples/s", "torch samples/s", "ratio"
        n = split("mlp 64,mlp 1024,cnn 64,cnn 1024", order, ",")
        for (i = 1; i <= n; i++) {
            k = order[i]; split(k, p, " ")
            printf "%-6s %6s %14.0f %14.0f %6.2fx\n", p[1], p[2], best[1, k], best[2, k], best[1, k] / best[2, k]
        }
    }' "$TMP/sumo" "$TMP/torch"
