# shellcheck shell=bash
# What every experiment shares: a training run and its CSV row, the columns by name, the
# per-setting statistics over the seeds, the checks of the outputs. Sourced by
# scripts/experiment after its options ($quick, $seeds, $resume, $replot, $out, $csv, $md).

# One training run; its summary row goes to $csv with the label and the command prepended.
run() {
  local label=$1; shift
  local cmd=("$sumo" train --seed $seed --no-progress "$@")
  # --resume: a row with this very command is already there.
  if [ $resume -eq 1 ] && [ -f "$csv" ] && grep -qF ",\"${cmd[*]}\"" "$csv"; then return 0; fi
  local dir
  dir=$(mktemp -d)
  if ! "${cmd[@]}" --summary "$dir/row.csv" > "$dir/out" 2>&1; then
    cat "$dir/out" >&2
    echo "experiment $exp: failed: ${cmd[*]}" >&2
    rm -rf "$dir"
    exit 1
  fi
  [ -f "$csv" ] || echo "label,$(head -1 "$dir/row.csv"),command" > "$csv"
  tail -n +2 "$dir/row.csv" | sed "s|^|$label,|; s|\$|,\"${cmd[*]}\"|" >> "$csv"
  rm -rf "$dir"
}

# The same run once per seed (--seeds), each a row of $csv. With --replot, nothing.
runs() {
  [ $replot -eq 0 ] || return 0
  for seed in $seeds; do run "$@"; done
}

# Field number of the column of $csv named $1 in its header. The tables read fields by name so
# that they stay right when the summary gains or reorders columns; an unknown name is a hard
# error rather than a table of the wrong column. Take it with a plain var=$(col name): set -e
# misses the failure inside `local var=$(...)` or inside another command's arguments.
col() {
  local n
  n=$(head -1 "$csv" | tr , '\n' | grep -n -x -F -- "$1" | cut -d: -f1)
  [ -n "$n" ] || { echo "experiment $exp: no column $1 in $csv" >&2; exit 1; }
  echo "$n"
}

check_outputs() {
  local ok=1
  for f in "$@"; do
    if [ ! -s "$f" ]; then echo "experiment $exp: missing or empty $f" >&2; ok=0; fi
    case $f in *.png) head -c 8 "$f" | od -An -c | grep 'P   N   G' > /dev/null || { echo "experiment $exp: $f is not a PNG" >&2; ok=0; } ;; esac
  done
  local cols
  cols=$(head -1 "$csv" | awk -F, '{print NF}')
  # Rows may have commas only inside the quoted command at the end.
  if awk -F, -v n="$cols" 'NR > 1 { if (NF < n) bad = 1 } END { exit bad }' "$csv"; then :; else echo "experiment $exp: malformed rows in $csv" >&2; ok=0; fi
  grep -q '^|' "$md" || { echo "experiment $exp: no table in $md" >&2; ok=0; }
  [ $ok -eq 1 ]
}

elapsed() { echo $(( $(date +%s) - start )); }

