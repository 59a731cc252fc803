#!/usr/bin/env python3
"""One allreduce across hosts, by size: sumo's C collectives over its TCP transport
(sumo_tcp.h, the flat communicator of init(transport="tcp")) against the same collectives over
the process group's own calls (_pg_transport.py: a callback into Python per message) and
gloo's own allreduce, in one run, alternating call by call.

    SUMO_LOCAL_SIZE=2 torchrun --standalone --nproc_per_node 4 bench/tcp_allreduce.py \\
        [--sizes 4096,1048576] [--iters 200]

Every call: a barrier, then one in-place fp32 sum of the size's bytes, timed on each rank from
the barrier's end to the call's; rank 0 prints the median over the iterations of the slowest
rank's time (gathered after the run), and the ratio to the group path's and gloo's.
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
from sumo._abi import SUMO_OP_SUM  # noqa: E402
from sumo._lib import lib  # noqa: E402
from sumo.torch import _pg_transport as pgt, _runtime as rt, _tensors  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="4096,1048576")
    ap.add_argument("--iters", type=int, default=200)
    args = ap.parse_args()
    st.init(transport="tcp")
    torch.set_num_threads(1)
    name = ctypes.c_char_p()
    lib.sumo_comm_transport(rt.state.comm, ctypes.byref(name))
    keep = pgt.GroupTransport(dist.group.WORLD)
    gcomm = ctypes.c_void_p()
    desc = keep.desc(0)
    rt.raise_for(lib.sumo_comm_create_transport(ctypes.byref(desc), ctypes.byref(gcomm)), "group")
    paths = {"sumo tcp": rt.state.comm, "sumo group": gcomm, "gloo": None}
    if dist.get_rank() == 0:
        print("%d ranks, sumo's flat path: %s; median of %d calls, slowest rank"
              % (dist.get_world_size(), name.value.decode(), args.iters))
        print("%-10s %-11s %10s %12s %8s" % ("bytes", "path", "us", "vs group", "vs gloo"))
    for nbytes in (int(s) for s in args.sizes.split(",")):
        x = torch.ones(nbytes // 4)
        ptr, n, dt = _tensors.tensor_args(x, "x")
        times = {p: [] for p in paths}
        order = list(paths)
        for i in range(args.iters + 10):
            for p in order[i % 3:] + order[:i % 3]:
                dist.barrier()
                t0 = time.perf_counter()
                if paths[p] is None:
                    dist.all_reduce(x)
                else:
                    rt.raise_for(lib.sumo_allreduce(ptr, ptr, n, dt, SUMO_OP_SUM, paths[p]), p)
                t = time.perf_counter() - t0
                x.fill_(1.0)
                if i >= 10:
                    times[p].append(t)
        med = {}
        for p, ts in times.items():
            mine = torch.tensor(ts, dtype=torch.float64)
            dist.all_reduce(mine, op=dist.ReduceOp.MAX)
            med[p] = statistics.median(mine.tolist()) * 1e6
        if dist.get_rank() == 0:
            for p in paths:
                print("%-10d %-11s %10.1f %11.2fx %7.2fx" % (nbytes, p, med[p],
                                                            med[p] / med["sumo group"],
                                                            med[p] / med["gloo"]), flush=True)
    lib.sumo_comm_destroy(gcomm)
    st.shutdown()


if __name__ == "__main__":
    main()
