#!/usr/bin/env bash
# Machines on one machine: H hosts, each a network namespace with its own host name, /tmp and
# /dev/shm, linked to a switch (a bridge in a namespace of its own) by a veth pair shaped to
# --rate in both directions, as a node's full-duplex NIC is; then a command run across them the
# way a user launches across machines, and everything taken down again on every way out.
#
# usage: scripts/net-hosts.sh [options] [--] COMMAND [ARGS...]
#   --hosts H         hosts (default 2), named host0 .. host<H-1> (each host's /etc/hosts names
#                     them all), addresses 10.99.0.1 .. on the switch, its link eth0
#   --local L         ranks per host (default 1): mpirun's slots per host, and NET_LOCAL
#   --rate R          tc tbf rate of every host link, each direction (default 1gbit; none:
#                     unshaped)
#   --burst BYTES     the token bucket (default 1mb): what may leave at link speed before the
#                     rate applies; it must hold one packet of the MTU
#   --mtu BYTES       link MTU (default 65535, as the loopback's; 1500 or 9000 make each
#                     packet's kernel cost, not the shaper, the limit on a small machine)
#   --delay TIME      one-way netem delay on every link, e.g. 100us (needs sch_netem, which
#                     some kernels lack: then it says so and exits 77)
#   --loss N          drop N% of the packets leaving every host, at random (nftables)
#   --second-link H   host H gets a second link, eth1 (10.98.0.<H+1>), into a second switch;
#                     the switch namespace routes between the two networks, so the other
#                     hosts reach eth1's address through it
#   --flap H:AT[:FOR] take host H's link down AT seconds after COMMAND starts, and up again FOR
#                     seconds later (no FOR: it stays down)
#   --cut H:AT[:FOR]  the same with the link up but every packet to and from host H dropped
#                     (nftables): the host is cut off without knowing it
#   --mpirun          run `mpirun --host host0:L,host1:L,... [mpirun options] COMMAND` from the
#                     switch's namespace: its launch agent enters each host (this script with
#                     --enter), TCP between hosts (ob1, btl self,vader,tcp), each host's own
#                     shared memory inside it. The last of this script's options: mpirun's
#                     own follow it, ended by --: net-hosts.sh --mpirun -x VAR -- prog args
#   (default)         run COMMAND on every host at once, as one logs in to each machine and
#                     starts it there; each output line is prefixed with "hostI| "
#   --share-tmp       the hosts see this machine's /tmp (each has an empty one of its own
#                     otherwise), for a tool that writes its results there
#   --timeout S       end everything after S seconds (exit 124)
#   --cleanup         take down what earlier runs of this script left (runs killed with
#                     SIGKILL, which no trap sees) and exit; every run does this first
# COMMAND sees NET_HOST (this host's index), NET_HOSTS, NET_LOCAL, NET_ADDR (this host's address
# on the switch) and NET_HOST0 (host0's). Under --mpirun they describe the host the rank is on.
#
# Exit status: COMMAND's (the first host's that failed, or mpirun's), 124 on --timeout, and 77
# when the hosts cannot be made here (not root, no ip, tc, unshare or nft where needed, no
# network namespaces): one line on stderr says why. Callers decide whether 77 fails or skips.
#
# Names: namespaces sumo-net-<pid>-hub and sumo-net-<pid>-h<I>, /etc/netns/<namespace> for each
# host's /etc/hosts; the interface names live inside those namespaces. Runs at the same time do
# not collide; everything a run made goes on exit, INT, TERM or HUP, with the processes left in
# its hosts; what a SIGKILLed run left goes at the start of the next run, or with --cleanup.
set -euo pipefail

self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
subnet=10.99.0 second=10.98.0 # inside namespaces of our own: no clash with the host's networks
tag=sumo-net

