"""sumo for PyTorch: a Horovod-style surface (import sumo.torch as hvd) plus DDP
communication hooks and SlowMo.

    import sumo, sumo.torch as st
    st.init()                                   # MPI under mpirun, else one process
    st.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = st.DistributedOptimizer(opt, model.named_parameters(), op=sumo.Adasum)

    ddp = DistributedDataParallel(model)        # gloo group set up by init()
    ddp.register_comm_hook(st.HookState(), st.adasum_hook)

sumo keeps its own communicator: its collectives never run on torch.distributed's group.
"""
import ctypes
import io

import torch

from .. import Sum, Average, Adasum, SumoError
from . import _runtime as _rt
from ._runtime import init, set_timeout, shutdown, take_timeline, union_seconds
from .hooks import HookState, average_hook, sum_hook, adasum_hook, acga_hook
from .optimizer import DistributedOptimizer
from .slowmo import SlowMo, LocalSGD, BMUF

__all__ = ["init", "shutdown", "set_timeout", "rank", "size", "local_rank", "local_size",
           "transport", "allreduce_", "allreduce", "broadcast_", "barrier",
           "broadcast_parameters", "broadcast_optimizer_state", "Sum", "Average", "Adasum",
           "SumoError", "HookState", "average_hook", "sum_hook", "adasum_hook", "acga_hook",
           "DistributedOptimizer", "SlowMo", "LocalSGD", "BMUF", "take_timeline",
           "union_seconds"]


def rank():
    _rt.require_init()
    return _rt.state.rank


def size():
    _rt.require_init()
    return _rt.state.size


def local_rank():
    _rt.require_init()
    return _rt.state.local_rank


def local_size():
    _rt.require_init()
    return _rt.state.local_size


def transport():
    _rt.require_init()
    return _rt.state.transport


def allreduce_(tensor, op=Average, name="tensor"):
    """In place: every rank ends with the combined tensor (Adasum: the tensor as one)."""
    _rt.require_init()
    _rt.allreduce_tensor(tensor, op, name)
    return tensor


def allreduce(tensor, op=Average, name="tensor"):
    _rt.tensor_args(tensor, name)
    return allreduce_(tensor.clone(), op, name)


def broadcast_(tensor, root_rank=0, name="tensor"):
    _rt.require_init()
    _rt.broadcast_tensor(tensor, root_rank, name)
    return tensor


def barrier():
    _rt.sync()
    _rt.raise_for(_rt.lib.sumo_barrier(_rt.require_init()), "barrier")


@torch.no_grad()
def broadcast_parameters(params, root_rank=0):
    """Copies the root's tensors into every rank's, in place: a state_dict, or
    named_parameters() pairs, as Horovod takes them. Integer and other non-float tensors
    (BatchNorm's counters) travel as float64, exact below 2^53."""
    _rt.require_init()
    if isinstance(params, dict):
        items = sorted(params.items())
    else:
        items = list(params)
    for name, t in items:
        if not isinstance(t, torch.Tensor):
            raise TypeError("broadcast_parameters: %s is not a tensor" % name)
        if t.dtype in _rt._DTYPES and t.is_contiguous():
            _rt.broadcast_tensor(t, root_rank, name)
        else:
            staged = t.detach().to(torch.float64).contiguous()
            _rt.broadcast_tensor(staged, root_rank, name)
            t.copy_(staged.to(t.dtype))


def _broadcast_bytes(data, root_rank, what):
    # Length first, then the bytes padded to 8 and viewed as float64 (a broadcast copies
    # bits, so any pattern survives).
    n = torch.tensor([float(len(data) if data is not None else 0)], dtype=torch.float64)
    _rt.broadcast_tensor(n, root_rank, what + " (length)")
    nbytes = int(n[0])
    buf = torch.zeros((nbytes + 7) // 8 * 8, dtype=torch.uint8)
    if data is not None:
        buf[:nbytes] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    if nbytes:
        _rt.broadcast_tensor(buf.view(torch.float64), root_rank, what)
    return bytes(buf[:nbytes].numpy())


def broadcast_object(obj, root_rank=0, name="object"):
    """The root's picklable object on every rank (torch.save format)."""
    _rt.require_init()
    data = None
    if _rt.state.rank == root_rank:
        f = io.BytesIO()
        torch.save(obj, f)
        data = f.getvalue()
    data = _broadcast_bytes(data, root_rank, name)
    return torch.load(io.BytesIO(data))


def broadcast_optimizer_state(optimizer, root_rank=0):
    """The root's optimizer state (moments, step counts, hyperparameters) on every rank.
    Works for any torch optimizer, also one that has not stepped yet."""
    sd = broadcast_object(optimizer.state_dict() if _rt.state.rank == root_rank else None,
                          root_rank, "optimizer state")
    optimizer.load_state_dict(sd)
