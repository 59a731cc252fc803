#!/usr/bin/env bash
# Issue 14's one-machine figures as medians of several runs: for each configuration (threads
# P = 2 and 4; MPI np 2 and 4 with private buffers, with --shared-buffers and with
# --shared-outputs), `sumo bench` runs REPS times over 4 KiB to 64 MiB fp32; each run's
# Adasum / sum and ACGA / average ratios are taken within that run, and the table prints
# their medians (the shared machine's slow phases move whole runs, not ratios).
#
#   scripts/bench-ratios.sh [REPS (3)]      needs ./build/sumo (make) and, for MPI, mpirun
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-3}
sumo=./build/sumo
[ -x "$sumo" ] || { echo "bench-ratios: build first (make)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
common=(bench --min 4K --max 64M --step 16 --ops sum,avg,adasum,acga --skip-mem)
configs=("threads")
if command -v mpirun > /dev/null && ldd "$sumo" | grep -q libmpi; then
  configs+=("mpi 2" "mpi 4" "mpi 2 --shared-buffers" "mpi 4 --shared-buffers"
            "mpi 2 --shared-outputs" "mpi 4 --shared-outputs")
fi
for r in $(seq 1 "$reps"); do
  for c in "${configs[@]}"; do
    set -- $c
    csv="$work/run$r-$(echo "$c" | tr ' ' '_').csv"
    if [ "$1" = threads ]; then
      "$sumo" "${common[@]}" --transport threads --ranks 2,4 --csv "$csv" > /dev/null
      # The 16x steps miss 64 MiB from 4 KiB: measure it on its own.
      "$sumo" "${common[@]}" --transport threads --ranks 2,4 --min 64M --csv "$csv.64" > /dev/null
    else
      mpirun -np "$2" --oversubscribe --mca btl self,vader "$sumo" "${common[@]}" --transport mpi ${3:-} --csv "$csv" > /dev/null
      mpirun -np "$2" --oversubscribe --mca btl self,vader "$sumo" "${common[@]}" --transport mpi ${3:-} --min 64M --csv "$csv.64" > /dev/null
    fi
    tail -n +2 "$csv.64" >> "$csv"
    rm -f "$csv.64"
  done
done
# Per run, configuration (transport name and ranks) and size: the two ratios; then medians.
awk -F, '
  FNR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; run = FILENAME; next }
  $col["section"] != "allreduce" || $col["time_us"] == "nan" { next }
  { key = $col["transport"] " P=" $col["ranks"] SUBSEP $col["bytes"]; t[run, key, $col["op"]] = $col["time_us"]; keys[key] = 1; runs[run] = 1 }
  END {
    for (k in keys) {
      split(k, parts, SUBSEP)
      na = 0; nc = 0
      for (r in runs) {
        if ((r, k, "adasum") in t && t[r, k, "sum"] > 0) a[++na] = t[r, k, "adasum"] / t[r, k, "sum"]
        if ((r, k, "acga") in t && t[r, k, "avg"] > 0) g[++nc] = t[r, k, "acga"] / t[r, k, "avg"]
      }
      printf "%s\t%s\t%s\t%s\t%d\n", parts[1], parts[2], median(a, na), median(g, nc), na
    }
  }
  function median(v, n,   i, j, x) {
    if (n == 0) return "-"
    for (i = 2; i <= n; i++) { x = v[i]; for (j = i - 1; j >= 1 && v[j] > x; j--) v[j + 1] = v[j]; v[j + 1] = x }
    return sprintf("%.2f", n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2)
  }' "$work"/run*.csv | sort -t$'\t' -k2,2n -k1,1 |
  awk -F'\t' 'BEGIN { printf "%-26s %12s %14s %14s %5s\n", "configuration", "bytes", "adasum/sum", "acga/avg", "runs" }
              { printf "%-26s %12s %14s %14s %5s\n", $1, $2, $3, $4, $5 }'