# --enter HOST-INDEX COMMAND...: what runs on a host: its own UTS and mount namespaces inside
# the network namespace (`ip netns exec` makes the mount one and binds /etc/netns/NS/hosts over
# /etc/hosts): host name hostI, empty /tmp (unless --share-tmp) and /dev/shm, so nothing is
# shared between hosts but the network and the files of the checkout. The launch agent mpirun calls uses it too, as
# `net-hosts.sh --agent HOSTNAME REMOTE-COMMAND` (a remote shell's command line).
if [ "${1:-}" = --enter ] || [ "${1:-}" = --agent ]; then
    mode=$1 host=$2
    shift 2
    host=${host#host}
    [ -n "${NET_PREFIX:-}" ] || { echo "net-hosts: $mode needs NET_PREFIX" >&2; exit 2; }
    NET_HOST=$host NET_ADDR=$subnet.$((host + 1))
    export NET_HOST NET_ADDR
    # shellcheck disable=SC2016 # expanded by the inner shell
    inner='hostname "host$NET_HOST" && mount -t tmpfs -o mode=1777 tmpfs /dev/shm &&
           { [ "$NET_SHARE_TMP" = 1 ] || mount -t tmpfs -o mode=1777 tmpfs /tmp; } &&
           cd "$NET_CWD" && exec "$@"'
    if [ "$mode" = --agent ]; then set -- /bin/sh -c "$*"; fi
    NET_CWD=$PWD exec ip netns exec "$NET_PREFIX-h$host" \
        unshare --uts --mount --propagation private -- /bin/sh -c "$inner" sh "$@"
fi

hosts=2 local=1 rate=1gbit burst=1mb mtu=65535 delay='' loss='' two='' flap='' cut='' mpirun=0
limit=0 cleanup_only=0 share_tmp=0
while [ $# -gt 0 ]; do
    case "$1" in
    --hosts) hosts=$2; shift 2 ;;
    --local) local=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --burst) burst=$2; shift 2 ;;
    --mtu) mtu=$2; shift 2 ;;
    --delay) delay=$2; shift 2 ;;
    --loss) loss=$2; shift 2 ;;
    --second-link) two=$2; shift 2 ;;
    --flap) flap=$2; shift 2 ;;
    --cut) cut=$2; shift 2 ;;
    --mpirun) mpirun=1; shift; break ;; # the rest is mpirun's options, --, the command
    --timeout) limit=$2; shift 2 ;;
    --share-tmp) share_tmp=1; shift ;;
    --cleanup) cleanup_only=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    -*) echo "net-hosts: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) break ;;
    esac
done
number() { [[ "$2" =~ ^[0-9]+$ ]] || { echo "net-hosts: $1 must be a number, not '$2'" >&2; exit 2; }; }
number --hosts "$hosts"; number --local "$local"; number --timeout "$limit"
[ -z "$loss" ] || number --loss "$loss"
if [ "$hosts" -lt 1 ] || [ "$hosts" -gt 200 ]; then echo "net-hosts: --hosts is 1 to 200" >&2; exit 2; fi
[ "$local" -ge 1 ] || { echo "net-hosts: --local is at least 1" >&2; exit 2; }
for spec in "$flap" "$cut" "$two"; do
    [ -z "$spec" ] || { [[ "$spec" =~ ^[0-9]+(:[0-9.]+(:[0-9.]+)?)?$ ]] && [ "${spec%%:*}" -lt "$hosts" ]; } ||
        { echo "net-hosts: '$spec' must name a host below $hosts (H or H:AT[:FOR])" >&2; exit 2; }
