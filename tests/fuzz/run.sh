#!/usr/bin/env bash
# Runs each libFuzzer harness (built by `make fuzz-build`) for a bounded time, starting from
# the corpus kept in tests/fuzz/corpus/NAME. New inputs go to a scratch folder, not into the
# repository; a crash leaves its input as FUZZ_BUILD/crash-NAME-* and fails the run.
#
#   tests/fuzz/run.sh FUZZ_BUILD [SECONDS_EACH]
set -uo pipefail
dir=${1:?usage: run.sh FUZZ_BUILD [SECONDS_EACH]}
seconds=${2:-60}
here=$(cd "$(dirname "$0")" && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
status=0
for name in idx checkpoint cli store tcp; do
  bin=$dir/fuzz_$name
  mkdir -p "$scratch/$name"
  # -close_fd_mask=3: the parser's own messages would drown libFuzzer's report.
  "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -close_fd_mask=3 -print_final_stats=1 \
    -artifact_prefix="$dir/crash-$name-" "$scratch/$name" "$here/corpus/$name" > "$scratch/$name.log" 2>&1
  code=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$scratch/$name.log")
  took=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$scratch/$name.log")
  cov=$(grep -o 'cov: [0-9]*' "$scratch/$name.log" | tail -1)
  if [ $code -eq 0 ]; then
    echo "fuzz_$name: ${runs:-?} inputs in ${took:-$seconds} s, $cov, no crash"
  else
    echo "fuzz_$name: FAILED (status $code); input saved as $dir/crash-$name-*"
    grep -E 'ERROR|runtime error|SUMMARY' "$scratch/$name.log" | head -5
    # CI keeps only the log: the input itself, in hex, makes the crash reproducible from it.
    for crash in "$dir"/crash-$name-*; do
      [ -f "$crash" ] && echo "  $crash: $(head -c 4096 "$crash" | od -An -v -tx1 | tr -d ' \n')"
    done
    status=1
  fi
done
exit $status
