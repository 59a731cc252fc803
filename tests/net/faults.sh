#!/usr/bin/env bash
# Faults on the wire: 3 hosts of 1 rank as network namespaces (scripts/net-hosts.sh, links
# shaped to 1 Gbit/s), an elastic job (sumo.torch.elastic over the TCP transport) started on
# every host with python -m sumo.launch --store tcp://host0:29400 (--serve-store on host0),
# training tests/net/faults.py's model:
#   - 3% of the packets leaving every host dropped for the whole run: the parameters bit for
#     bit the reference's at size 3 (computed without sumo), no membership change;
#   - host2's link taken down inside a step's allreduce: hosts 0 and 1 go on at size 2 within
#     the liveness timeout, bit for bit the reference where host2 left at the commit before;
#     the process on host2 ends with a message within the deadline;
#   - host2 cut off (every packet dropped) inside an allreduce and back 20 s later, after the
#     others went on (a cut shorter than the deadline is only a stall: TCP retransmits, and the
#     job goes on at size 3): the same for hosts 0 and 1; host2's process, its store calls
#     bounded by the deadline, ends with a message (the job it comes back to went on without it);
#   - a joiner on host2 whose model differs in size: refused, the two members go on;
#   - without the elastic API (one allreduce per step), host2's link down inside one: every
#     process ends with a message naming the lost host within the deadline.
# Called by tests/net/run.sh (torch 2.x's python as $1); SUMO_SKIP_NET=1 skips both.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1

# Inside a host: host0's store server, and this host's process of the job.
if [ "${1:-}" = --host ]; then
  py=$2 role=$3
  shift 3
  if [ "$NET_HOST" = 0 ]; then
    "$py" -m sumo.launch --serve-store host0:29400 > /dev/null &
    server=$!
  fi
  if [ "$role" = join ]; then
    place=(--join)
  else
    place=(--rank "$NET_HOST" --size "$role")
  fi
  "$py" -m sumo.launch --store tcp://host0:29400 "${place[@]}" --transport tcp \
    tests/net/faults.py "$@"
  status=$?
  [ -z "${server:-}" ] || kill "$server"
  exit $status
fi

py=$1
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
# A lost host is found by its heartbeat within the liveness timeout; the deadline bounds
# everything else (a store call, a meeting).
export SUMO_TIMEOUT=${SUMO_FAULT_TIMEOUT:-10} SUMO_LIVENESS_TIMEOUT=2
nethosts=(scripts/net-hosts.sh --hosts 3 --local 1 --rate 1gbit --share-tmp --timeout 150)
passed=0 failed=0
ok()   { echo "ok   - $*"; passed=$((passed + 1)); }
fail() { echo "FAIL - $*"; failed=$((failed + 1)); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp"

# run NAME SIZE [net-hosts options] -- [faults.py elastic options]: the job's output, its
# exit status (the first host's that failed), and the check of what the processes wrote.
job() {
  local name=$1 size=$2
  shift 2
  local opts=()
  while [ "$1" != -- ]; do opts+=("$1"); shift; done
  shift
  mkdir -p "$tmp/$name"
  local start=$SECONDS
  # shellcheck disable=SC2016 # NET_HOST is each host's own
  "${nethosts[@]}" "${opts[@]}" -- sh -c '
    if [ "$NET_HOST" -lt "$1" ]; then role=$1; else role=join; fi
    py=$2
    shift 2
    exec tests/net/faults.sh --host "$py" "$role" "$@"' sh "$size" "$py" "$@" > "$tmp/$name.out" 2>&1
  echo $? > "$tmp/$name.code"
  echo $((SECONDS - start)) > "$tmp/$name.secs"
}
checks() {
  local name=$1
  shift
  local out
  out=$("$py" tests/net/faults.py check "$tmp/$name" "$@" --what "$name" 2>&1)
  local code=$?
  echo "$out" | grep -v "^ok   - \|^FAIL - "
  while IFS= read -r line; do
    case $line in "ok   - "*) ok "${line#ok   - }" ;; "FAIL - "*) fail "${line#FAIL - }" ;; esac
  done <<< "$out"
  [ $code -eq 0 ] || { tail -40 "$tmp/$name.out"; }
}
errors() { cat "$tmp/$1"/host*.err 2>/dev/null; }

echo "== 3% packet loss on every link, the whole run"
job loss 3 --loss 3 -- elastic "$tmp/loss"
if [ "$(cat "$tmp/loss.code")" = 0 ]; then ok "loss: every process exited 0 ($(cat "$tmp/loss.secs") s)"
else fail "loss: exit $(cat "$tmp/loss.code")"; fi
checks loss 3

echo "== host2's link down inside a step's allreduce"
job down 3 -- elastic "$tmp/down" --fault down --fault-host 2 --fault-step 9
checks down 3 --lost 1 --fault-host 2 --fault-step 9
[ "$(cat "$tmp/down.code")" != 124 ] || fail "down: the run did not end (net-hosts.sh --timeout)"

echo "== host2 cut off inside a step's allreduce, back 20 s later"
job cut 3 -- elastic "$tmp/cut" --fault cut --fault-host 2 --fault-step 9 --back-after 20
checks cut 3 --lost 1 --fault-host 2 --fault-step 9
[ "$(cat "$tmp/cut.code")" != 124 ] || fail "cut: the run did not end (net-hosts.sh --timeout)"

echo "== a joiner on host2 whose model differs in size"
job join 2 -- elastic "$tmp/join" --wait-joiners 1 --bad-model-on 2
checks join 2 --refused
if grep -q "does not match" "$tmp"/join/host2-*.err 2>/dev/null; then
  ok "join: the joiner was refused: $(head -c 300 "$tmp"/join/host2-*.err)"
else
  fail "join: the joiner on host2 was not refused by name (exit $(cat "$tmp/join.code"))"; tail -20 "$tmp/join.out"
fi

echo "== without the elastic API: host2's link down inside an allreduce"
job plain 3 -- plain "$tmp/plain" --fault-host 2 --fault-step 9
n=0
for h in 0 1 2; do
  f=$(find "$tmp/plain" -name "host$h-*.err" | head -1)
  if [ -n "$f" ] && grep -q "host2\|rank 2" "$f"; then n=$((n + 1)); fi
  [ -z "$f" ] || echo "     host$h: $(head -c 300 "$f")"
done
if [ "$(cat "$tmp/plain.code")" != 124 ] && [ $n -ge 2 ]; then
  ok "plain: hosts 0 and 1 ended naming the lost host ($n of 3 named it; $(cat "$tmp/plain.secs") s in all)"
else
  fail "plain: $n of 3 processes named the lost host (exit $(cat "$tmp/plain.code"))"; tail -20 "$tmp/plain.out"
fi

echo "fault tests: $passed passed, $failed failed"
[ $failed -eq 0 ]