done
[ $# -gt 0 ] || [ $cleanup_only = 1 ] || { echo "net-hosts: give the command to run (see --help)" >&2; exit 2; }

cannot() {
    echo "net-hosts: cannot make hosts here: $*" >&2
    exit 77
}

# A namespace of ours whose run has ended (its pid gone, or now another program's).
stale() {
    local pid=${1#"$tag"-}
    pid=${pid%%-*}
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    ! grep -qs net-hosts "/proc/$pid/cmdline"
}

# Ends the processes in namespace $1 (all started by a run of this script), then the namespace.
take_down() {
    local ns=$1 pids
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    if [ -n "$pids" ]; then
        # shellcheck disable=SC2086 # a list of pids
        kill -TERM $pids 2>/dev/null || true
        for _ in 1 2 3 4 5 6 7 8 9 10; do
            pids=$(ip netns pids "$ns" 2>/dev/null || true)
            [ -z "$pids" ] && break
            sleep 0.2
        done
        # shellcheck disable=SC2086
        [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
    fi
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "/etc/netns/$ns"
}

[ "$(id -u)" -eq 0 ] || cannot "needs root for network namespaces (run it as root or with sudo)"
for tool in ip tc unshare; do
    command -v "$tool" >/dev/null 2>&1 || cannot "'$tool' is not installed (iproute2, util-linux)"
done
if [ -n "$loss" ] || [ -n "$cut" ]; then
    command -v nft >/dev/null 2>&1 || cannot "--loss and --cut need nft (Debian's nftables)"
fi
[ $mpirun = 0 ] || command -v mpirun >/dev/null 2>&1 || cannot "--mpirun needs mpirun (Open MPI)"

for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$tag-" || true); do
    if stale "$ns"; then take_down "$ns"; fi
done
for d in /etc/netns/"$tag"-*; do
    if [ -d "$d" ] && stale "$(basename "$d")" && ! ip netns list | grep -q "^$(basename "$d")\b"; then
        rm -rf "$d"
    fi
done
[ $cleanup_only = 0 ] || exit 0

prefix=$tag-$$
hub=$prefix-hub
export NET_PREFIX=$prefix NET_HOSTS=$hosts NET_LOCAL=$local NET_HOST0=$subnet.1 NET_SHARE_TMP=$share_tmp
made=()
children=()
# shellcheck disable=SC2317 # called by the traps
cleanup() {
    trap - EXIT INT TERM HUP
    local ns
    for ns in "${made[@]}"; do take_down "$ns"; done
    # The watchdog and the faults, and the sleep each waits in.
    local c
    for c in "${children[@]}"; do
        pkill -TERM -P "$c" 2>/dev/null || true
        kill "$c" 2>/dev/null || true
        wait "$c" 2>/dev/null || true
    done
}
trap cleanup EXIT
trap 'cleanup; exit 143' TERM
trap 'cleanup; exit 130' INT
trap 'cleanup; exit 129' HUP
trap 'cleanup; exit 124' USR1 # the watchdog of --timeout

new_ns() {
    local k
    made+=("$1")
    ip netns add "$1" 2>/dev/null || cannot "ip netns add failed (no CAP_SYS_ADMIN or no network namespaces here)"
    ip -n "$1" link set lo up
    mkdir -p "/etc/netns/$1"
    {
        echo "127.0.0.1 localhost"
        for ((k = 0; k < hosts; k++)); do echo "$subnet.$((k + 1)) host$k"; done
    } > "/etc/netns/$1/hosts"
}

# Shapes the egress of device $2 in namespace $1. tbf's peakrate would also pace inside the
# burst, but it drops GSO packets (TCP stalls); a burst of about a millisecond is the compromise.
shape() {
    local tbf=(tbf rate "$rate" burst "$burst" latency 50ms)
    if [ -n "$delay" ]; then
        ip netns exec "$1" tc qdisc add dev "$2" root handle 1: netem delay "$delay" limit 100000 ||
            cannot "--delay needs sch_netem, which this kernel lacks"
        [ "$rate" = none ] || ip netns exec "$1" tc qdisc add dev "$2" parent 1: handle 2: "${tbf[@]}"
    elif [ "$rate" != none ]; then
        ip netns exec "$1" tc qdisc add dev "$2" root "${tbf[@]}"
    fi || cannot "tc cannot shape $2 (sch_tbf not available?)"
}

# A link of host $1's namespace ($2, device $3 there) into bridge $4 of the hub, address $5.
link() {
    local ns=$1 dev=$2 peer=$3 bridge=$4 addr=$5
    ip link add "$dev" netns "$ns" type veth peer name "$peer" netns "$hub" ||
        cannot "cannot create veth pairs"
    ip -n "$ns" link set "$dev" mtu "$mtu" up
    ip -n "$ns" addr add "$addr/24" dev "$dev"
    ip -n "$hub" link set "$peer" mtu "$mtu" master "$bridge" up
    shape "$ns" "$dev"  # the host's uplink
    shape "$hub" "$peer" # its downlink
}

new_ns "$hub"
ip -n "$hub" link add br0 type bridge
ip -n "$hub" link set br0 mtu "$mtu" up
ip -n "$hub" addr add "$subnet.254/24" dev br0
if [ -n "$two" ]; then
    ip -n "$hub" link add br1 type bridge
    ip -n "$hub" link set br1 mtu "$mtu" up
    ip -n "$hub" addr add "$second.254/24" dev br1
    ip netns exec "$hub" sysctl -qw net.ipv4.ip_forward=1
    # Bridged frames skip iptables/nftables' ip hooks unless br_netfilter says otherwise.
fi
for ((k = 0; k < hosts; k++)); do
    ns=$prefix-h$k
    new_ns "$ns"
    link "$ns" eth0 "h$k" br0 "$subnet.$((k + 1))"
    if [ -n "$two" ]; then
        if [ "$k" = "$two" ]; then
            link "$ns" eth1 "s$k" br1 "$second.$((k + 1))"
            # What a host of two networks sets up: what leaves from eth1's address goes out
            # through eth1, the replies of the connections made to it included.
            ip -n "$ns" rule add from "$second.$((k + 1))" table 100
            ip -n "$ns" route add default via "$second.254" dev eth1 table 100
        else
            ip -n "$ns" route add "$second.0/24" via "$subnet.254"
        fi
    fi
    if [ -n "$loss" ]; then
        # Both directions of the host's link: what it sends and what it receives.
        ip netns exec "$ns" nft -f - <<EOF || cannot "nft cannot load a table (nf_tables not available?)"
table inet sumo_net_loss {
    chain out { type filter hook output priority 0; oifname != "lo" numgen random mod 100 < $loss drop; }
    chain in { type filter hook input priority 0; iifname != "lo" numgen random mod 100 < $loss drop; }
}
EOF
    fi
done

# Takes host $1's link down (how: flap or cut) after $2 s, up again $3 s later (none: never).
fault() {
    local how=$1 h=${2%%:*} rest at for ns
    rest=${2#*:}
    [ "$rest" = "$2" ] && rest=0
    at=${rest%%:*}
    for=${rest#*:}
    [ "$for" = "$rest" ] && for=
    ns=$prefix-h$h
    sleep "$at"
    echo "net-hosts: host$h $( [ "$how" = flap ] && echo "link down" || echo "cut off (every packet dropped)" ) at ${at}s" >&2
    if [ "$how" = flap ]; then
        ip -n "$ns" link set eth0 down
    else
        ip netns exec "$ns" nft -f - <<EOF
table inet sumo_net_cut {
    chain out { type filter hook output priority -10; oifname != "lo" drop; }
    chain in { type filter hook input priority -10; iifname != "lo" drop; }
}
EOF
    fi
    [ -n "$for" ] || return 0
    sleep "$for"
    if [ "$how" = flap ]; then
        ip -n "$ns" link set eth0 up
        # A link that comes back up has lost its routes through it.
        [ -z "$two" ] || [ "$h" = "$two" ] || ip -n "$ns" route replace "$second.0/24" via "$subnet.254"
    else
        ip netns exec "$ns" nft delete table inet sumo_net_cut
    fi
    echo "net-hosts: host$h back at $(awk -v a="$at" -v f="$for" 'BEGIN {print a + f}')s" >&2
}

echo "# net-hosts: $hosts hosts of $local, links $( [ "$rate" = none ] && echo unshaped || echo "shaped to $rate (burst $burst)"), mtu $mtu${delay:+, delay $delay}${loss:+, ${loss}% loss}${two:+, host$two on two networks}" >&2

status=0
# A watchdog: the hosts' processes end when the limit is reached.
if [ "$limit" -gt 0 ]; then
    # shellcheck disable=SC2064 # the sleep's pid, known inside
    (sleep "$limit" & s=$!; trap "kill $s" TERM; wait $s || exit 0
     echo "net-hosts: --timeout $limit reached" >&2; kill -USR1 $$) &
    children+=($!)
fi
[ -z "$flap" ] || { fault flap "$flap" & children+=($!); }
[ -z "$cut" ] || { fault cut "$cut" & children+=($!); }
if [ $mpirun = 1 ]; then
    margs=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do margs+=("$1"); shift; done
    if [ "${1:-}" = -- ]; then shift; else set -- "${margs[@]}"; margs=(); fi
    list=
    for ((k = 0; k < hosts; k++)); do list+=${list:+,}host$k:$local; done
    # The orteds and ranks reach mpirun (in the switch's namespace) and each other over the
    # switch; within a host, Open MPI's own shared memory (vader), which is the host's.
    # As root, which making the hosts needs: --allow-run-as-root.
    ip netns exec "$hub" mpirun --allow-run-as-root --oversubscribe --host "$list" \
        --mca plm_rsh_agent "$self --agent" \
        --mca plm_rsh_no_tree_spawn 1 --mca pml ob1 --mca btl self,vader,tcp --mca osc '^ucx' \
        --mca btl_tcp_if_include "$subnet.0/24" --mca oob_tcp_if_include "$subnet.0/24" \
        "${margs[@]}" "$@" &
    pid=$!
    wait $pid || status=$?
else
    pids=()
    for ((k = 0; k < hosts; k++)); do
        # The subshell's own stderr carries only bash's notice of a command it saw killed.
        (set +e -o pipefail; "$self" --enter "$k" "$@" 2>&1 | sed -u "s/^/host$k| /") 2>/dev/null &
        pids+=($!)
    done
    for p in "${pids[@]}"; do
        wait "$p" || { s=$?; [ $status -ne 0 ] || status=$s; }
    done
fi
exit $status
