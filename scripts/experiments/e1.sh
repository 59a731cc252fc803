# shellcheck shell=bash
# E1, batch scaling: test accuracy against total batch, with its tables and plot. Sourced by
# scripts/experiment after its options and scripts/experiments/common.sh, whose settings
# ($quick, $seeds, $out, $csv, $md, ...) and helpers it uses.


e1() {
  local optimizers epochs limit batch=32 target=0.84
  # Worker counts per optimizer. Momentum SGD takes every count; Adam and LAMB every other,
  # with three seeds each, to keep the run near an hour on two cores.
  declare -A counts
  if [ $quick -eq 1 ]; then
    optimizers="sgd"; counts=([sgd]="1 4 16"); epochs=1; limit=(--train-limit 8000 --test-limit 2000)
  else
    optimizers="sgd adam lamb"; counts=([sgd]="1 2 4 8 16 32 64" [adam]="1 4 16 64" [lamb]="1 4 16 64")
    epochs=3; limit=()
  fi
  declare -A sweep=([sgd]="0.01 0.03 0.1" [adam]="0.0003 0.001 0.003" [lamb]="0.003 0.01 0.03")
  [ $quick -eq 1 ] && sweep=([sgd]="0.03 0.1")
  declare -A best_lr
  # 1. The single-worker rate of each optimizer: the best mean over the seeds of a small sweep
  #    (recorded in the CSV).
  for opt in $optimizers; do
    for lr in ${sweep[$opt]}; do
      runs "lr-sweep" --workers 1 --batch $batch --epochs $epochs --optimizer $opt --lr $lr --reduce avg "${limit[@]}" --target $target
    done
  done
  local c_label c_opt c_lr c_final
  c_label=$(col label); c_opt=$(col optimizer); c_lr=$(col peak_lr); c_final=$(col final_accuracy)
  for opt in $optimizers; do
    local best=-1 acc
    for lr in ${sweep[$opt]}; do
      acc=$(awk -F, -v label="$c_label" -v o="$c_opt" -v l="$c_lr" -v f="$c_final" -v opt="$opt" -v lr="$lr" \
        'NR > 1 && $label == "lr-sweep" && $o == opt && $l + 0 == lr + 0 { s += $f; n++ } END { if (n) printf "%.6f", s / n; else print -1 }' "$csv")
      if awk -v a="$acc" -v b="$best" 'BEGIN { exit !(a > b) }'; then best=$acc; best_lr[$opt]=$lr; fi
    done
    [ -n "${best_lr[$opt]:-}" ] || { echo "experiment e1: no sweep rows for $opt in $csv" >&2; exit 1; }
  done
  # 2. Every method at every worker count, each with its own scaling rule from that rate.
  for opt in $optimizers; do
    local lr=${best_lr[$opt]}
    for n in ${counts[$opt]}; do
      local base=(--workers $n --batch $batch --epochs $epochs --optimizer $opt --lr $lr --target $target "${limit[@]}")
      runs "avg x1" "${base[@]}" --reduce avg
      runs "avg linear+warmup" "${base[@]}" --reduce avg --lr-scaling linear --warmup-epochs 0.5
      runs "adasum x1" "${base[@]}" --reduce adasum
      runs "adasum-delta x1" "${base[@]}" --reduce adasum-delta
      [ $quick -eq 1 ] || runs "adasum-delta x2.5" "${base[@]}" --reduce adasum-delta --lr-scaling 2.5
      runs "acga" "${base[@]}" --reduce acga --acga-rescale
      [ $quick -eq 1 ] || runs "acga momentum 0.9" "${base[@]}" --reduce acga --acga-rescale --acga-beta 0.9
    done
  done
  seed_stats > "$out/e1-stats.tsv"
  epochs=$(csv_flag --epochs)
  local stats="$out/e1-stats.tsv" seeds_used
  seeds_used=$(seed_list)
  {
    echo "# E1: batch scaling on Fashion-MNIST (MLP 784-128-10, per-worker batch $batch, $epochs epoch(s), seeds $seeds_used)"
    echo
    provenance
    echo
    echo "Single-worker learning rates, the best mean of the sweep: $(for o in $optimizers; do printf '%s %s; ' "$o" "${best_lr[$o]}"; done)"
    echo "each method then applies its own rule (avg x1; avg linear scaling x N with warm-up; Adasum x1 and x2.5; ACGA x1 with its rescale)."
    echo "Worker counts (total batch = workers x $batch): $(for o in $optimizers; do printf '%s %s; ' "$o" "${counts[$o]}"; done)$( [ $quick -eq 1 ] || echo "momentum SGD takes every count, Adam and LAMB every other one, to keep the run near an hour on two cores.")"
    echo "Cells: mean ± sample standard deviation of the final test accuracy over the seeds."
    for opt in $optimizers; do
      local workers=${counts[$opt]}
      echo
      echo "## $opt: final test accuracy (%) by total batch"
      echo
      printf '| method |'; for n in $workers; do printf ' %d |' $((n * batch)); done; echo
      printf '|---|'; for n in $workers; do printf -- '---|'; done; echo
      awk -F'\t' -v opt="$opt" '$1 != "lr-sweep" && $2 == opt { print $1 }' "$stats" | awk '!seen[$0]++' | while read -r method; do
        printf '| %s |' "$method"
        for n in $workers; do
          local line
          line=$(awk -F'\t' -v opt="$opt" -v l="$method" -v n="$n" '$1 == l && $2 == opt && $3 == n' "$stats")
          [ -n "$line" ] || { printf ' |'; continue; }
          IFS=$'\t' read -r _ _ _ _ ns mean sd _ _ _ _ ndiv _ <<< "$line"
          printf ' %s%s |' "$(cell "$mean" "$sd" "$ns")" "$( [ "$ndiv" -gt 0 ] && echo " ($ndiv diverged)")"
        done
        echo
      done
      echo
      local largest=${workers##* }
      echo "Largest total batch at which every seed reached $target within the budget, and the epochs to it at total batch $((largest * batch)) (mean over the seeds that reached it):"
      echo
      echo "| method | largest batch reaching target | epochs to target at $((largest * batch)) |"
      echo "|---|---|---|"
      awk -F'\t' -v opt="$opt" -v big="$largest" '$1 != "lr-sweep" && $2 == opt {
          m = $1
          if (!(m in best)) { best[m] = "none"; at[m] = "-"; order[++k] = m }
          if ($10 == $5 && (best[m] == "none" || $4 + 0 > best[m] + 0)) best[m] = $4
          if ($3 == big) at[m] = ($10 == $5 ? $11 : ($10 > 0 ? sprintf("%s (%d of %d seeds)", $11, $10, $5) : "not reached"))
        } END { for (i = 1; i <= k; i++) printf "| %s | %s | %s |\n", order[i], best[order[i]], at[order[i]] }' "$stats"
    done
  } > "$md"
  for opt in $optimizers; do
    plot_e1 "$stats" "$opt" "$out/e1-$opt.png" "$batch" "$epochs" "$seeds_used"
  done
  rm -f "$stats"
  check_outputs "$csv" "$md" $(for o in $optimizers; do echo "$out/e1-$o.png"; done)
}

