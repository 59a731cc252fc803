"""Tensor fusion (Horovod's HOROVOD_FUSION_THRESHOLD): allreduce_async of a floating tensor
with Sum or Average joins the open buffer of its dtype and op instead of starting a
collective of its own. sumo matches collectives by their order on every rank, so where a
buffer is cut must be decided alike on every rank without asking the others; it is
decided by the calls alone:
  - a buffer is started when the next tensor would take it past the threshold (a tensor of
    the threshold or more goes alone), so the k-th call lands in the same buffer on every
    rank that makes the same calls;
  - every open buffer is started, oldest first, when anything waits on or polls one of its
    tensors, and before any other collective of sumo.torch (rt.sync()), since those are
    points of the program every rank reaches in the same order.
There is no timer (Horovod's HOROVOD_CYCLE_TIME): a timer on each rank would cut a buffer
after different tensors on different ranks. A cut at different calls still cannot pass
unnoticed: the buffers' element counts then differ, which sumo refuses with
SUMO_ERR_MISMATCH on every rank.
Sum and Average are elementwise, so a tensor reduced in a fused buffer gets the bits it
gets alone wherever the algorithm adds in rank order (every transport on one host);
prescale and postscale are applied per tensor, so they need not match within a buffer.
"""
import ctypes
import itertools
import time

import torch

from .. import Adasum
from .._abi import SUMO_COLLECTIVE_ALLREDUCE, SUMO_ERR_PEER_FAILURE
from .._lib import lib
from . import _membership, _runtime as rt, _tensors
from ._surface import resolve_op, check_tensor, run, scale, allreduce_inplace


class Pending:
    def __init__(self, req, tensor, postscale, name, t0):
        self.req, self.tensor, self.postscale, self.name, self.t0 = req, tensor, postscale, name, t0
        self.fused = None    # the _Fused buffer it travels in
        self.offset = 0
        self.prescale = 1.0
        self.error = None    # its communicator was replaced before it was waited for


pending = {}
handle_ids = itertools.count(1)


class _Fused:
    """One fused buffer: its tensors (Pending), in call order, and once started its
    collective."""

    def __init__(self, dtype, op):
        self.dtype, self.op = dtype, op
        self.members = []
        self.nbytes = 0
        self.flat = None     # what sumo reduces: a packed copy, or the tensor itself when alone
        self.req = None
        self.started = False
        self.done = False
        self.error = None    # raised to whoever waits on a member
        self.t0 = 0.0
        self.what = ""


class _Fusion:
    threshold = None     # bytes, read at the first asynchronous allreduce
    open = {}            # (dtype, op) -> the _Fused being filled, oldest first
    starting = False     # a buffer is being started: its own sync must not start others
    buffers = 0          # collectives started for asynchronous allreduces, fused or not
    tensors = 0          # tensors they carried


_fusion = _Fusion()


def _fusion_threshold():
    """SUMO_FUSION_THRESHOLD, else HOROVOD_FUSION_THRESHOLD (Horovod's name), else 64 MiB:
    sumo's settings table reads both, and refuses a bad value by the name it read."""
    if _fusion.threshold is not None:
        return _fusion.threshold
    value = ctypes.c_char_p()
    if lib.sumo_setting(b"SUMO_FUSION_THRESHOLD", ctypes.byref(value)) != 0:
        msg = ctypes.create_string_buffer(256)
        lib.sumo_env_check(msg, len(msg))  # the parser's sentence, naming the variable
        raise ValueError("sumo.torch: " + msg.value.decode())
    _fusion.threshold = int(value.value)
    return _fusion.threshold


def fusion_stats():
    """{"buffers": collectives started for allreduce_async so far, "tensors": the tensors
    they carried, "threshold": the fusion threshold in bytes}: buffers < tensors where calls
    were fused."""
    return {"buffers": _fusion.buffers, "tensors": _fusion.tensors,
            "threshold": _fusion_threshold()}


def _start_fused(b):
    """Packs b (or takes its one tensor in place) and starts its collective. An error is
    kept for the members' synchronize() and raised here too."""
    b.started = True
    _fusion.buffers += 1
    _fusion.tensors += len(b.members)
    names = [m.name for m in b.members]
    b.what = "allreduce of %s" % names[0] if len(names) == 1 else \
        "fused allreduce of %d tensors (%s%s)" % (len(names), ", ".join(names[:3]),
                                                  ", ..." if len(names) > 3 else "")
    was, _fusion.starting = _fusion.starting, True
    try:
        if len(b.members) == 1:
            m = b.members[0]
            flat = m.tensor
        else:
            flat = torch.cat([m.tensor.reshape(-1) for m in b.members])
        ptr, n, dt = _tensors.tensor_args(flat, b.what)
        for m in b.members:
            if m.prescale != 1.0:
                k = m.tensor.numel()
                flat.view(-1)[m.offset:m.offset + k].mul_(m.prescale)
        rt.sync()
        req = ctypes.c_void_p()
        b.t0 = time.perf_counter()
        rt.raise_for(run(SUMO_COLLECTIVE_ALLREDUCE, flat, ptr, ptr, n, dt, op=b.op, request=req,
                          cpu=lambda: lib.sumo_allreduce_start(ptr, ptr, n, dt, b.op,
                                                               rt.state.comm,
                                                               ctypes.byref(req))), b.what)
        b.flat, b.req = flat, req
    except BaseException as e:
        b.error = e
        raise
    finally:
        _fusion.starting = was


def _start_open():
    """Starts every open buffer, oldest first (see the note above: a point every rank
    reaches in the same order)."""
    if _fusion.starting:
        return
    while _fusion.open:
        key = next(iter(_fusion.open))
        _start_fused(_fusion.open.pop(key))


