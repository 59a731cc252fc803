"""The flat path across hosts over sumo's TCP transport (sumo_tcp.h) against the flat path over
the group's own calls (_pg_transport.py), on one machine: SUMO_LOCAL_SIZE=2 makes hosts of two
consecutive ranks, so sumo.torch.init() takes the path across hosts.

    SUMO_LOCAL_SIZE=2 torchrun --standalone --nproc_per_node 4 tests/python/tcp.py

Checks that init(transport="tcp") made one flat communicator over TCP across the hosts (the
default there, the two-level communicator, is hier.py's); then, for sum, average and
per-tensor Adasum in every dtype, that the TCP communicator's result is bit for bit the group
communicator's (the same C algorithms over the group's point-to-point calls, made here on the
same ranks), the same bits on every rank, and within a tolerance of a float64 reference
computed here from the gathered inputs. Last,
the highest rank leaves (its communicator destroyed): the others' next allreduce must fail
with SUMO_ERR_PEER_FAILURE within a few seconds, not at the deadline. Prints one line per
check on rank 0; exits non-zero on any failure.
"""
import ctypes
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)
os.environ.setdefault("SUMO_TIMEOUT", "60")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import sumo.torch as st  # noqa: E402
from sumo._abi import SUMO_ERR_PEER_FAILURE, SUMO_OP_ADASUM, SUMO_OP_SUM  # noqa: E402
from sumo import _lib  # noqa: E402
from sumo._lib import lib, SumoError  # noqa: E402
from sumo.torch import _pg_transport as pgt, _runtime as rt, _tensors  # noqa: E402
from across_hosts import (EPS, KINDS, allreduce, bits, failures, inputs,  # noqa: E402
                          reference, report)

def group_comm():
    """The flat path over the group's own calls, on the same ranks (what transport="group"
    makes)."""
    t = pgt.GroupTransport(dist.group.WORLD)
    return t, t.comm(rt.state.local_size, "sumo_comm_create_transport")


def main():
    st.init(transport="tcp")
    torch.set_num_threads(1)
    name = ctypes.c_char_p()
    lib.sumo_comm_transport(rt.state.comm, ctypes.byref(name))
    report(rt.state.transport == "tcp" and name.value == b"tcp",
           "init(transport=\"tcp\") across %d hosts: the TCP transport (state %s, communicator %s)"
           % (st.size() // max(1, st.local_size()), rt.state.transport, name.value))
    keep, gcomm = group_comm()
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        for kname, kind in KINDS.items():
            src = inputs(dtype)
            a, b = src.clone(), src.clone()
            allreduce(rt.state.comm, a, kind, "tcp")
            allreduce(gcomm, b, kind, "group")
            everyone = [torch.empty_like(src) for _ in range(dist.get_world_size())]
            dist.all_gather(everyone, src)
            mine = bits(a).to(torch.int64)
            firsts = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
            dist.all_gather(firsts, mine)
            same = all(torch.equal(f, firsts[0]) for f in firsts)
            ref = reference(everyone, kind)
            err = ((a.to(torch.float64) - ref).norm() / ref.norm()).item()
            tol = (100 if kind == SUMO_OP_ADASUM else 4) * EPS[dtype]
            report(torch.equal(bits(a), bits(b)) and same and err < tol,
                   "%-7s %-8s tcp == group bit for bit: %s, same bits on every rank: %s, "
                   "relative error %.2g (limit %.2g)"
                   % (kname, str(dtype).split(".")[1], torch.equal(bits(a), bits(b)), same,
                      err, tol))
    lib.sumo_comm_destroy(gcomm)
    del keep
    # The highest rank leaves: the others fail at once, not at the deadline.
    st.barrier()
    last = dist.get_world_size() - 1
    comm = rt.state.comm
    if dist.get_rank() == last:
        lib.sumo_comm_destroy(comm)
        rt.state.comm = None
    else:
        lib.sumo_comm_set_timeout(comm, ctypes.c_double(60.0))
        t0 = time.monotonic()
        x = torch.ones(1 << 16)
        ptr, n, dt = _tensors.tensor_args(x, "x")
        code = lib.sumo_allreduce(ptr, ptr, n, dt, SUMO_OP_SUM, comm)
        took = time.monotonic() - t0
        report(code == SUMO_ERR_PEER_FAILURE and took < 10,
               "a rank that left: the others' allreduce ended with %s after %.2f s"
               % (_lib.result_name(code), took))
    dist.barrier()
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    try:
        main()
    except SumoError as e:
        print("FAIL - rank %d: %s" % (dist.get_rank(), e), flush=True)
        sys.exit(1)
    os._exit(0)  # the communicator of the rank that left is gone: no shutdown to run
