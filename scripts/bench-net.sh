#!/usr/bin/env bash
# The network regime of E3 (docs/design/experiments.md): `sumo bench --transport mpi` with every
# byte between ranks going through TCP over links shaped to a datacentre network's bandwidth, on
# one machine.
#
# Ranks on one machine normally exchange through shared memory at memory bandwidth, which hides
# what Adasum's extra dot-product allreduces and its tree cost where the network is the
# bottleneck. So the ranks talk over shaped virtual links instead. Open MPI is limited to TCP
# (ob1 + btl tcp,self: neither vader nor UCX, which would use shared memory), and
# SUMO_MPI_SHM=0 turns off the sumo MPI transport's own shared-memory path.
#
# Topologies (--topology):
#   switch (default)  each rank a host of its own (scripts/net-hosts.sh --hosts N --local 1:
#                     a network namespace with a veth link into a bridge, the switch, both
#                     directions of every link shaped to --rate, as a node's full-duplex NIC
#                     is); mpirun runs from the switch's namespace, its launch agent entering
#                     each host.
#   bus               all ranks in one namespace on its loopback, shaped to --rate. One qdisc sees
#                     every rank's traffic in both directions: the ranks share --rate, like a hub.
# On a small VM the kernel's per-packet work also limits the links (measured on 2 vCPUs: one
# stream 9.7 Gbit/s, both directions at once about 7.8 each); the MTU default keeps it low.
#
# usage: scripts/bench-net.sh [options] [-- sumo bench options]
#   --np "2 4"        rank counts, one mpirun each (default "2 4")
#   --topology T      switch or bus (default switch)
#   --rate 10gbit     tc rate of each link (default 10gbit)
#   --burst BYTES     token-bucket size (default 1mb, 0.8 ms at 10 Gbit/s): what may leave at
#                     link speed before the rate applies; it must hold one packet of the MTU
#   --delay TIME      one-way netem delay added to every packet, e.g. 25us (default none;
#                     needs sch_netem in the kernel)
#   --mtu BYTES       link MTU (default 65535, as the loopback's). Ethernet's 1500 or 9000 make
#                     each packet's kernel cost, not the shaper, the limit on a small VM
#   --sumo PATH       the sumo binary (default build/sumo, or $SUMO)
#   --out DIR         also write DIR/net-<topology>-np<N>.txt and .csv
#   --with-mem        keep sumo bench's memory-bandwidth section (skipped by default)
#   --torch           instead of `sumo bench`: 2 hosts of 2 ranks (scripts/net-hosts.sh), each
#                     --rate of the list (default "1gbit 10gbit") in turn, torchrun across them
#                     (c10d rendezvous) running bench/net_allreduce.py: 64 MiB allreduce bus
#                     bandwidth of sum, average and Adasum through sumo.torch (the two-level and
#                     the flat TCP communicator) and gloo's allreduce, as ratios of the link
#                     rate and of gloo; options after -- go to net_allreduce.py (--reps, --mib)
#   --python PATH     torch 2.x python for --torch (default build/torch-venv/bin/python)
# Default bench options: --ops sum,adasum --iters 10 --warmup 2; anything after -- is appended
# (later options win), e.g. -- --max 64M --dtype fp64.
#
# Needs root (network namespaces, tc), ip, tc and mpirun; without them it says why ("skipped")
# and exits 0, so CI can run it unconditionally.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
nps="2 4"
topology=switch
rate=10gbit
burst=1mb
delay=
mtu=65535
sumo=${SUMO:-$here/build/sumo}
out=
mem=--skip-mem
torch=0
rates="1gbit 10gbit" # --torch's, unless --rate gives one
python=$here/build/torch-venv/bin/python

skip() {
    echo "bench-net: skipped: $*"
    exit 0
}

while [ $# -gt 0 ]; do
    case "$1" in
    --np) nps=$2; shift 2 ;;
    --topology) topology=$2; shift 2 ;;
    --rate) rate=$2; rates=$2; shift 2 ;;
    --burst) burst=$2; shift 2 ;;
    --delay) delay=$2; shift 2 ;;
    --mtu) mtu=$2; shift 2 ;;
    --sumo) sumo=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --with-mem) mem=; shift ;;
    --torch) torch=1; shift ;;
    --python) python=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    *) echo "bench-net: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
case "$topology" in switch | bus) ;; *) echo "bench-net: --topology is switch or bus" >&2; exit 2 ;; esac

