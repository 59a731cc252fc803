# shellcheck shell=bash
# E4, the DiLoCo family: accuracy, bytes, peak and wall time, with its tables and plot. Sourced
# by scripts/experiment after its options and scripts/experiments/common.sh, whose settings
# ($quick, $seeds, $out, $csv, $md, ...) and helpers it uses.


# E4: the DiLoCo family against DDP on a CNN, 8 workers. Accuracy over the seeds; bytes per
# inner step and peak bytes in flight as sumo train counts them; the wall time on a 1 Gbit/s
# link, derived (e4_cost says how) from a measured step time and a shaped-link measurement,
# because this 2-core machine cannot give 8 ranks a core each.
e4() {
  local epochs limit H=20 lr=0.003 ds=(1 5) fs=(2 4) qs=(none bf16 e3m0)
  if [ $quick -eq 1 ]; then
    # 20 steps: H 4 keeps five outer rounds; F 4 would need delay <= 1.
    epochs=1; limit=(--train-limit 5120 --test-limit 1000); H=4; ds=(1); fs=(2); qs=(e3m0)
  else
    # 220 steps an epoch (56,320 of the 60,000 images over 8 x 32), a multiple of H: every
    # fragment's rounds fit whole. Two epochs keep the 54 runs near 20 minutes on two cores.
    epochs=2; limit=(--train-limit 56320)
  fi
  local base=(--model cnn --workers 8 --batch 32 --epochs $epochs --optimizer adamw --lr $lr --target 0.85 "${limit[@]}")
  runs "DDP (avg)" "${base[@]}" --reduce avg
  runs "SlowMo H=$H" "${base[@]}" --reduce slowmo --tau $H
  local q
  for q in "${qs[@]}"; do
    runs "DiLoCo H=$H $(e4_format $q)" "${base[@]}" --reduce diloco --sync-every $H --delay 0 --quantize $q
  done
  runs "DiLoCo H=$H Adasum" "${base[@]}" --reduce diloco --sync-every $H --delay 0 --quantize none --outer-combine adasum
  local f d
  for f in "${fs[@]}"; do
    for d in "${ds[@]}"; do
      for q in "${qs[@]}"; do
        runs "Streaming F=$f delay $d $(e4_format $q)" "${base[@]}" --reduce streaming-diloco --sync-every $H \
          --fragments $f --fragment-ranges --delay $d --quantize $q
      done
    done
  done
  local cost="$out/e4-cost.csv"
  if [ -n "$kernels" ]; then
    # Under other kernels what is checked is accuracy and bytes (e4_claims); the wall time
    # stays the record's derivation, from its step time and link measurement.
    local from
    from=$(dirname "$record")
    if [ $replot -eq 0 ] && [ ! -s "$cost" ]; then
      cp "$from/e4-cost.csv" "$cost"
      [ ! -s "$from/e4-net.csv" ] || cp "$from/e4-net.csv" "$out/e4-net.csv"
    fi
  elif [ $replot -eq 0 ] && { [ $resume -eq 0 ] || [ ! -s "$cost" ]; }; then e4_cost "$cost"; fi
  [ -s "$cost" ] || { echo "experiment e4: no $cost (run without --replot once)" >&2; exit 1; }
  local stats="$out/e4-stats.tsv" seeds_used
  e4_stats "$cost" > "$stats"
  epochs=$(csv_flag --epochs)
  H=$(awk -F, -v c="$(col command)" 'NR > 1 && match($c, /--sync-every [0-9]+/) { print substr($c, RSTART + 13, RLENGTH - 13); exit }' "$csv")
  seeds_used=$(seed_list)
  local items steps tc bw alpha link
  items=$(csv_flag --train-limit); steps=$(awk -F'\t' 'NR == 1 { print $7 }' "$stats")
  tc=$(e4_cost_value "$cost" step_s); bw=$(e4_cost_value "$cost" link_bytes_per_s); alpha=$(e4_cost_value "$cost" latency_s)
  link=$(e4_cost_value "$cost" link_source)
  {
    echo "# E4: the DiLoCo family on Fashion-MNIST (CNN, 8 workers x 32, AdamW at $lr, H = $H, $epochs epoch(s) of the first $items training images, $steps inner steps; seeds $seeds_used)"
    echo
    provenance
    [ -z "$kernels" ] || echo "The wall times below are derived from the record's measurements (its e4-cost.csv), not from runs under these kernels."
    echo "Outer steps: DiLoCo's Nesterov, lr 0.7, momentum 0.9 (the paper's, untuned here); SlowMo heavy ball alpha 1, beta 0.5;"
    echo "Streaming: F equal ranges of the flat parameter vector (--fragment-ranges: a range may cut a tensor), merge alpha 0.5; formats: fp32, bf16, e3m0 (4 bits, a scale per 128)."
    echo "Accuracy: mean ± sample standard deviation of the final test accuracy ($(e4_test_items) test images) over the seeds; bytes and peak are the same for every seed."
    echo
    echo "| method | test acc (%) | vs DDP (points) | bytes / inner step | DDP's / this | peak bytes in flight | of DiLoCo's, same format | wall at 1 Gbit/s (s) | of which exposed communication (s) |"
    echo "|---|---|---|---|---|---|---|---|---|"
    awk -F'\t' '{ printf "| %s | %s | %+.2f | %.1f | %.1f | %d | %s | %.2f | %.2f |\n", $1, ($3 > 1 ? sprintf("%.2f ± %.2f", $4, $5) : sprintf("%.2f", $4)),
                  $13, $9, $14, $10, $15, $11 + $12, $12 }' "$stats"
    echo
    echo "Columns: bytes / inner step is the payload each rank put into exchanges over the run divided by its inner steps (sumo train's"
    echo "bytes_per_step: an fp32 allreduce counts 4 bytes an element, a compressed one its codes and scales); peak bytes in flight is the"
    echo "largest payload one step started (peak_bytes_in_flight; at most one exchange is on the wire at a time). DDP's / this: how many"
    echo "times fewer bytes than DDP. Of DiLoCo's: the peak against DiLoCo H=$H's in the same format (a Streaming row's goal is 1/F)."
    echo
    echo "## Wall time at 1 Gbit/s, and how it is derived"
    echo
    echo "This machine has 2 cores: 8 ranks over shaped links would measure its CPUs, not the link. So the wall time of a worker with a"
    echo "core of its own and a 1 Gbit/s link is derived from two measurements of this run:"
    echo
    echo "- t_step = $(awk -v t="$tc" 'BEGIN { printf "%.2f", t * 1000 }') ms, one inner step of one worker alone (forward, backward and AdamW; the median over $(e4_cost_value "$cost" step_repeats) runs of \`$(e4_cost_value "$cost" step_command)\`, (compute_s + aggregation_s) / steps);"
    echo "- the link: $link."
    echo
    echo "An exchange of S payload bytes among P = 8 ranks then takes t_x(S) = 2 (P - 1) alpha + 2 (P - 1) / P x S / B (each rank sends and"
    echo "receives (P - 1) / P of S twice: the reduce-scatter and the all-gather of both the fp32 and the compressed allreduce), with"
    echo "alpha = $(awk -v a="$alpha" 'BEGIN { printf "%.1f", a * 1e6 }') us and B = $(awk -v b="$bw" 'BEGIN { printf "%.1f", b / 1e6 }') MB/s; Adasum adds log2 P small allreduces of dot products"
    echo "(2 log2 P latencies each). Wall = steps x t_step + the exposed part of every exchange: all of it for a blocking exchange (DDP,"
    echo "SlowMo, DiLoCo with delay 0), max(0, t_x - delay x t_step) for an overlapped one, every fragment charged as the largest (the peak):"
    echo "an upper bound. The outer step's own arithmetic (37,610 elements a round) is left out."
    echo "Evaluation is not counted."
    echo
    echo "## The issue's goals"
    echo
    e4_goals "$stats" "$H"
  } > "$md"
  plot_e4 "$stats" "$out/e4.png" "$epochs" "$seeds_used" "$H" "$lr" "$items"
  rm -f "$stats"
  check_outputs "$csv" "$md" "$out/e4.png"
}

