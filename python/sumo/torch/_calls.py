"""The blocking collectives on tensors (broadcast_tensor, allreduce_tensor) and the
stream-taking calls of CUDA tensors (collective, allreduce_call), each routed to the flat
communicator or to the hierarchical path across hosts (state.hier: _hier.py's allreduce for
CPU tensors, sumo_hier.h's for CUDA ones, set up at the first). A module because this is
where one call picks its route: the modules above it (collectives.py, hooks.py, the
optimizers) issue through it.
"""
import ctypes
import time

from .._abi import (SUMO_SUCCESS, SUMO_OP_SUM, SUMO_OP_AVERAGE, SUMO_OP_ADASUM,
                    SUMO_COLLECTIVE_ALLREDUCE, SUMO_COLLECTIVE_BROADCAST,
                    SUMO_COLLECTIVE_BARRIER, sumo_collective)
from .._lib import lib, SumoError
from . import _cuda
from ._runtime import state, raise_for, broken_by, record, sync
from ._tensors import tensor_args, _ADASUM_LAYOUTS


def collective(kind, sendbuf, recvbuf, count, dtype, stream, op=0, root=0, request=None):
    """sumo_collective_run (or _start into request) of one collective whose kernels run on
    `stream`: the stream-taking form of sumo_allreduce and the others, for CUDA tensors."""
    if state.hier is not None:
        return _hier_collective(kind, sendbuf, recvbuf, count, dtype, stream, op, request)
    c = sumo_collective(ctypes.sizeof(sumo_collective), kind, sendbuf, recvbuf, count, dtype,
                        op, root, stream or None)
    if request is None:
        return lib.sumo_collective_run(state.comm, ctypes.byref(c))
    return lib.sumo_collective_start(state.comm, ctypes.byref(c), ctypes.byref(request))


def _hier_collective(kind, sendbuf, recvbuf, count, dtype, stream, op, request):
    """A CUDA buffer across hosts: the allreduce of sumo_hier.h (_hier.py), set up at the first
    one. It has no asynchronous form: it runs now, and a request asked for is a barrier's on
    the flat communicator (every rank asks for it at the same call), complete soon after."""
    if kind != SUMO_COLLECTIVE_ALLREDUCE:
        raise ValueError("sumo: across hosts, CUDA tensors take the allreduce alone (CUDA IPC in "
                         "each host, NCCL between them); for broadcast, allgather and "
                         "reduce-scatter of CUDA tensors use init(transport=\"nccl\")")
    layout = None
    if op not in (SUMO_OP_SUM, SUMO_OP_AVERAGE, SUMO_OP_ADASUM):
        layout = _ADASUM_LAYOUTS.get((state.comm.value, op))
        if layout is None:
            raise ValueError("sumo: op %d is not one the allreduce of CUDA tensors across hosts "
                             "takes (sum, average, Adasum)" % op)
        op = SUMO_OP_ADASUM
    hier = state.hier
    try:
        if hier.cuda is None:
            _cuda._setup_cuda_hier(hier)
        hier.cuda_allreduce(sendbuf, recvbuf, count, dtype, op, layout, stream,
                            "allreduce of a CUDA buffer across hosts")
    except SumoError as e:
        raise broken_by(e) from None
    if request is None:
        return SUMO_SUCCESS
    c = sumo_collective(ctypes.sizeof(sumo_collective), SUMO_COLLECTIVE_BARRIER, None, None, 0,
                        0, 0, 0, None)
    return lib.sumo_collective_start(state.comm, ctypes.byref(c), ctypes.byref(request))


def allreduce_call(t, ptr, n, dt, op, request=None):
    """sumo_allreduce (request None) or sumo_allreduce_start of tensor t in place: for a CUDA
    tensor the stream-taking form, its kernels on the current stream. Returns the code."""
    if t.device.type != "cuda":
        if request is None:
            return lib.sumo_allreduce(ptr, ptr, n, dt, op, state.comm)
        return lib.sumo_allreduce_start(ptr, ptr, n, dt, op, state.comm, ctypes.byref(request))
    stream = _cuda.current_stream(t)
    _cuda.inputs_ready(t)
    return collective(SUMO_COLLECTIVE_ALLREDUCE, ptr, ptr, n, dt, stream, op=op,
                      request=request)


def _in_place(fn, t, arg, what, name):
    """Runs a blocking in-place collective on t after the queued ones, timed and checked."""
    ptr, n, dt = tensor_args(t, name)
    sync()
    t0 = time.perf_counter()
    if t.device.type == "cuda":
        stream = _cuda.current_stream(t)
        _cuda.inputs_ready(t)
        if fn is lib.sumo_broadcast:
            code = collective(SUMO_COLLECTIVE_BROADCAST, ptr, ptr, n, dt, stream, root=int(arg))
        else:
            code = collective(SUMO_COLLECTIVE_ALLREDUCE, ptr, ptr, n, dt, stream, op=int(arg))
    else:
        code = fn(ptr, ptr, n, dt, int(arg), state.comm)
    raise_for(code, "%s of %s" % (what, name))
    record(t0, time.perf_counter(), n * t.element_size())


def broadcast_tensor(t, root, name):
    _in_place(lib.sumo_broadcast, t, root, "broadcast", name)


def allreduce_tensor(t, op, name):
    # CUDA tensors across hosts take the C design (collective(), _hier_collective).
    if state.hier is not None and int(op) in state.hier.ops and t.device.type != "cuda":
        hier_allreduce(t, int(op), None, "allreduce of " + name)
        return
    _in_place(lib.sumo_allreduce, t, op, "allreduce", name)


def hier_allreduce(t, kind, layout, what):
    """The hierarchical allreduce (state.hier), blocking, after the queued collectives."""
    dt = tensor_args(t, what)[2]
    sync()
    hier_run(t, dt, kind, layout, what, time.perf_counter())


def hier_run(t, dt, kind, layout, what, t0):
    """The hierarchical allreduce itself, on whatever thread keeps the collectives' order (the
    caller's after sync(), or the worker's): a peer lost or late makes the communicator
    unusable and raises PeerLost, as sumo's own collectives do (elastic.run recovers from
    that one only)."""
    try:
        state.hier.allreduce(t, dt, kind, layout, what)
    except SumoError as e:
        raise broken_by(e) from None
    record(t0, time.perf_counter(), t.numel() * t.element_size())
