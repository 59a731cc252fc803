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
#   switch (default)  each rank in its own network namespace, with a veth link into a bridge (the
#                     switch) in a hub namespace; both directions of every link shaped to --rate,
#                     as a node's full-duplex NIC is. mpirun runs in the hub; its PMIx server
#                     accepts the ranks' connections over the bridge.
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
# Default bench options: --ops sum,adasum --iters 10 --warmup 2; anything after -- is appended
# (later options win), e.g. -- --max 64M --dtype fp64.
#
# Needs root (network namespaces, tc), ip, tc and mpirun; without them it says why and exits 0,
# so CI can run it unconditionally.
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
subnet=10.99.0 # inside namespaces of our own: it cannot clash with the host's networks

skip() {
    echo "bench-net: skipped: $*"
    exit 0
}

while [ $# -gt 0 ]; do
    case "$1" in
    --np) nps=$2; shift 2 ;;
    --topology) topology=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --burst) burst=$2; shift 2 ;;
    --delay) delay=$2; shift 2 ;;
    --mtu) mtu=$2; shift 2 ;;
    --sumo) sumo=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --with-mem) mem=; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    *) echo "bench-net: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
case "$topology" in switch | bus) ;; *) echo "bench-net: --topology is switch or bus" >&2; exit 2 ;; esac

[ "$(id -u)" -eq 0 ] || skip "needs root for network namespaces and tc (run it with sudo)"
for tool in ip tc mpirun; do
    command -v "$tool" >/dev/null 2>&1 || skip "'$tool' is not installed"
done
[ -x "$sumo" ] || { echo "bench-net: no sumo binary at $sumo (run make, or pass --sumo)" >&2; exit 1; }
maxnp=0
for np in $nps; do [ "$np" -gt "$maxnp" ] && maxnp=$np; done
[ "$maxnp" -le 250 ] || { echo "bench-net: at most 250 ranks" >&2; exit 2; }

prefix=sumo-bench-$$
hub=$prefix-hub
namespaces=()
# shellcheck disable=SC2317 # called by the trap
cleanup() {
    local ns
    for ns in "${namespaces[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
}
trap cleanup EXIT

new_ns() {
    ip netns add "$1" 2>/dev/null || skip "cannot create a network namespace (no CAP_NET_ADMIN here?)"
    namespaces+=("$1")
    ip -n "$1" link set lo up
}

# Shapes the egress of device $2 in namespace $1. tbf's peakrate would also pace inside the
# burst, but it drops GSO packets (TCP stalls); a burst of about a millisecond is the compromise.
shape() {
    if [ -n "$delay" ]; then
        ip netns exec "$1" tc qdisc add dev "$2" root handle 1: netem delay "$delay" limit 100000 ||
            { echo "bench-net: --delay needs sch_netem, which this kernel lacks" >&2; exit 1; }
        ip netns exec "$1" tc qdisc add dev "$2" parent 1: handle 2: tbf rate "$rate" burst "$burst" latency 50ms
    else
        ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$rate" burst "$burst" latency 50ms
    fi || skip "tc cannot shape $2 (sch_tbf not available?)"
}

if [ "$topology" = bus ]; then
    new_ns "$hub"
    ip -n "$hub" link set lo mtu "$mtu"
    shape "$hub" lo
    shown="$hub:lo"
else
    new_ns "$hub"
    ip -n "$hub" link add br0 type bridge
    ip -n "$hub" link set br0 mtu "$mtu" up
    ip -n "$hub" addr add "$subnet.254/24" dev br0
    for ((k = 0; k < maxnp; k++)); do
        ns=$prefix-r$k
        new_ns "$ns"
        ip link add "v$k" netns "$ns" type veth peer name "p$k" netns "$hub" ||
            skip "cannot create veth pairs"
        ip -n "$ns" link set "v$k" mtu "$mtu" up
        ip -n "$ns" addr add "$subnet.$((k + 1))/24" dev "v$k"
        ip -n "$hub" link set "p$k" mtu "$mtu" master br0 up
        shape "$ns" "v$k"  # the rank's uplink
        shape "$hub" "p$k" # its downlink
    done
    shown="$prefix-r0:v0"
fi

echo "# bench-net: topology $topology, links shaped to $rate (burst $burst, mtu $mtu)${delay:+, delay $delay}:"
ip netns exec "${shown%%:*}" tc qdisc show dev "${shown##*:}" | sed 's/^/#   /'

[ -n "$out" ] && mkdir -p "$out"
mpi_flags=(--oversubscribe --allow-run-as-root --mca pml ob1 --mca btl "tcp,self"
           --mca oob_tcp_if_include lo --mca osc '^ucx')
status=0
for np in $nps; do
    args=(bench --transport mpi --ops "sum,adasum" --iters 10 --warmup 2)
    [ -n "$mem" ] && args+=("$mem")
    [ -n "$out" ] && args+=(--csv "$out/net-$topology-np$np.csv")
    args+=("$@")
    echo "# bench-net: np $np: $sumo ${args[*]}"
    if [ "$topology" = bus ]; then
        cmd=(ip netns exec "$hub" env SUMO_MPI_SHM=0 mpirun -np "$np" "${mpi_flags[@]}"
             --mca btl_tcp_if_include lo "$sumo" "${args[@]}")
    else
        # One application context per rank, each started inside its own namespace. The
        # variable is set in each context: mpirun's -x reaches only the first one, and ranks
        # that disagree on SUMO_MPI_SHM would not agree on the shared window either.
        cmd=(ip netns exec "$hub" env PMIX_MCA_ptl_tcp_remote_connections=1
             "PMIX_MCA_ptl_tcp_if_include=$subnet.0/24"
             mpirun "${mpi_flags[@]}" --mca btl_tcp_if_include "$subnet.0/24")
        for ((k = 0; k < np; k++)); do
            [ "$k" -gt 0 ] && cmd+=(:)
            cmd+=(-np 1 ip netns exec "$prefix-r$k" env SUMO_MPI_SHM=0 "$sumo" "${args[@]}")
        done
    fi
    if [ -n "$out" ]; then
        "${cmd[@]}" 2>&1 | tee "$out/net-$topology-np$np.txt" || status=1 # pipefail: mpirun's
    else
        "${cmd[@]}" || status=1
    fi
done
exit $status
