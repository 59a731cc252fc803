"""What the across-hosts scripts (hier.py, tcp.py: torchrun with SUMO_LOCAL_SIZE, no pytest)
share: the per-tensor layout and inputs they reduce, sumo's allreduce of a tensor in place on a
given communicator, the float64 reference, and one line per check with the failures kept for
the exit code."""
import torch
import torch.distributed as dist

from sumo._abi import SUMO_OP_ADASUM, SUMO_OP_AVERAGE, SUMO_OP_SUM
from sumo._lib import lib
from sumo.torch import _runtime as rt, _tensors
from reference import adasum_per_tensor

KINDS = {"sum": SUMO_OP_SUM, "average": SUMO_OP_AVERAGE, "adasum": SUMO_OP_ADASUM}
# Tensors of the Adasum layout: one element, odd sizes, one larger than a Gram chunk's share.
LAYOUT = [1, 7, 300, 4099, 70000]
EPS = {torch.float32: 2.0 ** -23, torch.float64: 2.0 ** -52, torch.float16: 2.0 ** -10,
       torch.bfloat16: 2.0 ** -7}
failures = []


def report(ok, text):
    if not ok:
        failures.append(text)
    if dist.get_rank() == 0 or not ok:
        print("%s - rank %d: %s" % ("ok  " if ok else "FAIL", dist.get_rank(), text), flush=True)


def bits(t):
    return t.view(torch.int16 if t.element_size() == 2 else
                  torch.int32 if t.element_size() == 4 else torch.int64)


def inputs(dtype):
    g = torch.Generator().manual_seed(1234 + dist.get_rank())
    x = torch.randn(sum(LAYOUT), generator=g, dtype=torch.float64)
    # Partly agreeing ranks (a shared direction), so Adasum's coefficients are not all 1.
    common = torch.randn(sum(LAYOUT), generator=torch.Generator().manual_seed(99),
                         dtype=torch.float64)
    return (x + 2 * common).to(dtype)


def allreduce(comm, t, kind, what):
    """sumo_allreduce of t in place on comm: kind's op, Adasum per tensor of LAYOUT."""
    ptr, n, dt = _tensors.tensor_args(t, what)
    op = _tensors.adasum_op(comm, LAYOUT, what) if kind == SUMO_OP_ADASUM else kind
    code = lib.sumo_allreduce(ptr, ptr, n, dt, op, comm)
    if kind == SUMO_OP_ADASUM:
        lib.sumo_op_destroy(comm, op)
    rt.raise_for(code, what)


def reference(all_inputs, kind):
    """The float64 result from every rank's input: the sum in float64, or the Adasum tree of
    tests/python/reference.py per tensor."""
    x = [a.to(torch.float64) for a in all_inputs]
    if kind == SUMO_OP_ADASUM:
        return torch.cat(adasum_per_tensor([list(a.split(LAYOUT)) for a in x]))
    s = torch.zeros_like(x[0])
    for a in x:
        s += a
    return s / len(x) if kind == SUMO_OP_AVERAGE else s