if [ "$torch" = 1 ]; then
    # One torchrun per host of each rate's 2 hosts; the ratio to the link needs its rate in
    # Gbit/s.
    [ -x "$python" ] || { echo "bench-net: no python at $python (scripts/torch-venv.sh, or --python)" >&2; exit 1; }
    status=0
    for r in $rates; do
        gbit=$(awk -v r="$r" 'BEGIN { v = r + 0; u = tolower(substr(r, length(v "") + 1));
            print (u ~ /^g/ ? v : u ~ /^m/ ? v / 1e3 : u ~ /^k/ ? v / 1e6 : v / 1e9) }')
        echo "# bench-net: torch, 2 hosts x 2 ranks, links $r (burst $burst, mtu $mtu)"
        code=0
        # shellcheck disable=SC2016 # NET_HOST is each host's own
        PYTHONPATH=$here/python${PYTHONPATH:+:$PYTHONPATH} SUMO_TIMEOUT=${SUMO_TIMEOUT:-300} \
            "$here/scripts/net-hosts.sh" --hosts 2 --local 2 --rate "$r" --burst "$burst" \
            --mtu "$mtu" ${delay:+--delay "$delay"} -- sh -c '"$0" -m torch.distributed.run \
            --nnodes 2 --nproc-per-node 2 --node-rank "$NET_HOST" --rdzv-backend c10d \
            --rdzv-endpoint host0:29500 "$@"' \
            "$python" "$here/bench/net_allreduce.py" --link-gbit "$gbit" "$@" || code=$?
        [ $code -eq 77 ] && skip "scripts/net-hosts.sh cannot make the hosts here (it said why above)"
        [ $code -eq 0 ] || status=1
    done
    exit $status
fi

[ "$(id -u)" -eq 0 ] || skip "needs root for network namespaces and tc (run it with sudo)"
for tool in ip tc mpirun; do
    command -v "$tool" >/dev/null 2>&1 || skip "'$tool' is not installed"
done
[ -x "$sumo" ] || { echo "bench-net: no sumo binary at $sumo (run make, or pass --sumo)" >&2; exit 1; }
maxnp=0
for np in $nps; do [ "$np" -gt "$maxnp" ] && maxnp=$np; done
[ "$maxnp" -le 200 ] || { echo "bench-net: at most 200 ranks" >&2; exit 2; }

[ -n "$out" ] && mkdir -p "$out"
mpi_flags=(--oversubscribe --allow-run-as-root --mca pml ob1 --mca btl "tcp,self"
           --mca oob_tcp_if_include lo --mca osc '^ucx')
status=0

run_np() { # np, then the command; its output also to $out's file
    local np=$1
    shift
    if [ -n "$out" ]; then
        "$@" 2>&1 | tee "$out/net-$topology-np$np.txt" # pipefail: the command's status
    else
        "$@"
    fi
}

if [ "$topology" = switch ]; then
    # Every rank a host: scripts/net-hosts.sh makes the switch, runs mpirun across it and takes
    # it down. The ranks see this machine's /tmp (--share-tmp), where --out may lie.
    # SUMO_MPI_SHM=0 on every rank: nothing shared between the ranks, which are hosts.
    for np in $nps; do
        args=(bench --transport mpi --ops "sum,adasum" --iters 10 --warmup 2)
        [ -n "$mem" ] && args+=("$mem")
        [ -n "$out" ] && args+=(--csv "$out/net-$topology-np$np.csv")
        args+=("$@")
        echo "# bench-net: np $np: $sumo ${args[*]}"
        code=0
        run_np "$np" "$here/scripts/net-hosts.sh" --hosts "$np" --rate "$rate" --burst "$burst" \
            --mtu "$mtu" ${delay:+--delay "$delay"} --share-tmp --mpirun -x SUMO_MPI_SHM=0 -- \
            "$sumo" "${args[@]}" || code=$?
        if [ $code -eq 77 ]; then
            skip "scripts/net-hosts.sh cannot make the hosts here (it said why above)"
        elif [ $code -ne 0 ]; then
            status=1
        fi
    done
    exit $status
fi

hub=sumo-bench-$$-hub
# shellcheck disable=SC2317 # called by the trap
cleanup() { ip netns del "$hub" 2>/dev/null || true; }
trap cleanup EXIT
ip netns add "$hub" 2>/dev/null || skip "cannot create a network namespace (no CAP_NET_ADMIN here?)"
ip -n "$hub" link set lo up
ip -n "$hub" link set lo mtu "$mtu"
# tbf's peakrate would also pace inside the burst, but it drops GSO packets (TCP stalls); a
# burst of about a millisecond is the compromise.
if [ -n "$delay" ]; then
    ip netns exec "$hub" tc qdisc add dev lo root handle 1: netem delay "$delay" limit 100000 ||
        { echo "bench-net: --delay needs sch_netem, which this kernel lacks" >&2; exit 1; }
    ip netns exec "$hub" tc qdisc add dev lo parent 1: handle 2: tbf rate "$rate" burst "$burst" latency 50ms
else
    ip netns exec "$hub" tc qdisc add dev lo root tbf rate "$rate" burst "$burst" latency 50ms
fi || skip "tc cannot shape lo (sch_tbf not available?)"
echo "# bench-net: topology bus, links shaped to $rate (burst $burst, mtu $mtu)${delay:+, delay $delay}:"
ip netns exec "$hub" tc qdisc show dev lo | sed 's/^/#   /'

for np in $nps; do
    args=(bench --transport mpi --ops "sum,adasum" --iters 10 --warmup 2)
    [ -n "$mem" ] && args+=("$mem")
    [ -n "$out" ] && args+=(--csv "$out/net-$topology-np$np.csv")
    args+=("$@")
    echo "# bench-net: np $np: $sumo ${args[*]}"
    run_np "$np" ip netns exec "$hub" env SUMO_MPI_SHM=0 mpirun -np "$np" "${mpi_flags[@]}" \
        --mca btl_tcp_if_include lo "$sumo" "${args[@]}" || status=1
done
exit $status
