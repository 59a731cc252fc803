#!/usr/bin/env bash
# Across hosts for real: 2 hosts of 2 ranks as network namespaces (scripts/net-hosts.sh: a host
# name, /tmp and /dev/shm of their own, TCP between them over links shaped to 1 Gbit/s), each
# launcher started on every host the way a user starts it across machines:
#   - torchrun --nnodes 2 --node-rank I --rdzv-endpoint host0:29500 (c10d rendezvous), host1
#     with a second link: tests/net/across.py (sum, average and Adasum on the two-level and the
#     flat TCP communicator bit for bit the flat path on one host, DDP hooks and the
#     Horovod-style optimizer, SUMO_SOCKET_IFNAME choosing the interface);
#   - python -m sumo.launch --serve-store on host0 and --store tcp://host0:29400 on each host:
#     across.py over the flat TCP communicator; then --transport shm across the two hosts,
#     which every rank must refuse, naming the two hosts (they share a kernel, /proc and a boot
#     id: the meeting tells them apart by host name);
#   - mpirun from the switch, its launch agent entering each host: across.py over sumo's MPI
#     transport, and `sumo train` equal (its parameters' checksum) to the threads transport's
#     run of 4 workers;
# and the models' digests the same under every launcher; then faults on the wire across 3 hosts
# (tests/net/faults.sh: packet loss, a link down, a host cut off and back, a joiner refused). SUMO_SKIP_NET=1 skips it, saying so;
# otherwise hosts that cannot be made here (not root, no ip) fail it. SUMO_SKIP_TORCH=1 leaves
# out the binding's parts (torch 2.x from build/torch-venv: scripts/torch-venv.sh).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
here=$PWD

# Inside a host: python -m sumo.launch's processes of this host (and host0's store server).
if [ "${1:-}" = --sumo-launch ]; then
  py=$2 transport=$3
  if [ "$NET_HOST" = 0 ]; then
    "$py" -m sumo.launch --serve-store host0:29400 > /dev/null &
    server=$!
  fi
  pids=()
  for ((l = 0; l < NET_LOCAL; l++)); do
    "$py" -m sumo.launch --store tcp://host0:29400 --rank $((NET_HOST * NET_LOCAL + l)) \
      --size $((NET_HOSTS * NET_LOCAL)) --transport "$transport" tests/net/across.py launch &
    pids+=($!)
  done
  status=0
  for p in "${pids[@]}"; do wait "$p" || status=1; done
  [ -z "${server:-}" ] || kill "$server"
  exit $status
fi

if [ "${SUMO_SKIP_NET:-0}" = 1 ]; then
  echo "net tests: skipped (SUMO_SKIP_NET=1)"
  exit 0
