# shellcheck shell=bash
# E2, SlowMo: accuracy against communication rounds, with its tables and plot. Sourced by
# scripts/experiment after its options and scripts/experiments/common.sh, whose settings
# ($quick, $seeds, $out, $csv, $md, ...) and helpers it uses.


e2() {
  local workers epochs limit tau=12
  if [ $quick -eq 1 ]; then workers="8"; epochs=1; limit=(--train-limit 8000 --test-limit 2000)
  else workers="8 16"; epochs=5; limit=(); fi
  local lr=0.03
  for n in $workers; do
    local base=(--workers $n --batch 32 --epochs $epochs --optimizer sgd --lr $lr --target 0.84 "${limit[@]}")
    runs "AR-SGD" "${base[@]}" --reduce avg
    runs "Local SGD tau=$tau" "${base[@]}" --reduce localsgd --tau $tau
    runs "SlowMo tau=$tau beta=0.5" "${base[@]}" --reduce slowmo --tau $tau --slow-beta 0.5
    runs "SlowMo tau=$tau beta=0.7" "${base[@]}" --reduce slowmo --tau $tau --slow-beta 0.7
    runs "BMUF tau=$tau beta=0.5" "${base[@]}" --reduce bmuf --tau $tau --slow-beta 0.5
    [ $quick -eq 1 ] || runs "SlowMo tau=$tau beta=0.5 inner=3" "${base[@]}" --reduce slowmo --tau $tau --slow-beta 0.5 --inner-period 3
  done
  local stats="$out/e2-stats.tsv" seeds_used c_label c_method c_workers c_hash c_cmd
  seed_stats > "$stats"
  epochs=$(csv_flag --epochs)
  c_label=$(col label); c_method=$(col method); c_workers=$(col workers); c_hash=$(col fnv1a); c_cmd=$(col command)
  seeds_used=$(seed_list)
  {
    echo "# E2: communication-efficient training (SlowMo) on Fashion-MNIST (MLP, SGD momentum 0.9, lr $lr, batch 32 per worker, $epochs epoch(s), seeds $seeds_used)"
    echo
    provenance
    echo "Accuracies: mean ± sample standard deviation over the seeds; rounds, MiB and steps are the same for every seed."
    echo
    echo "| method | workers | final acc (%) | best acc (%) | communication rounds | MiB sent per rank | steps |"
    echo "|---|---|---|---|---|---|---|"
    while IFS=$'\t' read -r label _ w _ ns mean sd _ _ _ _ _ bmean rounds bytes steps; do
      printf '| %s | %d | %s | %.2f | %d | %.1f | %d |\n' "$label" "$w" "$(cell "$mean" "$sd" "$ns")" "$bmean" "$rounds" \
        "$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')" "$steps"
    done < "$stats"
    echo
    echo "BMUF is SlowMo with alpha 1 over plain local steps, so its rows must equal SlowMo's at the"
    echo "same beta; the final parameters' hashes (column fnv1a of the CSV) show whether they do, seed by seed:"
    echo
    awk -F, -v method="$c_method" -v label="$c_label" -v workers="$c_workers" -v hash="$c_hash" -v cmd="$c_cmd" '
      NR > 1 { match($cmd, /--seed [0-9]+/); sd = substr($cmd, RSTART + 7, RLENGTH - 7); k = $workers " workers, seed " sd }
      NR > 1 && $method == "bmuf" { b[k] = $hash; keys[k] = $workers * 1000 + sd }
      NR > 1 && $label ~ /^SlowMo/ && $label ~ /beta=0.5$/ { s[k] = $hash }
      END { for (k in b) printf "%d\t- %s: BMUF %s, SlowMo %s: %s\n", keys[k], k, b[k], s[k], b[k] == s[k] ? "identical" : "DIFFERENT" }' "$csv" \
      | sort -n | cut -f2
  } > "$md"
  plot_e2 "$stats" "$out/e2.png" "$epochs" "$seeds_used"
  rm -f "$stats"
  check_outputs "$csv" "$md" "$out/e2.png"
}