# Per setting (label, optimizer, worker count) over its seeds, as tab-separated lines: label,
# optimizer, workers, total batch, seeds, mean, sd, min and max of the final accuracy (%),
# seeds that reached the target, their mean epochs to it, seeds that diverged, mean best
# accuracy (%), rounds, bytes and steps (the first seed's: they do not depend on the seed).
# Settings come out in the order the CSV first has them.
seed_stats() {
  local c_label c_workers c_total c_opt c_final c_best c_reach c_epochs c_div c_rounds c_bytes c_steps
  c_label=$(col label); c_workers=$(col workers); c_total=$(col total_batch); c_opt=$(col optimizer)
  c_final=$(col final_accuracy); c_best=$(col best_accuracy); c_reach=$(col steps_to_target)
  c_epochs=$(col epochs_to_target); c_div=$(col diverged); c_rounds=$(col rounds)
  c_bytes=$(col bytes); c_steps=$(col steps)
  awk -F, -v label="$c_label" -v workers="$c_workers" -v total="$c_total" -v optimizer="$c_opt" \
      -v final="$c_final" -v best="$c_best" -v reach="$c_reach" -v epochs="$c_epochs" -v diverged="$c_div" \
      -v rounds="$c_rounds" -v bytes="$c_bytes" -v steps="$c_steps" '
    NR > 1 {
      k = $label SUBSEP $optimizer SUBSEP $workers
      if (!(k in n)) { order[++m] = k; tot[k] = $total; r[k] = $rounds; b[k] = $bytes; st[k] = $steps
                       lo[k] = hi[k] = 100 * $final }
      a = 100 * $final
      n[k]++; s[k] += a; ss[k] += a * a; bs[k] += 100 * $best
      if (a < lo[k]) lo[k] = a
      if (a > hi[k]) hi[k] = a
      if ($reach >= 0) { reached[k]++; ep[k] += $epochs }
      if ($diverged == 1) div[k]++
    }
    END {
      for (i = 1; i <= m; i++) {
        k = order[i]; split(k, f, SUBSEP)
        mean = s[k] / n[k]; var = n[k] > 1 ? (ss[k] - n[k] * mean * mean) / (n[k] - 1) : 0
        printf "%s\t%s\t%d\t%d\t%d\t%.4f\t%.4f\t%.4f\t%.4f\t%d\t%s\t%d\t%.4f\t%s\t%s\t%s\n", f[1], f[2], f[3], tot[k],
          n[k], mean, (var > 0 ? sqrt(var) : 0), lo[k], hi[k], reached[k] + 0,
          reached[k] ? sprintf("%.2f", ep[k] / reached[k]) : "-", div[k] + 0, bs[k] / n[k], r[k], b[k], st[k]
      }
    }' "$csv"
}

# "86.22 ± 0.45" (mean ± sample standard deviation over the seeds), or "86.22" for one seed.
cell() { awk -v m="$1" -v sd="$2" -v n="$3" 'BEGIN { if (n > 1) printf "%.2f ± %.2f", m, sd; else printf "%.2f", m }'; }

# What the bits of these rows depend on besides the code (tools/sumo/machine.h).
machine_line() {
  local c_blas c_isa
  c_blas=$(col blas_core); c_isa=$(col kernel_isa)
  awk -F, -v b="$c_blas" -v i="$c_isa" 'NR > 1 { seen[$b " core, sumo kernels " $i] = 1 }
    END { for (k in seen) printf "%sOpenBLAS %s", (c++ ? "; " : ""), k }' "$csv"
}

# The value of a flag in the first recorded command (what the rows ran with, also under
# --replot, whatever this invocation's mode).
csv_flag() {
  awk -F, -v c="$(col command)" -v f="$1" 'NR == 2 { n = split($c, w, " "); for (i = 1; i < n; i++) if (w[i] == f) print w[i + 1] }' "$csv"
}

# The seeds the rows ran with, from their commands (so also under --replot), as 1,2,3.
seed_list() {
  awk -F, -v c="$(col command)" 'NR > 1 { if (match($c, /--seed [0-9]+/)) s[substr($c, RSTART + 7, RLENGTH - 7)] = 1 }
    END { for (k in s) printf "%s ", k }' "$csv" | tr ' ' '\n' | sort -n | paste -sd, -
}

# The lines under a report's title: the command that made it, and what its bits hold on.
provenance() {
  echo "Generated by \`scripts/experiment $exp$( [ $quick -eq 1 ] && echo ' --quick')$( [ -z "$kernels" ] || echo " --kernels $kernels")\` ($(runs_line)). Every row of \`$(basename "$csv")\` carries its command."
  echo "Parameter hashes (column fnv1a) hold on machines with the same $(machine_line)."
}

runs_line() {
  local c_wall
  c_wall=$(col wall_s)
  awk -F, -v w="$c_wall" 'NR > 1 { n++; t += $w } END { printf "%d training runs, whose wall times add up to %.0f s", n, t }' "$csv"
}