# One E1 plot: mean final accuracy against total batch, a line per method, bars one standard
# deviation over the seeds each way. The methods sit slightly apart on the x axis (a few
# percent of a batch step), so that their bars do not hide each other.
plot_e1() {
  local stats=$1 opt=$2 png=$3 batch=$4 epochs=$5 seeds_used=$6
  local name
  case $opt in sgd) name="momentum SGD" ;; adam) name=Adam ;; lamb) name=LAMB ;; *) name=$opt ;; esac
  local data="$png.tsv"
  awk -F'\t' -v opt="$opt" '$1 != "lr-sweep" && $2 == opt' "$stats" > "$data"
  local methods=() clauses=() i=0 nm
  while IFS= read -r m; do methods+=("$m"); done < <(cut -f1 "$data" | awk '!seen[$0]++')
  nm=${#methods[@]}
  for m in "${methods[@]}"; do
    local shift_factor
    shift_factor=$(awk -v i=$i -v n=$nm 'BEGIN { printf "%.4f", 2 ^ (0.12 * (i - (n - 1) / 2) / (n > 1 ? n - 1 : 1)) }')
    clauses+=("\"< awk -F'\\t' '\$1 == \\\"$m\\\"' $data\" using (\$4*$shift_factor):6:7 with yerrorlines linewidth 2 pointsize 1.2 title \"$m\"")
    i=$((i + 1))
  done
  local joined
  joined=$(printf '%s, ' "${clauses[@]}")
  gnuplot <<GP
set terminal pngcairo noenhanced size 1000,620 font ",12"
set output "$png"
set title "E1, $name: final test accuracy against total batch\nFashion-MNIST MLP, $batch samples per worker, $epochs epoch(s); mean and standard deviation over seeds $seeds_used"
set xlabel "total batch (workers x $batch)"
set ylabel "final test accuracy (%)"
set logscale x 2
set xtics ($(awk -F'\t' '{ print $4 }' "$data" | sort -n -u | awk '{ printf "%s\"%d\" %d", (NR > 1 ? ", " : ""), $1, $1 }'))
set xrange [*:*] noextend
set offsets graph 0.04, graph 0.04, graph 0.05, graph 0.05
set key bottom left box opaque
set grid
set datafile separator "\t"
# Seven colours a reader tells apart (gnuplot's own cycle has a pale yellow), each with its marker.
set linetype 1 linecolor rgb '#1f77b4' pointtype 5
set linetype 2 linecolor rgb '#ff7f0e' pointtype 7
set linetype 3 linecolor rgb '#2ca02c' pointtype 9
set linetype 4 linecolor rgb '#d62728' pointtype 11
set linetype 5 linecolor rgb '#9467bd' pointtype 13
set linetype 6 linecolor rgb '#8c564b' pointtype 4
set linetype 7 linecolor rgb '#17becf' pointtype 6
plot ${joined%, }
GP
  rm -f "$data"
}