# E2's plot: a row per method, its communication rounds in its label, its final accuracy as a
# point with a bar of one standard deviation over the seeds each way, one colour per worker
# count (set a little apart vertically). Methods that communicate equally often would sit on
# one spot of an accuracy-against-rounds plot and hide each other; a row each cannot.
plot_e2() {
  local stats=$1 png=$2 epochs=$3 seeds_used=$4
  local data="$png.tsv" ws nw
  ws=$(cut -f3 "$stats" | awk '!seen[$0]++')
  nw=$(echo $ws | wc -w)
  # Rows bottom-up in the table's order (the first method on top); per row and worker count
  # the y position, the accuracy and its spread; the row's label with each count's rounds.
  awk -F'\t' -v nw="$nw" -v ws="$ws" '
    BEGIN { split(ws, w, " "); for (i = 1; i <= nw; i++) wi[w[i]] = i }
    { if (!($1 in row)) { order[++n] = $1; row[$1] = n }
      acc[$1, $3] = $6; sd[$1, $3] = $7; rounds[$1] = rounds[$1] (rounds[$1] == "" ? "" : " / ") $14 }
    END {
      for (k = 1; k <= n; k++) {
        m = order[k]; y = n - k
        for (i = 1; i <= nw; i++) if ((m, w[i]) in acc)
          printf "%s\t%.3f\t%s\t%s\n", w[i], y + 0.15 * ((nw - 1) / 2 - (i - 1)), acc[m, w[i]], sd[m, w[i]]
        printf "label\t%d\t%s (%s rounds)\n", y, m, rounds[m]
      }
    }' "$stats" > "$data"
  local clauses=() i=0 colours=('#1f77b4' '#ff7f0e' '#2ca02c') points=(7 5 9)
  for w in $ws; do
    clauses+=("\"< awk -F'\\t' '\$1 == \\\"$w\\\"' $data\" using 3:2:4 with xerrorbars pointtype ${points[$i]} pointsize 1.6 linewidth 2 linecolor rgb '${colours[$i]}' title \"$w workers\"")
    i=$((i + 1))
  done
  local ytics
  ytics=$(awk -F'\t' '$1 == "label" { printf "%s\"%s\" %s", (n++ ? ", " : ""), $3, $2 }' "$data")
  local joined
  joined=$(printf '%s, ' "${clauses[@]}")
  gnuplot <<GP
set terminal pngcairo noenhanced size 1100,$((200 + 60 * $(grep -c '^label' "$data"))) font ",12"
set output "$png"
set tmargin 6
set label 1 "E2: final test accuracy of each method, and how often it communicates\nFashion-MNIST MLP, momentum SGD at 0.03, 32 samples per worker, $epochs epoch(s); rounds at $(echo $ws | sed 's/ / \/ /g') workers\nmean and standard deviation over seeds $seeds_used" at screen 0.5, 0.97 center front
set datafile separator "\t"
set xlabel "final test accuracy (%)"
set ytics ($ytics)
set yrange [-0.6:$(grep -c '^label' "$data") - 0.4]
set grid xtics
set offsets graph 0.05, graph 0.05, 0, 0
set key bottom left box opaque
plot ${joined%, }
GP
  rm -f "$data"
}

# The claims docs/results.md reads from E2's figure (check_claims, --kernels), per worker
# count: SlowMo at beta 0.5 ahead of AR-SGD beyond the spread; Local SGD level with AR-SGD;
# beta 0.7 not ahead of 0.5; inner averaging every 3 steps not ahead of plain SlowMo; SlowMo
# 12 times fewer rounds; and BMUF equal to SlowMo at beta 0.5 bit for bit, every seed.
e2_claims() {
  local c_method c_label c_workers c_hash c_cmd
  c_method=$(col method); c_label=$(col label); c_workers=$(col workers); c_hash=$(col fnv1a); c_cmd=$(col command)
  seed_stats | awk -F'\t' "$claims_awk"'
    { k = $1 SUBSEP $3; m[k] = $6; s[k] = $7; r[k] = $14; if (!($3 in seen)) { seen[$3] = 1; ws[++nw] = $3 }
      if ($1 == "AR-SGD") ar[$3] = k
      else if ($1 ~ /^Local SGD/) ls[$3] = k
      else if ($1 ~ /^SlowMo .*beta=0.5$/) s5[$3] = k
      else if ($1 ~ /^SlowMo .*beta=0.7$/) s7[$3] = k
      else if ($1 ~ /^SlowMo .*inner=/) in3[$3] = k }
    END {
      for (i = 1; i <= nw; i++) {
        w = ws[i]
        if ((w in s5) && (w in ar)) {
          claim(ahead(s5[w], ar[w]), "SlowMo beta 0.5 ahead of AR-SGD beyond the spread, " w " workers", vs(s5[w], ar[w]))
          claim(r[ar[w]] >= 12 * r[s5[w]], "SlowMo communicates 12 times less than AR-SGD, " w " workers", sprintf("%d rounds against %d", r[s5[w]], r[ar[w]]))
        }
        if ((w in ls) && (w in ar)) claim(level(ls[w], ar[w]), "Local SGD level with AR-SGD within the spread, " w " workers", vs(ls[w], ar[w]))
        if ((w in s7) && (w in s5)) claim(!ahead(s7[w], s5[w]), "beta 0.7 not ahead of beta 0.5 beyond the spread, " w " workers", vs(s7[w], s5[w]))
        if ((w in in3) && (w in s5)) claim(!ahead(in3[w], s5[w]), "inner averaging every 3 steps not ahead of SlowMo beta 0.5 beyond the spread, " w " workers", vs(in3[w], s5[w]))
      }
    }'
  awk -F, -v method="$c_method" -v label="$c_label" -v workers="$c_workers" -v hash="$c_hash" -v cmd="$c_cmd" '
    NR > 1 { match($cmd, /--seed [0-9]+/); k = $workers " " substr($cmd, RSTART, RLENGTH) }
    NR > 1 && $method == "bmuf" { b[k] = $hash }
    NR > 1 && $label ~ /^SlowMo/ && $label ~ /beta=0.5$/ { s[k] = $hash }
    END { for (k in b) { n++; if (b[k] == s[k]) same++ }
          if (n) printf "%d\tBMUF equals SlowMo beta 0.5 bit for bit, every worker count and seed\t%d of %d runs the same parameter hash\n", same == n, same, n }' "$csv"
}