# --kernels: the experiment's claims (${exp}_claims: a line each, tab-separated: 1 if it holds
# or 0, the claim, the figures it rests on) on the record's rows and on this run's, side by
# side in $out/<exp>-claims.md and on stdout. Fails when the rows did not run under the kernels
# asked for (an OpenBLAS built without DYNAMIC_ARCH picks its core alone), or when a claim that
# holds on the record does not hold here.
check_claims() {
  local record=$1 ran mine theirs here there claims=$out/$exp-claims.md
  ran=$(awk -F, -v b="$(col blas_core)" -v i="$(col kernel_isa)" 'NR > 1 { print $i "," $b }' "$csv" | sort -u | paste -sd' ' -)
  if [ "${ran,,}" != "${kernels,,}" ]; then
    echo "experiment $exp: --kernels $kernels, but the rows of $csv ran with $ran (kernels,OpenBLAS core)" >&2
    exit 1
  fi
  mine=$("${exp}_claims")
  theirs=$(csv=$record "${exp}_claims")
  here=$(machine_line)
  there=$(csv=$record machine_line)
  local table
  table=$(awk -F'\t' 'NR == FNR { rec[$2] = $1; recf[$2] = $3; order[++n] = $2; next }
    { got[$2] = $1; gotf[$2] = $3; if (!($2 in rec)) order[++n] = $2 }
    END {
      for (i = 1; i <= n; i++) {
        c = order[i]
        a = c in rec ? (rec[c] ? "holds: " : "does not hold: ") recf[c] : "not made"
        b = c in got ? (got[c] ? "holds: " : "**does not hold**: ") gotf[c] : "**not made**"
        printf "| %s | %s | %s |\n", c, a, b
        if ((c in rec) && rec[c] && !((c in got) && got[c])) lost++
        if ((c in rec) && rec[c] && (c in got) && got[c]) kept++
      }
      printf "%d %d\n", kept, lost > "/dev/stderr"
    }' <(printf '%s\n' "$theirs") <(printf '%s\n' "$mine") 2> "$out/.claims-count")
  local kept lost
  read -r kept lost < "$out/.claims-count"
  rm -f "$out/.claims-count"
  {
    echo "# ${exp^^}: the figure's claims on the record and under other kernels"
    echo
    echo "Generated by \`scripts/experiment $exp --kernels $kernels\`: the record's rows (\`$record\`, $there) against"
    echo "the same commands run here under $here (\`$csv\`)."
    echo "Beyond the spread: two means differ by more than their two sample standard deviations added; within it: by no more."
    echo
    echo "| claim | the record | under $kernels |"
    echo "|---|---|---|"
    echo "$table"
    echo
    echo "$kept of the claims that hold on the record hold under $kernels; $lost do not."
  } > "$claims"
  cat "$claims"
  [ "$lost" -eq 0 ] || { echo "experiment $exp: $lost claim(s) of the record fail under --kernels $kernels ($claims)" >&2; exit 1; }
}

# Helpers of the claims, in awk: m[k], s[k] a setting's mean and standard deviation (%).
claims_awk='
  function cell(k) { return sprintf("%.2f ± %.2f", m[k], s[k]) }
  function diff(a, b) { return m[a] - m[b] }
  function spread(a, b) { return s[a] + s[b] }
  function vs(a, b) { return sprintf("%s against %s (%+.2f, spread %.2f)", cell(a), cell(b), diff(a, b), spread(a, b)) }
  function ahead(a, b) { return diff(a, b) > spread(a, b) }
  function level(a, b,   d) { d = diff(a, b); return (d < 0 ? -d : d) <= spread(a, b) }
  # Of the pairs an aggregate claim compares, the one nearest its edge (tr, tf; reset both).
  function track(a, b,   d, sp) { d = diff(a, b); d = d < 0 ? -d : d; sp = spread(a, b)
    if (d / (sp > 0 ? sp : 1e-9) >= tr) { tr = d / (sp > 0 ? sp : 1e-9); tf = sprintf("nearest the edge: %s against %s, %+.2f, spread %.2f", a, b, diff(a, b), sp) } }
  function claim(ok, text, figures) { printf "%d\t%s\t%s\n", ok ? 1 : 0, text, figures }
'