# The claims docs/results.md reads from E1's tables and figure (check_claims, --kernels): at
# total batch 2048 Adasum (on gradients and on deltas) ahead of the plain average and of linear
# scaling with momentum SGD, and on deltas ahead of the average and of Adasum on gradients with
# LAMB; linear scaling level with Adasum on deltas at 512 and 1024 with momentum SGD, behind the
# plain average from 128 on with LAMB; Adasum on deltas ahead of linear scaling and the average
# at 512 with Adam, and at 2048 its x2.5 level with linear scaling; ACGA behind the average at
# the largest batches, its momentum level with it everywhere, and with one worker ACGA equal to
# the average bit for bit.
e1_claims() {
  local c_label c_opt c_workers c_hash c_cmd
  c_label=$(col label); c_opt=$(col optimizer); c_workers=$(col workers); c_hash=$(col fnv1a); c_cmd=$(col command)
  seed_stats | awk -F'\t' "$claims_awk"'
    { k = $2 " " $4 " " $1; m[k] = $6; s[k] = $7 }
    function has(a, b) { return (a in m) && (b in m) }
    function say(ok, a, b, text) { if (has(a, b)) claim(ok, text, vs(a, b)) }
    END {
      say(ahead("sgd 2048 adasum-delta x1", "sgd 2048 avg x1"), "sgd 2048 adasum-delta x1", "sgd 2048 avg x1", "SGD at 2048: Adasum on deltas ahead of the average beyond the spread")
      say(ahead("sgd 2048 adasum x1", "sgd 2048 avg x1"), "sgd 2048 adasum x1", "sgd 2048 avg x1", "SGD at 2048: Adasum on gradients ahead of the average beyond the spread")
      say(ahead("sgd 2048 adasum-delta x1", "sgd 2048 avg linear+warmup"), "sgd 2048 adasum-delta x1", "sgd 2048 avg linear+warmup", "SGD at 2048: Adasum on deltas ahead of linear scaling beyond the spread")
      say(ahead("sgd 2048 adasum x1", "sgd 2048 avg linear+warmup"), "sgd 2048 adasum x1", "sgd 2048 avg linear+warmup", "SGD at 2048: Adasum on gradients ahead of linear scaling beyond the spread")
      for (b = 512; b <= 1024; b *= 2)
        say(level("sgd " b " avg linear+warmup", "sgd " b " adasum-delta x1"), "sgd " b " avg linear+warmup", "sgd " b " adasum-delta x1", "SGD at " b ": linear scaling level with Adasum on deltas within the spread")
      say(ahead("lamb 2048 adasum-delta x1", "lamb 2048 avg x1"), "lamb 2048 adasum-delta x1", "lamb 2048 avg x1", "LAMB at 2048: Adasum on deltas ahead of the average beyond the spread")
      say(ahead("lamb 2048 adasum-delta x1", "lamb 2048 adasum x1"), "lamb 2048 adasum-delta x1", "lamb 2048 adasum x1", "LAMB at 2048: Adasum on deltas ahead of Adasum on gradients beyond the spread")
      for (b = 128; b <= 2048; b *= 4)
        say(ahead("lamb " b " avg x1", "lamb " b " avg linear+warmup"), "lamb " b " avg linear+warmup", "lamb " b " avg x1", "LAMB at " b ": linear scaling behind the average beyond the spread")
      say(ahead("adam 512 adasum-delta x1", "adam 512 avg linear+warmup"), "adam 512 adasum-delta x1", "adam 512 avg linear+warmup", "Adam at 512: Adasum on deltas ahead of linear scaling beyond the spread")
      say(ahead("adam 512 adasum-delta x1", "adam 512 avg x1"), "adam 512 adasum-delta x1", "adam 512 avg x1", "Adam at 512: Adasum on deltas ahead of the average beyond the spread")
      say(level("adam 2048 adasum-delta x2.5", "adam 2048 avg linear+warmup"), "adam 2048 adasum-delta x2.5", "adam 2048 avg linear+warmup", "Adam at 2048: Adasum on deltas x2.5 level with linear scaling within the spread")
      say(ahead("sgd 1024 avg x1", "sgd 1024 acga"), "sgd 1024 acga", "sgd 1024 avg x1", "SGD at 1024: ACGA behind the average beyond the spread")
      say(ahead("sgd 2048 avg x1", "sgd 2048 acga"), "sgd 2048 acga", "sgd 2048 avg x1", "SGD at 2048: ACGA behind the average beyond the spread")
      say(ahead("adam 2048 avg x1", "adam 2048 acga"), "adam 2048 acga", "adam 2048 avg x1", "Adam at 2048: ACGA behind the average beyond the spread")
      ok = 1; n = 0; tr = 0; tf = ""
      for (k in m) if (k ~ / acga$/ && ((k " momentum 0.9") in m)) { n++; track(k " momentum 0.9", k); if (!level(k " momentum 0.9", k)) ok = 0 }
      if (n) claim(ok, "ACGA with momentum 0.9 level with ACGA within the spread, every optimizer and batch", sprintf("%d pairs; %s", n, tf))
    }'
  awk -F, -v label="$c_label" -v opt="$c_opt" -v workers="$c_workers" -v hash="$c_hash" -v cmd="$c_cmd" '
    NR > 1 && $workers == 1 { match($cmd, /--seed [0-9]+/); k = $opt " " substr($cmd, RSTART, RLENGTH)
      if ($label == "acga") a[k] = $hash; else if ($label == "avg x1") v[k] = $hash }
    END { for (k in a) { n++; if (a[k] == v[k]) same++ }
          if (n) printf "%d\tone worker: ACGA equals the average bit for bit, every optimizer and seed\t%d of %d runs the same parameter hash\n", same == n, same, n }' "$csv"
}