e4_test_items() { local n; n=$(csv_flag --test-limit); echo "${n:-10000}"; }

e4_format() { case $1 in none) echo fp32 ;; e3m0) echo "e3m0 (4-bit)" ;; *) echo "$1" ;; esac; }

e4_cost_value() { awk -F, -v k="$2" '$1 == k { sub(/^[^,]*,/, ""); print; exit }' "$1"; }

# The two measurements the wall time is derived from, as quantity,value lines:
#   step_s: one inner step of one worker alone, the median over repeats (5; 3 with --quick);
#   link_bytes_per_s and latency_s: t = 2 latency + S / B fitted (least squares over the median
#   times) to sumo's allreduce of S bytes between 2 ranks in network namespaces whose links
#   bench-net.sh shapes to 1 Gbit/s (2 ranks: one per core, so the link, not the CPUs, is what
#   is timed; P = 2 sends S per rank in 2 messages). Without root or tc, the nominal link:
#   125 MB/s and no latency, said in link_source.
e4_cost() {
  local cost=$1 dir reps=5 n=6400
  [ $quick -eq 1 ] && reps=3 n=1280
  dir=$(mktemp -d)
  local cmd=("$sumo" train --model cnn --workers 1 --batch 32 --epochs 1 --optimizer adamw --lr 0.003 --train-limit $n --test-limit 100 --no-progress)
  for ((i = 0; i < reps; i++)); do
    "${cmd[@]}" --summary "$dir/step.csv" > /dev/null 2>&1 || { echo "experiment e4: failed: ${cmd[*]}" >&2; exit 1; }
  done
  local step
  step=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
    { print ($c["compute_s"] + $c["aggregation_s"]) / $c["steps"] }' "$dir/step.csv" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
  local max=4M iters=20
  [ $quick -eq 1 ] && max=256K iters=5
  scripts/bench-net.sh --np 2 --rate 1gbit --mtu 9000 --burst 32kb --out "$dir/net" -- --ops sum --min 16K --max $max --iters $iters --warmup 3 \
    > "$dir/net.out" 2>&1 || true
  local fit="" source
  if [ -s "$dir/net/net-switch-np2.csv" ]; then
    # Two points, not a least-squares line: mid sizes on the shaped link stall now and then
    # (tbf against TCP's window), and a line through them once gave a latency of 1.1 ms that
    # the smallest size, 16 KiB in 0.1 ms, contradicts. The fastest of the iterations, not
    # the median: on a shared machine the CPUs only ever add to what the link takes.
    fit=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
      $c["section"] == "allreduce" && $c["op"] == "sum" && $c["min_us"] != "nan" { x = $c["bytes"] + 0; y = $c["min_us"] / 1e6; n++
        if (!lo || x < lo) { lo = x; tlo = y }
        if (x > hi) { hi = x; thi = y } }
      END { if (n < 2 || thi <= 0) exit; b = hi / thi; a = (tlo - lo / b) / 2
            printf "%.6e %.6e %d %d", b, (a > 0 ? a : 0), lo, hi }' "$dir/net/net-switch-np2.csv")
  fi
  {
    echo "quantity,value"
    echo "step_s,$step"
    echo "step_repeats,$reps"
    echo "step_command,sumo train --model cnn --workers 1 --batch 32 --optimizer adamw --lr 0.003 --train-limit $n"
    if [ -n "$fit" ]; then
      set -- $fit
      echo "link_bytes_per_s,$1"
      echo "latency_s,$2"
      echo "link_source,measured: sumo bench --transport mpi --ops sum over 2 ranks in network namespaces (scripts/bench-net.sh --np 2 --rate 1gbit --mtu 9000 --burst 32kb -- --min 16K --max $max --iters $iters); the fastest of each size's iterations, t = 2 alpha + S / B; B from the largest size ($4 bytes) and alpha from what the smallest ($3 bytes) takes beyond S / B (0 if nothing)"
    else
      echo "link_bytes_per_s,125000000"
      echo "latency_s,0"
      echo "link_source,nominal (1 Gbit/s = 125 MB/s and no latency): bench-net.sh did not run here ($(grep -m1 'skipped' "$dir/net.out" | sed 's/,/;/g' || echo 'no CSV'))"
    fi
  } > "$cost"
  # The shaped measurement itself, for the reader; an earlier run's must not pass for this one's.
  rm -f "$out/e4-net.csv"
  [ -s "$dir/net/net-switch-np2.csv" ] && cp "$dir/net/net-switch-np2.csv" "$out/e4-net.csv"
  rm -rf "$dir"
}

