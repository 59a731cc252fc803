"""The blocking collectives on tensors (broadcast_tensor, allreduce_tensor) and the
stream-taking calls of CUDA tensors (collective, allreduce_call). A module because this is
where one call reaches the communicator: the modules above it (collectives.py, hooks.py, the
optimizers) issue through it.
"""
import ctypes
import time

from .._abi import (SUMO_COLLECTIVE_ALLREDUCE, SUMO_COLLECTIVE_BROADCAST, sumo_collective)
from .._lib import lib
from . import _cuda
from ._runtime import state, raise_for, record, sync
from ._tensors import tensor_args


def collective(kind, sendbuf, recvbuf, count, dtype, stream, op=0, root=0, request=None):
    """sumo_collective_run (or _start into request) of one collective whose kernels run on
    `stream`: the stream-taking form of sumo_allreduce and the others, for CUDA tensors. On
    the two-level communicator the first one joins the NCCL communicator between the hosts
    (_cuda.across_ready), and Adasum takes its hierarchical op (_cuda.device_op)."""
    if state.transport == "hierarchical":
        _cuda.across_ready()
        if kind == SUMO_COLLECTIVE_ALLREDUCE:
            op = _cuda.device_op(op)
    c = sumo_collective(ctypes.sizeof(sumo_collective), kind, sendbuf, recvbuf, count, dtype,
                        op, root, stream or None)
    if request is None:
        return lib.sumo_collective_run(state.comm, ctypes.byref(c))
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
    _in_place(lib.sumo_allreduce, t, op, "allreduce", name)