def _fuse(p, op, threshold):
    """Adds p to the open buffer of its dtype and op, starting that buffer where the
    threshold says."""
    key = (p.tensor.dtype, op, str(p.tensor.device))  # a buffer holds one device's tensors
    nbytes = p.tensor.numel() * p.tensor.element_size()
    b = _fusion.open.get(key)
    if b is not None and b.nbytes + nbytes > threshold:
        _start_fused(_fusion.open.pop(key))
        b = None
    if b is None:
        b = _fusion.open[key] = _Fused(p.tensor.dtype, op)
    p.fused, p.offset = b, b.nbytes // p.tensor.element_size()
    b.members.append(p)
    b.nbytes += nbytes
    if b.nbytes >= threshold:
        _start_fused(_fusion.open.pop(key))


def _wait_fused(b):
    if not b.started:
        _start_open()
    if b.done or b.error is not None:
        return
    code = lib.sumo_request_wait(b.req)
    b.done = True
    rt.record(b.t0, time.perf_counter(), b.flat.numel() * b.flat.element_size())
    try:
        rt.raise_for(code, b.what)
    except Exception as e:
        b.error = e


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0):
    """Starts an in-place allreduce and returns a handle for poll() and synchronize(). The
    tensor must stay untouched until synchronize() returns it. Sum and Average of floating
    tensors are fused with the calls around them (see the note above)."""
    rt.require_init()
    op = resolve_op(op, average, "allreduce_async_")
    name = name or "tensor"
    check_tensor(tensor, name)
    handle = next(handle_ids)
    if tensor.dtype not in _tensors._DTYPES:  # integers: through float64, at once
        allreduce_inplace(tensor, op, name, float(prescale_factor), float(postscale_factor))
        pending[handle] = Pending(None, tensor, 1.0, name, 0.0)
        return handle
    _tensors.checked_tensor(tensor, name)
    threshold = _fusion_threshold()
    p = Pending(None, tensor, float(postscale_factor), name, 0.0)
    p.prescale = float(prescale_factor)
    if op == Adasum:
        # Adasum is per tensor: one collective each, in call order with the buffers.
        _start_open()
        b = _Fused(tensor.dtype, op)
        b.members.append(p)
        p.fused = b
        _start_fused(b)
    else:
        _fuse(p, op, threshold)
    pending[handle] = p
    return handle


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0):
    """As allreduce_async_, on a copy: synchronize() returns the new tensor."""
    check_tensor(tensor, name or "tensor")
    return allreduce_async_(tensor.detach().clone(memory_format=torch.contiguous_format),
                            average, name, op, prescale_factor, postscale_factor)


def poll(handle):
    """True once the collective of the handle has completed (synchronize() will not wait).
    A tensor still in an open fused buffer starts it (and the others open) first."""
    p = pending.get(handle)
    if p is None:
        raise ValueError("sumo.torch.poll: unknown handle %r" % (handle,))
    if p.error is not None:
        return True
    b = p.fused
    if b is not None:
        if not b.started:
            _start_open()
        if b.done or b.error is not None:
            return True
        done = ctypes.c_int(0)
        rt.raise_for(lib.sumo_request_test(b.req, ctypes.byref(done)), b.what)
        return bool(done.value)
    if p.req is None:
        return True
    done = ctypes.c_int(0)
    rt.raise_for(lib.sumo_request_test(p.req, ctypes.byref(done)), "allreduce of %s" % p.name)
    return bool(done.value)


def synchronize(handle):
    """Waits for the collective of the handle (allreduce_async, broadcast_async_,
    reducescatter_async) and returns its tensor."""
    p = pending.pop(handle, None)
    if p is None:
        raise ValueError("sumo.torch.synchronize: unknown handle %r" % (handle,))
    if p.error is not None:
        raise p.error
    b = p.fused
    if b is not None:
        _wait_fused(b)
        if b.error is not None:
            raise b.error
        if b.flat is not p.tensor:
            k = p.tensor.numel()
            p.tensor.view(-1).copy_(b.flat[p.offset:p.offset + k])
        scale(p.tensor, p.postscale)
        return p.tensor
    if p.req is not None:
        code = lib.sumo_request_wait(p.req)
        rt.record(p.t0, time.perf_counter(), p.tensor.numel() * p.tensor.element_size())
        rt.raise_for(code, "allreduce of %s" % p.name)
        scale(p.tensor, p.postscale)
    return p.tensor


# A collective of sumo.torch's own starts the open fused buffers first (rt.sync()).
rt.before_collective = _start_open


class _Outstanding:
    """What this module has in flight on the communicator, for when sumo.torch.elastic
    replaces it (bind): every started request is waited for (which frees it), and every
    handle not yet synchronized, started or not, raises the loss on synchronize(): the
    caller redoes the step on the new membership."""

    def comm_closing(self):
        lost = rt.error_for(SUMO_ERR_PEER_FAILURE, "the communicator was replaced (a process "
                            "was lost or joined) before this collective was waited for")
        for b in _fusion.open.values():
            b.started = True  # never started now: its members raise below
        _fusion.open.clear()
        for p in pending.values():
            b = p.fused
            if b is not None and b.req is not None and not b.done and b.error is None:
                lib.sumo_request_wait(b.req)
                b.done = True
            elif b is None and p.req is not None:
                lib.sumo_request_wait(p.req)
                p.req = None
            p.error = lost

    def comm_opened(self):
        pass


_outstanding = _Outstanding()
_membership.bind(_outstanding)
