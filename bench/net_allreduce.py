#!/usr/bin/env python3
"""Allreduce bus bandwidth across hosts: sumo.torch's two-level communicator (init()'s default
across hosts) and its flat TCP communicator against gloo's allreduce, on the same links, in
one run, calls interleaved.

    torchrun --nnodes 2 --nproc-per-node 2 --node-rank I --rdzv-backend c10d \\
        --rdzv-endpoint host0:29500 bench/net_allreduce.py --link-gbit 1 [--mib 64] [--reps 5]

scripts/bench-net.sh --torch starts it on 2 namespaced hosts of 2 ranks at each rate.

Every call: a barrier (gloo), then one fp32 allreduce of --mib MiB in place, timed on each rank
from the barrier's end to the call's end; the slowest rank's time counts. Each repetition runs
every (path, op) once, in an order rotated from repetition to repetition. Rank 0 prints per
row the median time, the bus bandwidth 2 (P - 1) / P * bytes / time (the ring's bytes per
link: a ring allreduce that keeps every host link busy reaches the link rate), and its ratios
to the link rate (--link-gbit) and to gloo's sum in the same run. Ops: sum, average (gloo has
no average: its row is sum followed by a division), and Adasum of the whole buffer as one
tensor (sumo only).
"""
import argparse
import ctypes
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import sumo.torch as st  # noqa: E402
from sumo._abi import SUMO_OP_ADASUM, SUMO_OP_AVERAGE, SUMO_OP_SUM  # noqa: E402
from sumo._lib import lib  # noqa: E402
from sumo.torch import _pg_transport as pgt, _runtime as rt, _stores, _tensors  # noqa: E402

OPS = {"sum": SUMO_OP_SUM, "average": SUMO_OP_AVERAGE, "adasum": SUMO_OP_ADASUM}


def sumo_call(comm, x, op):
    ptr, n, dt = _tensors.tensor_args(x, "x")
    if op == SUMO_OP_ADASUM:
        aop = _tensors.adasum_op(comm, [n], "adasum")
        try:
            rt.raise_for(lib.sumo_allreduce(ptr, ptr, n, dt, aop, comm), "adasum")
        finally:
            lib.sumo_op_destroy(comm, aop)
    else:
        rt.raise_for(lib.sumo_allreduce(ptr, ptr, n, dt, op, comm), "allreduce")


def gloo_call(x, op):
    dist.all_reduce(x)
    if op == SUMO_OP_AVERAGE:
        x.div_(dist.get_world_size())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=float, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--link-gbit", type=float, required=True,
                    help="the rate of each host's link, for the ratio to it")
    ap.add_argument("--ops", default="sum,average,adasum")
    ap.add_argument("--paths", default="gloo,two-level,flat tcp")
    args = ap.parse_args()
    st.init()
    torch.set_num_threads(1)
    P = dist.get_world_size()
    comms = {"two-level": rt.state.comm}
    paths = [p.strip() for p in args.paths.split(",")]
    if "flat tcp" in paths:
        store = pgt.StoreAdapter(_stores._store_of(dist.group.WORLD))
        comms["flat tcp"] = _stores.make_tcp(store, st.rank(), P,
                                             _stores._key_prefix(dist.group.WORLD) + "bench/",
                                             st.local_size(), "the bench's store")
    ops = [o.strip() for o in args.ops.split(",")]
    rows = [(p, o) for p in paths for o in ops if not (p == "gloo" and o == "adasum")]
    n = int(args.mib * (1 << 20)) // 4
    x = torch.empty(n)
    g = torch.Generator().manual_seed(st.rank())
    src = torch.randn(n, generator=g)
    times = {r: [] for r in rows}
    for i in range(args.warmup + args.reps):
        k = i % len(rows)
        for row in rows[k:] + rows[:k]:
            path, op = row
            x.copy_(src)
            dist.barrier()
            t0 = time.perf_counter()
            if path == "gloo":
                gloo_call(x, OPS[op])
            else:
                sumo_call(comms[path], x, OPS[op])
            t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            if i >= args.warmup:
                times[row].append(t.item())
    bytes_ = n * 4
    link = args.link_gbit * 1e9 / 8
    med = {r: statistics.median(ts) for r, ts in times.items()}
    if st.rank() == 0:
        print("%d ranks (%d per host), %.0f MiB fp32, host links %g Gbit/s; median of %d, "
              "slowest rank; sumo's two-level path: %s"
              % (P, st.local_size(), args.mib, args.link_gbit, args.reps, rt.state.transport))
        print("%-10s %-8s %9s %10s %8s %8s" % ("path", "op", "ms", "bus GB/s", "of link",
                                              "vs gloo"))
        gloo = med.get(("gloo", "sum"))
        for r in rows:
            bus = 2 * (P - 1) / P * bytes_ / med[r]
            print("%-10s %-8s %9.1f %10.3f %8.2f %8s"
                  % (r[0], r[1], med[r] * 1e3, bus / 1e9, bus / link,
                     "%.2f" % (gloo / med[r]) if gloo else "-"), flush=True)
    if "flat tcp" in comms:
        lib.sumo_comm_destroy(comms["flat tcp"])
    st.shutdown()


if __name__ == "__main__":
    main()