# Per method over its seeds, tab-separated, in the CSV's order: label, method, seeds, mean and
# sd of the accuracy (%), min, steps, rounds, bytes/step, peak, compute s, exposed comm s,
# points against DDP, DDP's bytes/step over this one, peak over DiLoCo's in the same format
# (or -), the format, F and delay.
e4_stats() {
  local cost=$1
  local tc bw alpha
  tc=$(e4_cost_value "$cost" step_s); bw=$(e4_cost_value "$cost" link_bytes_per_s); alpha=$(e4_cost_value "$cost" latency_s)
  awk -F, -v label="$(col label)" -v method="$(col method)" -v final="$(col final_accuracy)" -v steps="$(col steps)" \
      -v rounds="$(col rounds)" -v bps="$(col bytes_per_step)" -v peak="$(col peak_bytes_in_flight)" -v bytes="$(col bytes)" \
      -v cmd="$(col command)" -v workers="$(col workers)" -v tc="$tc" -v bw="$bw" -v alpha="$alpha" '
    function flag(c, f, dflt,   n, w, i) { gsub(/"/, "", c); n = split(c, w, " "); for (i = 1; i < n; i++) if (w[i] == f) return w[i + 1]; return dflt }
    NR > 1 {
      k = $label
      if (!(k in n)) { order[++m] = k; meth[k] = $method; st[k] = $steps; r[k] = $rounds; b[k] = $bytes; bp[k] = $bps; pk[k] = $peak
                       q[k] = flag($cmd, "--quantize", "none"); F[k] = flag($cmd, "--fragments", 1); d[k] = flag($cmd, "--delay", 0)
                       ad[k] = flag($cmd, "--outer-combine", "average") == "adasum"; P = $workers
                       lo[k] = 100 * $final }
      a = 100 * $final; n[k]++; s[k] += a; ss[k] += a * a; if (a < lo[k]) lo[k] = a
    }
    function tx(S, adasum,   t) {
      t = 2 * (P - 1) * alpha + 2 * (P - 1) / P * S / bw
      if (adasum) t += log(P) / log(2) * 2 * log(P) / log(2) * alpha
      return t
    }
    END {
      for (i = 1; i <= m; i++) { k = order[i]; mean[k] = s[k] / n[k]
        if (meth[k] == "avg") ddp = k
        if (meth[k] == "diloco" && !ad[k]) dil[q[k]] = k }
      for (i = 1; i <= m; i++) {
        k = order[i]; var = n[k] > 1 ? (ss[k] - n[k] * mean[k] * mean[k]) / (n[k] - 1) : 0
        compute = st[k] * tc
        if (d[k] + 0 == 0)
          comm = r[k] * (tx(0, ad[k])) + 2 * (P - 1) / P * b[k] / bw
        else {
          late = tx(pk[k], ad[k]) - d[k] * tc
          comm = late > 0 ? r[k] * late : 0
        }
        vs = ddp != "" ? mean[k] - mean[ddp] : 0
        fewer = bp[k] > 0 && ddp != "" ? bp[ddp] / bp[k] : 0
        rel = meth[k] ~ /diloco/ && (q[k] in dil) && pk[dil[q[k]]] > 0 ? sprintf("%.3f", pk[k] / pk[dil[q[k]]]) : "-"
        printf "%s\t%s\t%d\t%.4f\t%.4f\t%.4f\t%d\t%d\t%.1f\t%d\t%.3f\t%.3f\t%.4f\t%.2f\t%s\t%s\t%s\t%s\n", k, meth[k], n[k], mean[k],
          (var > 0 ? sqrt(var) : 0), lo[k], st[k], r[k], bp[k], pk[k], compute, comm, vs, fewer, rel, q[k], F[k], d[k]
      }
    }' "$csv"
}

# The goals of issue 25, each against the rows it concerns, met or not as measured.
e4_goals() {
  local stats=$1 H=$2
  awk -F'\t' -v H="$H" '
    { k = $1; lab[NR] = k; meth[k] = $2; ns[k] = $3; mean[k] = $4; sd[k] = $5; fewer[k] = $14; rel[k] = $15; q[k] = $16; F[k] = $17
      if ($2 == "avg") ddp = k }
    END {
      printf "1. **Within 0.5 points of DDP (%.2f ± %.2f %%) at H = %d with 4-bit outer gradients.** ", mean[ddp], sd[ddp], H
      met = 0; all = 0; list = ""
      for (i = 1; i <= NR; i++) { k = lab[i]; if (q[k] != "e3m0") continue; all++; d = mean[k] - mean[ddp]
        if (d >= -0.5) met++
        list = list sprintf("%s%s %+.2f (its spread %.2f)", (all > 1 ? "; " : ""), k, d, sd[k]) }
      printf "Met by %d of the %d e3m0 rows, by the means: %s. DDP'\''s own spread over the seeds is %.2f points, so a miss or a pass by less than that is not a claim either way.\n", met, all, list, sd[ddp]
      printf "2. **1/(H x 8) = 1/%d of DDP'\''s bytes.** ", H * 8
      list = ""; all = 0; met = 0
      for (i = 1; i <= NR; i++) { k = lab[i]; if (q[k] != "e3m0") continue; all++; if (fewer[k] >= H * 8) met++
        list = list sprintf("%s%s 1/%.1f", (all > 1 ? "; " : ""), k, fewer[k]) }
      printf "%s (%d of %d e3m0 rows); per inner step they send %s of DDP'\''s bytes. 4 bits against 32 is 8 only without the scales: e3m0 in blocks of 128 sends 0.5 + 4/128 bytes an element, 1/%.2f of fp32'\''s 4, so 1/(%.2f H) is what this format can reach.\n", \
        (met == all ? "Met" : "Not met"), met, all, list, 4 / (0.5 + 4 / 128), 4 / (0.5 + 4 / 128)
      printf "3. **Peak bandwidth 1/F of DiLoCo'\''s.** "
      list = ""; all = 0; met = 0
      for (i = 1; i <= NR; i++) { k = lab[i]; if (meth[k] != "streaming-diloco" || rel[k] == "-") continue; all++
        if (rel[k] * F[k] <= 1.01) met++
        list = list sprintf("%s%s %.3f (goal %.3f)", (all > 1 ? "; " : ""), k, rel[k], 1 / F[k]) }
      printf "Met by %d of %d Streaming rows; peak against DiLoCo'\''s in the same format: %s. The fragments are ranges of the flat parameter vector: with whole tensors this CNN'\''s first dense weight (32,768 of its 37,610 parameters, 87%%) would be the peak whatever F. Met means within 1%% of 1/F: a range holds ceil(n / F) elements, and a compressed one rounds up to whole blocks of 128, each with its scale.\n", met, all, list
    }' "$stats"
}

# E4's plot: a row per method, four panels each asking one question: does it keep DDP's
# accuracy, how many bytes does an inner step send, how many are on the wire at once, and what
# would the run take on a 1 Gbit/s link.
plot_e4() {
  local stats=$1 png=$2 epochs=$3 seeds_used=$4 H=$5 lr=$6 items=$7
  local data="$png.tsv" nrows
  nrows=$(wc -l < "$stats")
  # y (the first method on top), label, acc, sd, bytes/step, peak, compute, comm, colour.
  awk -F'\t' -v n="$nrows" '{
      # Decimal: mawk reads 0x7f7f7f as 0 (black).
      c = 0
      if ($2 == "slowmo") c = 8355711
      else if ($2 == "diloco") c = ($1 ~ /Adasum/ ? 9725885 : 2062260)
      else if ($2 == "streaming-diloco") c = ($17 == 2 ? 16744206 : 2924588)
      printf "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\n", n - NR, $1, $4, $5, $9, $10, $11, $12, c
    }' "$stats" > "$data"
  local ytics blank ddp_acc ddp_bytes
  ytics=$(awk -F'\t' '{ printf "%s\"%s\" %s", (NR > 1 ? ", " : ""), $2, $1 }' "$data")
  blank=$(awk -F'\t' '{ printf "%s\"\" %s", (NR > 1 ? ", " : ""), $1 }' "$data")
  ddp_acc=$(awk -F'\t' '$2 == "avg" { print $4 }' "$stats")
  ddp_bytes=$(awk -F'\t' '$2 == "avg" { print $9 }' "$stats")
  local h=$((260 + 34 * nrows)) frac
  # The figure's two-line title keeps its 70 pixels however few the rows.
  frac=$(awk -v h=$h 'BEGIN { printf "%.3f", 1 - 70 / h }')
  gnuplot <<GP
set terminal pngcairo noenhanced size 1900,$h font ",12"
set output "$png"
set datafile separator "\t"
set multiplot title "E4: the DiLoCo family against DDP, CNN on Fashion-MNIST, 8 workers x 32, AdamW $lr, H = $H, $epochs epoch(s) of $items images\nmean and standard deviation over seeds $seeds_used; colours: DDP black, SlowMo grey, DiLoCo blue, DiLoCo with Adasum purple, Streaming F=2 orange, F=4 green"
unset key
set grid xtics
set yrange [-0.7:$nrows - 0.3]
set tmargin 4
set bmargin 4
set style fill solid 0.85 noborder
set origin 0, 0
set size 0.37, $frac
set lmargin 34
set rmargin 2
set ytics ($ytics) font ",11"
set title "Does it keep DDP's accuracy?\n(dashed: DDP; dotted: 0.5 points below it)"
set xlabel "final test accuracy (%)"
set arrow 1 from $ddp_acc, graph 0 to $ddp_acc, graph 1 nohead dashtype 2 linecolor rgb "black"
set arrow 2 from $ddp_acc - 0.5, graph 0 to $ddp_acc - 0.5, graph 1 nohead dashtype 3 linewidth 2 linecolor rgb "#d62728"
# From 2.5 points below DDP: a method far behind would otherwise squeeze the differences that
# the goal is about into a sliver; such a row is named at the left edge with its figure.
lo = $ddp_acc - 2.5
set xrange [lo:$ddp_acc + 1.5]
plot "$data" using (\$3 >= lo ? \$3 : NaN):1:4:9 with xerrorbars pointtype 7 pointsize 1.3 linewidth 2 linecolor rgb variable, \
     "$data" using (lo):1:(\$3 < lo ? sprintf("<- off scale: %.2f ± %.2f", \$3, \$4) : ""):9 with labels left offset 0.5,0 font ",10" textcolor rgb variable
unset arrow 1
unset arrow 2
set offsets 0, 0, 0, 0
set xrange [*:*]
set lmargin 2
set ytics ($blank)
set origin 0.37, 0
set size 0.21, $frac
set title "Bytes each rank sends per inner step\n(log scale; dotted: DDP's / (8 H))"
set xlabel "bytes per inner step"
set logscale x
set xrange [100:*]
set arrow 3 from $ddp_bytes / (8 * $H), graph 0 to $ddp_bytes / (8 * $H), graph 1 nohead dashtype 3 linewidth 2 linecolor rgb "#d62728"
plot "$data" using (\$5):1:(100):(\$5):(\$1 - 0.35):(\$1 + 0.35):9 with boxxyerror linecolor rgb variable, \
     "$data" using 5:1:(sprintf("%.0f", \$5)) with labels left offset 0.6,0 font ",10"
unset arrow 3
set origin 0.58, 0
set size 0.21, $frac
set title "Peak bytes on the wire at once\n(the largest exchange one step starts)"
set xlabel "peak bytes in flight (KB)"
unset logscale x
set xrange [0:*]
set offsets 0, graph 0.25, 0, 0
plot "$data" using (\$6 / 2000):1:(0):(\$6 / 1000):(\$1 - 0.35):(\$1 + 0.35):9 with boxxyerror linecolor rgb variable, \
     "$data" using (\$6 / 1000):1:(sprintf("%.1f", \$6 / 1000)) with labels left offset 0.6,0 font ",10"
set origin 0.79, 0
set size 0.21, $frac
set title "Run time with a 1 Gbit/s link (derived)\n(light: compute; dark: exposed communication)"
set xlabel "seconds for the run's inner steps"
plot "$data" using (\$7 / 2):1:(0):(\$7):(\$1 - 0.35):(\$1 + 0.35) with boxxyerror linecolor rgb "#c7c7c7", \
     "$data" using (\$7 + \$8 / 2):1:(\$7):(\$7 + \$8):(\$1 - 0.35):(\$1 + 0.35):9 with boxxyerror linecolor rgb variable, \
     "$data" using (\$7 + \$8):1:(sprintf("%.2f", \$7 + \$8)) with labels left offset 0.6,0 font ",10"
unset multiplot
GP
  rm -f "$data"
}

# The claims docs/results.md reads from E4's figure (check_claims, --kernels): DiLoCo level
# with DDP within the spread in every format, its seeds closer together than DDP's, and its
# 4-bit row clear of the 0.5-point goal by more than its own spread; 4 bits level with fp32 in
# every DiLoCo and Streaming setting; the Adasum outer combine behind DDP beyond the spread;
# every Streaming row behind DDP by the means and level with DiLoCo in its format, delay 5
# level with delay 1 and F = 2 with F = 4; SlowMo within DDP's spread; and the byte counts of
# goals 2 and 3 (the e3m0 rows at 1/150 of DDP's bytes, each Streaming peak 1/F of DiLoCo's).
e4_claims() {
  local cost
  cost="$(dirname "$csv")/e4-cost.csv"
  [ -s "$cost" ] || { echo "experiment e4: no $cost for the claims" >&2; exit 1; }
  e4_stats "$cost" | awk -F'\t' "$claims_awk"'
    { k = $1; m[k] = $4; s[k] = $5; q[k] = $16; F[k] = $17; d[k] = $18; fewer[k] = $14; rel[k] = $15; meth[k] = $2
      if ($2 == "avg") ddp = k
      else if ($2 == "slowmo") slow = k
      else if ($2 == "diloco" && k ~ /Adasum/) ada = k
      else if ($2 == "diloco") dil[$16] = k
      else if ($2 == "streaming-diloco") { str[++ns] = k; sk[$17, $18, $16] = k } }
    function fmt(f) { return f == "none" ? "fp32" : f }
    END {
      nq = split("none bf16 e3m0", qs, " ")
      for (i = 1; i <= nq; i++) if (qs[i] in dil)
        claim(level(dil[qs[i]], ddp), "DiLoCo " fmt(qs[i]) " level with DDP within the spread", vs(dil[qs[i]], ddp))
      ok = 1; list = ""
      for (i = 1; i <= nq; i++) if (qs[i] in dil) { ok = ok && s[dil[qs[i]]] < s[ddp]; list = list sprintf("%s%s %.2f", list == "" ? "" : ", ", fmt(qs[i]), s[dil[qs[i]]]) }
      claim(ok, "DiLoCo'\''s seeds closer together than DDP'\''s in every format", sprintf("spreads %s against DDP'\''s %.2f", list, s[ddp]))
      if ("e3m0" in dil) { k = dil["e3m0"]
        claim(m[k] - (m[ddp] - 0.5) > s[k], "DiLoCo e3m0 clear of the goal (0.5 points below DDP) by more than its own spread",
              sprintf("%+.2f points from DDP, %.2f above the line, its spread %.2f", diff(k, ddp), m[k] - m[ddp] + 0.5, s[k])) }
      if (("e3m0" in dil) && ("none" in dil))
        claim(level(dil["e3m0"], dil["none"]), "DiLoCo e3m0 level with DiLoCo fp32 within the spread", vs(dil["e3m0"], dil["none"]))
      ok = 1; n = 0; tr = 0; tf = ""
      for (key in sk) { split(key, p, SUBSEP); if (p[3] != "e3m0" || !((p[1], p[2], "none") in sk)) continue
        a = sk[key]; b = sk[p[1], p[2], "none"]; n++; track(a, b); if (!level(a, b)) ok = 0 }
      if (n) claim(ok, "Streaming e3m0 level with its fp32 row within the spread, every F and delay", sprintf("%d pairs; %s", n, tf))
      if (ada != "") claim(ahead(ddp, ada), "the Adasum outer combine behind DDP beyond the spread", vs(ada, ddp))
      ok = 1; lo = 1e9; hi = -1e9
      for (i = 1; i <= ns; i++) { v = diff(str[i], ddp); if (v >= 0) ok = 0; if (v < lo) lo = v; if (v > hi) hi = v }
      if (ns) claim(ok, "every Streaming row behind DDP by the means", sprintf("%+.2f to %+.2f points over %d rows", lo, hi, ns))
      ok = 1; lo = 1e9; hi = -1e9; tr = 0; tf = ""
      for (i = 1; i <= ns; i++) { k = str[i]; if (!(q[k] in dil)) continue; v = diff(k, dil[q[k]]); track(k, dil[q[k]])
        if (!level(k, dil[q[k]])) ok = 0; if (v < lo) lo = v; if (v > hi) hi = v }
      if (ns) claim(ok, "every Streaming row level with DiLoCo in its format within the spread", sprintf("%+.2f to %+.2f points; %s", lo, hi, tf))
      ok = 1; n = 0; tr = 0; tf = ""
      for (key in sk) { split(key, p, SUBSEP); if (p[2] != 1) continue
        for (key2 in sk) { split(key2, p2, SUBSEP); if (p2[1] == p[1] && p2[3] == p[3] && p2[2] != 1) {
          n++; track(sk[key2], sk[key]); if (!level(sk[key2], sk[key])) ok = 0 } } }
      if (n) claim(ok, "Streaming delay 5 level with delay 1 within the spread, every F and format", sprintf("%d pairs; %s", n, tf))
      ok = 1; n = 0; tr = 0; tf = ""
      for (key in sk) { split(key, p, SUBSEP); if (p[1] != 2 || !((4, p[2], p[3]) in sk)) continue
        n++; track(sk[4, p[2], p[3]], sk[key]); if (!level(sk[4, p[2], p[3]], sk[key])) ok = 0 }
      if (n) claim(ok, "Streaming F=4 level with F=2 within the spread, every delay and format", sprintf("%d pairs; %s", n, tf))
      if (slow != "") { v = diff(slow, ddp); claim((v < 0 ? -v : v) <= s[ddp], "SlowMo within DDP'\''s spread", sprintf("%+.2f points, DDP'\''s spread %.2f", v, s[ddp])) }
      ok = 1; list = ""
      for (k in q) if (q[k] == "e3m0") { if (fewer[k] < 149 || fewer[k] > 151) ok = 0; list = list sprintf(" 1/%.1f", fewer[k]) }
      claim(ok, "the e3m0 rows send 1/150 of DDP'\''s bytes (1/149 to 1/151), not 1/160", "e3m0 rows:" list)
      ok = 1; n = 0
      for (i = 1; i <= ns; i++) { k = str[i]; if (rel[k] == "-") continue; n++; if (rel[k] * F[k] > 1.01) ok = 0 }
      if (n) claim(ok, "every Streaming peak within 1% of 1/F of DiLoCo'\''s in its format", sprintf("%d rows", n))
    }'
}