fi
[ -x build/sumo ] || { echo "tests/net/run.sh: build/sumo is missing: run make first" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export PYTHONPATH=$here/python${PYTHONPATH:+:$PYTHONPATH} SUMO_TIMEOUT=${SUMO_TIMEOUT:-60}
nethosts=(scripts/net-hosts.sh --hosts 2 --local 2 --rate 1gbit --timeout 300)
passed=0 failed=0
ok()   { echo "ok   - $*"; passed=$((passed + 1)); }
fail() { echo "FAIL - $*"; failed=$((failed + 1)); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Whether the hosts can be made here at all: 77 says why not, in one line.
scripts/net-hosts.sh --hosts 1 -- true 2> "$tmp/probe"
code=$?
if [ $code -eq 77 ]; then
  echo "FAIL - $(cat "$tmp/probe") (SUMO_SKIP_NET=1 skips these tests)"
  exit 1
elif [ $code -ne 0 ]; then
  echo "FAIL - scripts/net-hosts.sh: exit $code: $(cat "$tmp/probe")"
  exit 1
fi

# A launcher's run of across.py: its check lines, and every rank's exit status.
across() {
  local what=$1 out=$2
  shift 2
  local start
  start=$(date +%s)
  "$@" > "$out" 2>&1
  local code=$?
  grep -E "^(host[0-9]\| )?(ok  |FAIL) - " "$out" | sed -E 's/^host[0-9]\| //'
  if [ $code -eq 0 ] && ! grep -q "FAIL - " "$out" && grep -q "ok   - .*DistributedOptimizer op=Adasum" "$out"; then
    ok "$what: every check passed ($(( $(date +%s) - start )) s)"
  else
    fail "$what: exit $code"; tail -30 "$out"
  fi
}

py=
if [ "${SUMO_SKIP_TORCH:-0}" = 1 ]; then
  echo "the binding across hosts: skipped (SUMO_SKIP_TORCH=1)"
elif ! py=$(scripts/torch-venv.sh | tail -1) || [ -z "$py" ]; then
  fail "scripts/torch-venv.sh could not make the torch 2.x environment (SUMO_SKIP_TORCH=1 skips)"
  py=
fi

if [ -n "$py" ]; then
  echo "== torchrun --nnodes 2 --nproc-per-node 2 --rdzv-endpoint host0:29500, host1 with two links"
  # shellcheck disable=SC2016 # NET_HOST is each host's own
  across "torchrun across 2 hosts" "$tmp/torchrun.out" "${nethosts[@]}" --second-link 1 -- \
    sh -c '"$0" -m torch.distributed.run --nnodes 2 --nproc-per-node 2 --node-rank "$NET_HOST" \
      --rdzv-backend c10d --rdzv-endpoint host0:29500 tests/net/across.py torchrun --ifname eth1' "$py"
  if grep -q "ok   - .*SUMO_SOCKET_IFNAME=eth1 on host1.*most of it" "$tmp/torchrun.out" &&
    grep -q "ok   - .*SUMO_SOCKET_IFNAME=eth0 on host1.*almost none" "$tmp/torchrun.out"; then
    ok "SUMO_SOCKET_IFNAME chose the interface on the host of two links"
  else
    fail "SUMO_SOCKET_IFNAME: the checks on the host of two links did not both pass"
  fi

  echo "== python -m sumo.launch --store tcp://host0:29400 on each host (--serve-store on host0)"
  across "sumo.launch across 2 hosts" "$tmp/launch.out" "${nethosts[@]}" -- tests/net/run.sh --sumo-launch "$py" tcp

  echo "== the same with --transport shm: shared memory across two hosts, refused"
  "${nethosts[@]}" -- tests/net/run.sh --sumo-launch "$py" shm > "$tmp/shm.out" 2>&1
  code=$?
  named=$(grep -c 'another machine than rank 0 (hosts \\"host[01]\\" and \\"host[01]\\"\|another machine than rank 0 (hosts "host[01]" and "host[01]"' "$tmp/shm.out")
  if [ $code -ne 0 ] && [ $code -ne 124 ] && [ "$named" -ge 4 ] && ! grep -q "ok   - launch" "$tmp/shm.out"; then
    ok "a shared-memory meeting across hosts: every rank refused it, naming the two hosts"
  else
    fail "shared memory across hosts: exit $code, $named of 4 ranks named the hosts"; tail -20 "$tmp/shm.out"
  fi

  echo "== mpirun across the hosts (launch agent: net-hosts.sh --agent)"
  across "mpirun across 2 hosts" "$tmp/mpirun.out" "${nethosts[@]}" --mpirun -x PYTHONPATH -x SUMO_TIMEOUT -- "$py" tests/net/across.py mpirun

  # The same model under every launcher: the same bits; DDP's average_hook and the optimizer's
  # Average are one computation (SGD on the averaged gradients), so one digest. Except an
  # average under mpirun: its gradients (under 64 KiB) go through MPI_Allreduce across nodes,
  # whose order is Open MPI's (include/sumo.h, SUMO_ALGORITHM_AUTO); there the two must agree
  # with each other.
  for model in "DDP average_hook\|op=Average" "DDP adasum_hook" "op=Adasum"; do
    runs=("$tmp"/torchrun.out "$tmp"/launch.out)
    case $model in *verage*) want=3 ;; *) runs+=("$tmp"/mpirun.out) want=2 ;; esac
    digests=$(grep -h -- "ok   - .*\($model\).*digest" "${runs[@]}" | sed 's/.*digest //' | sort -u)
    n=$(cat "${runs[@]}" | grep -c -- "ok   - .*\($model\).*digest")
    if [ -n "$digests" ] && [ "$(wc -l <<< "$digests")" -eq 1 ] && [ "$n" -ge $want ]; then
      ok "${model/\\|/ and }: one digest in every run compared ($n): $digests"
    else
      fail "${model/\\|/ and }: digests differ, or missing ($n of $want): $(tr '\n' ' ' <<< "$digests")"
    fi
  done
  mine=$(grep -h -- "ok   - .*\(DDP average_hook\|op=Average\).*digest" "$tmp"/mpirun.out | sed 's/.*digest //' | sort -u)
  if [ -n "$mine" ] && [ "$(wc -l <<< "$mine")" -eq 1 ]; then
    ok "mpirun: DDP average_hook and DistributedOptimizer op=Average agree: $mine"
  else
    fail "mpirun: DDP average_hook and op=Average differ, or missing: $(tr '\n' ' ' <<< "$mine")"
  fi
fi

if [ -n "$py" ]; then
  echo "== faults on the wire: 3 hosts, an elastic job (tests/net/faults.sh)"
  start=$(date +%s)
  if tests/net/faults.sh "$py"; then
    ok "faults on the wire: every check passed ($(( $(date +%s) - start )) s)"
  else
    fail "faults on the wire: a check failed ($(( $(date +%s) - start )) s)"
  fi
fi

echo "== sumo train: mpirun across 2 hosts against the threads transport's 4 workers"
train=(train --epochs 1 --batch 32 --train-limit 2000 --test-limit 500 --eval-every 0 --no-progress --lr 0.05)
checksum() { sed -n 's/.*fnv1a \([0-9a-f]*\).*/\1/p' "$1" | head -1; }
build/sumo "${train[@]}" --workers 4 > "$tmp/threads.out" 2>&1
"${nethosts[@]}" --mpirun -x SUMO_TIMEOUT -- build/sumo "${train[@]}" --transport mpi > "$tmp/train.out" 2>&1
code=$?
a=$(checksum "$tmp/threads.out") b=$(checksum "$tmp/train.out")
if [ $code -eq 0 ] && [ -n "$a" ] && [ "$a" = "$b" ]; then
  ok "sumo train under mpirun across 2 hosts = the threads transport, bit for bit (fnv1a $a)"
else
  fail "sumo train across hosts: exit $code, fnv1a '$b' against the threads' '$a'"; tail -10 "$tmp/train.out"
fi

echo "net tests: $passed passed, $failed failed"
[ $failed -eq 0 ]
