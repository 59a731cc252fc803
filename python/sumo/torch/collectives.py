"""Horovod's collectives on sumo's communicator: allreduce (in and out of place, grouped,
asynchronous), allgather, broadcast, barrier, objects, parameters and optimizer state, and
join for uneven inputs.

join. sumo matches collectives by their order on every rank, so a rank that has run out of
data can only take part in the collectives of the others if it learns what they are. Every
collective of this module (and DistributedOptimizer's with Average or Sum) therefore starts
with an announcement: one allreduce (sum) of eight doubles in which each rank that has not
joined puts 1 and what it is about to run (kind, count, dtype, op); a rank inside join()
puts zeros. A joined rank then runs the same allreduce with zeros as its contribution, as
Horovod's joined ranks do (so Average still divides by every rank: the sum of the active
ranks' tensors over size()), or the same barrier; a broadcast or allgather while ranks have
joined raises on the active ranks, as Horovod's does, and the joined ones go on waiting.
join() returns once every rank is in it. Collectives outside this module (the DDP hooks,
SlowMo, the Adasum delta optimizer) make no announcement: run with a joined rank they meet
its announcement and every rank gets SUMO_ERR_MISMATCH, which join() explains.
"""
import ctypes
import itertools
import os
import pickle
import time
import warnings

import torch

from .. import Sum, Average, Adasum
from .. import _lib
from .._abi import (SUMO_FLOAT64, SUMO_COLLECTIVE_ALLREDUCE, SUMO_COLLECTIVE_ALLGATHER,
                    SUMO_COLLECTIVE_BROADCAST, SUMO_COLLECTIVE_REDUCE_SCATTER,
                    SUMO_ERR_PEER_FAILURE)
from .._lib import lib, SumoError
from . import _calls, _cuda, _membership, _runtime as rt, _tensors
from .compression import Compression, check as check_compression

_OP_NAMES = {Sum: "Sum", Average: "Average", Adasum: "Adasum"}
_FROM_SUMO = {v: k for k, v in _tensors._DTYPES.items()}

# What the announcement says is coming.
ALLREDUCE, _BROADCAST, _ALLGATHER, _BARRIER, _REDUCESCATTER = 1, 2, 3, 4, 5
_KIND_NAMES = {ALLREDUCE: "allreduce", _BROADCAST: "broadcast", _ALLGATHER: "allgather",
               _BARRIER: "barrier", _REDUCESCATTER: "reducescatter"}
_MSG = 8


class _JoinState:
    # Announcements this process took part in: the same count on every rank, since each is
    # a collective; the round a rank joined at tells which rank joined last.
    rounds = 0


_join = _JoinState()


def resolve_op(op, average, where):
    """Horovod's op / deprecated average pair -> a sumo op (Average when neither is given)."""
    if op is not None and average is not None:
        raise ValueError("%s: the op parameter supersedes average; give only one of them" % where)
    if average is not None:
        # average=True/False only: sumo's op numbers are not Horovod's, and a positional op
        # in average's place (allreduce(t, hvd.Adasum)) must not pass for True.
        if not isinstance(average, bool):
            raise TypeError("%s: average is True or False (deprecated; pass op=sumo.torch.Sum, "
                            "Average or Adasum), not %r" % (where, average))
        warnings.warn("%s: average is deprecated, as in Horovod; pass op=" % where,
                      DeprecationWarning, stacklevel=3)
        return Average if average else Sum
    if op is None:
        return Average
    if op not in _OP_NAMES or isinstance(op, bool):
        raise ValueError("%s: op must be sumo.torch.Sum, Average or Adasum, not %r" % (where, op))
    return op


_msg = (ctypes.c_double * _MSG)()  # the announcement's buffer: ctypes, no tensor to make


# Announcements of allreduces started without waiting (announce(..., wait=False)): each
# buffer with its request, in order, until reaped.
_started = []


def reap_announcements(block=True):
    """Waits for the announcements started without waiting (queued ahead of whatever follows
    them, so by then mostly done) and frees their requests; raises the first failure. With
    block=False only those already done, oldest first."""
    err = None
    while _started:
        buf, req, what = _started[0]
        if not block:
            done = ctypes.c_int(0)
            lib.sumo_request_test(req, ctypes.byref(done))
            if not done.value:
                break
        _started.pop(0)
        code = lib.sumo_request_wait(req)
        if code != 0 and err is None:
            err = (code, what)
    if err is not None:
        rt.raise_for(*err)


def _exchange(values, what):
    """The announcement's allreduce (sum) of eight doubles: values in, the sums out."""
    reap_announcements()
    _msg[:] = values
    rt.sync()
    t0 = time.perf_counter()
    rt.raise_for(lib.sumo_allreduce(_msg, _msg, _MSG, SUMO_FLOAT64, Sum, rt.state.comm), what)
    rt.record(t0, time.perf_counter(), 8 * _MSG)
    _join.rounds += 1
    return list(_msg)


def announce(kind, what, count=0, dtype=0, op=0, cuda=False, wait=True):
    """The announcement before a collective (see the module's note); cuda: its buffers are
    CUDA memory (a joined rank's zeros must be too). Raises, on the active ranks, for a
    collective that cannot run while ranks have joined.

    wait=False, for an allreduce started without waiting (the optimizer's buckets, fused
    buffers): the announcement is started too, queued ahead of the allreduce, rather than run
    to the end. An allreduce runs whoever has joined, so nobody needs its answer, and a blocking
    one would wait for every allreduce still in flight (a blocking call runs after the queued
    ones), taking the overlap away. The joined ranks meet the same sequence either way."""
    rt.require_init()
    if rt.state.size == 1:
        return
    if not wait and kind == ALLREDUCE:
        buf = (ctypes.c_double * _MSG)(1.0, kind, count, dtype, op, 1.0 if cuda else 0.0, 0.0, 0.0)
        rt.sync()
        req = ctypes.c_void_p()
        what = "the join announcement before " + what
        rt.raise_for(lib.sumo_allreduce_start(buf, buf, _MSG, SUMO_FLOAT64, Sum, rt.state.comm,
                                              ctypes.byref(req)), what)
        _started.append((buf, req, what))
        _join.rounds += 1
        return
    got = _exchange((1.0, kind, count, dtype, op, 1.0 if cuda else 0.0, 0.0, 0.0),
                    "the join announcement before " + what)
    active = int(round(got[0]))
    if active < rt.state.size and kind not in (ALLREDUCE, _BARRIER):
        raise RuntimeError("sumo.torch: %s: %d of %d ranks have called join(); while ranks "
                           "have joined only allreduce and barrier run (as in Horovod)"
                           % (what, rt.state.size - active, rt.state.size))


def join(device=-1):
    """Horovod's join: this rank has no more data. It takes part in the other ranks'
    allreduces with zeros and in their barriers until every rank has called join(), and
    returns the rank that joined last (of several that joined in the same round, the
    highest). `device` is accepted for Horovod's signature: a joined rank's zeros go to the
    memory the active ranks announce (CUDA: the current device)."""
    rt.require_init()
    size = rt.state.size
    if size == 1:
        return 0
    joined_at = _join.rounds
    try:
        while True:
            got = _exchange((0.0,) * _MSG, "join (the announcement of the active ranks)")
            active = int(round(got[0]))
            if active == 0:
                break
            kind, count, dtype, op, cuda = (int(round(v / active)) for v in got[1:6])
            if kind == ALLREDUCE:
                zeros = torch.zeros(max(count, 0), dtype=_FROM_SUMO.get(dtype, torch.float64),
                                    device="cuda" if cuda else "cpu")
                _calls.allreduce_tensor(zeros, op, "join (a joined rank's zeros in an allreduce)")
            elif kind == _BARRIER:
                rt.sync()
                rt.raise_for(lib.sumo_barrier(rt.state.comm), "join (a barrier)")
        at = torch.tensor([float(joined_at)], dtype=torch.float64)
        everyone = torch.empty(size, dtype=torch.float64)
        _allgather_tensor(at, everyone, "join (the round each rank joined at)")
    except SumoError as e:
        if e.name != "SUMO_ERR_MISMATCH":
            raise
        raise SumoError(e.code, e.name, "sumo.torch.join: the other ranks ran a collective a "
                        "joined rank cannot take part in (join covers sumo.torch's allreduce, "
                        "grouped_allreduce and barrier and DistributedOptimizer with Average or "
                        "Sum; not the DDP hooks, SlowMo or op=Adasum): %s" % e) from e
    rounds = everyone.tolist()
    return max(range(size), key=lambda r: (rounds[r], r))


# -- allreduce ---------------------------------------------------------------------------------

def _check_tensor(t, name):
    """A tensor, on the CPU or a CUDA device (whether this communicator takes CUDA tensors is
    _tensors.tensor_args's to say)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError("sumo: %s is a %s, not a torch.Tensor" % (name, type(t).__name__))
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError("sumo: tensor %s is on %s; sumo reduces CPU and CUDA tensors"
                         % (name, t.device))


def _is_cuda(t):
    return t.device.type == "cuda"


def _run(kind, t, send, recv, n, dt, op=0, root=0, request=None, cpu=None):
    """One collective of tensor t's memory: cpu() (the sumo.h call) for a CPU tensor; for a
    CUDA tensor sumo_collective_run (or _start into request) with its kernels on the current
    stream, after the work the transport must see complete (_cuda.inputs_ready)."""
    if not _is_cuda(t):
        return cpu()
    stream = _cuda.current_stream(t)
    _cuda.inputs_ready(t)
    return _calls.collective(kind, send, recv, n, dt, stream, op=op, root=root, request=request)


def _scale(t, factor):
    if factor != 1.0:
        t.mul_(factor)


def _allreduce_inplace(t, op, name, prescale, postscale):
    """t reduced in place on every rank. Floating tensors go to sumo as they are; integer
    ones through float64 (exact below 2^53), summed, and for Average divided with
    truncation, as Horovod scales integer tensors."""
    _check_tensor(t, name)
    if t.dtype in _tensors._DTYPES:
        # refuses a bad tensor before the announcement
        ptr, n, dt = _tensors.checked_tensor(t, name)
        announce(ALLREDUCE, "allreduce of %s" % name, n, dt, op, _is_cuda(t))
        _scale(t, prescale)
        _calls.allreduce_tensor(t, op, name)
        _scale(t, postscale)
        return t
    if t.dtype == torch.bool or t.is_floating_point() or t.is_complex():
        raise TypeError("sumo: allreduce of %s: dtype %s is not reduced (float32, float64, "
                        "float16, bfloat16 and integer tensors are)" % (name, t.dtype))
    if op == Adasum or prescale != 1.0 or postscale != 1.0:
        raise TypeError("sumo: allreduce of %s: an integer tensor takes Sum or Average without "
                        "scale factors" % name)
    if not t.is_contiguous():
        raise ValueError("sumo: tensor %s is not contiguous (strides %s)"
                         % (name, tuple(t.stride())))
    staged = t.to(torch.float64)
    announce(ALLREDUCE, "allreduce of %s" % name, staged.numel(), SUMO_FLOAT64, Sum,
             _is_cuda(t))
    _calls.allreduce_tensor(staged, Sum, name)
    if op == Average:
        staged = torch.div(staged, rt.state.size, rounding_mode="trunc")
    t.copy_(staged)
    return t


class _Allreduce(torch.autograd.Function):
    """Differentiable, as Horovod's: the gradient of an allreduce is the allreduce (same op
    and factors) of the gradients."""

    @staticmethod
    def forward(ctx, tensor, op, name, prescale, postscale):
        ctx.args = (op, name, prescale, postscale)
        out = tensor.detach().clone(memory_format=torch.contiguous_format)
        return _allreduce_inplace(out, op, name, prescale, postscale)

    @staticmethod
    def backward(ctx, grad):
        op, name, prescale, postscale = ctx.args
        out = grad.detach().clone(memory_format=torch.contiguous_format)
        _allreduce_inplace(out, op, name + " (gradient)", prescale, postscale)
        return out, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0):
    """A new tensor: op over the ranks' tensors of postscale * op(prescale * tensor); the
    input is not modified. Differentiable."""
    rt.require_init()
    op = resolve_op(op, average, "allreduce")
    check_compression(compression, "allreduce")
    name = name or "tensor"
    _check_tensor(tensor, name)
    sent, ctx = compression.compress(tensor)
    out = _Allreduce.apply(sent, op, name, float(prescale_factor), float(postscale_factor))
    return compression.decompress(out, ctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0):
    """In place: every rank ends with the combined tensor (Adasum: the tensor as one)."""
    rt.require_init()
    op = resolve_op(op, average, "allreduce_")
    return _allreduce_inplace(tensor, op, name or "tensor", float(prescale_factor),
                              float(postscale_factor))


def _grouped(tensors, op, name, prescale, postscale):
    """Each tensor reduced in place; tensors of one floating dtype travel in one buffer for
    Sum and Average (elementwise, so the same bits as one by one), Adasum one by one (per
    tensor, as Horovod's grouped Adasum)."""
    for i, t in enumerate(tensors):
        _check_tensor(t, "%s[%d]" % (name, i))
    _tensors.same_device([("%s[%d]" % (name, i), t) for i, t in enumerate(tensors)],
                         "grouped allreduce of %s" % name)
    by_dtype = {}
    for i, t in enumerate(tensors):
        if op != Adasum and t.dtype in _tensors._DTYPES:
            by_dtype.setdefault(t.dtype, []).append(i)
        else:
            _allreduce_inplace(t, op, "%s[%d]" % (name, i), prescale, postscale)
    for dtype, idx in by_dtype.items():
        flat = torch.cat([tensors[i].detach().reshape(-1) for i in idx])
        _allreduce_inplace(flat, op, "%s (%d %s tensors)" % (name, len(idx), dtype), prescale,
                           postscale)
        off = 0
        for i in idx:
            n = tensors[i].numel()
            tensors[i].detach().copy_(flat[off:off + n].view_as(tensors[i]))
            off += n
    return tensors


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0):
    """New tensors, each the allreduce of the corresponding input."""
    rt.require_init()
    op = resolve_op(op, average, "grouped_allreduce")
    check_compression(compression, "grouped_allreduce")
    sent = [compression.compress(t) for t in tensors]
    outs = [s.detach().clone(memory_format=torch.contiguous_format) for s, _ in sent]
    _grouped(outs, op, name or "tensors", float(prescale_factor), float(postscale_factor))
    return [compression.decompress(o, c) for o, (_, c) in zip(outs, sent)]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0):
    rt.require_init()
    op = resolve_op(op, average, "grouped_allreduce_")
    return _grouped(list(tensors), op, name or "tensors", float(prescale_factor),
                    float(postscale_factor))


# -- asynchronous allreduce, fused ------------------------------------------------------------
#
# Tensor fusion (Horovod's HOROVOD_FUSION_THRESHOLD): allreduce_async of a floating tensor
# with Sum or Average joins the open buffer of its dtype and op instead of starting a
# collective of its own. sumo matches collectives by their order on every rank, so where a
# buffer is cut must be decided alike on every rank without asking the others; it is
# decided by the calls alone:
#   - a buffer is started when the next tensor would take it past the threshold (a tensor of
#     the threshold or more goes alone), so the k-th call lands in the same buffer on every
#     rank that makes the same calls;
#   - every open buffer is started, oldest first, when anything waits on or polls one of its
#     tensors, and before any other collective of sumo.torch (rt.sync()), since those are
#     points of the program every rank reaches in the same order.
# There is no timer (Horovod's HOROVOD_CYCLE_TIME): a timer on each rank would cut a buffer
# after different tensors on different ranks. A cut at different calls still cannot pass
# unnoticed: the buffers' element counts then differ, which sumo refuses with
# SUMO_ERR_MISMATCH on every rank.
# Sum and Average are elementwise, so a tensor reduced in a fused buffer gets the bits it
# gets alone wherever the algorithm adds in rank order (every transport on one host);
# prescale and postscale are applied per tensor, so they need not match within a buffer.

class _Pending:
    def __init__(self, req, tensor, postscale, name, t0):
        self.req, self.tensor, self.postscale, self.name, self.t0 = req, tensor, postscale, name, t0
        self.fused = None    # the _Fused buffer it travels in
        self.offset = 0
        self.prescale = 1.0
        self.error = None    # its communicator was replaced before it was waited for


_pending = {}
_handle_ids = itertools.count(1)


class _Fused:
    """One fused buffer: its tensors (_Pending), in call order, and once started its
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
    starting = False     # a buffer is being started: its own announcement must not start others
    buffers = 0          # collectives started for asynchronous allreduces, fused or not
    tensors = 0          # tensors they carried


_fusion = _Fusion()


def _fusion_threshold():
    """SUMO_FUSION_THRESHOLD (through sumo's parser: a bad value is refused by name), else
    HOROVOD_FUSION_THRESHOLD (Horovod's name), else 64 MiB."""
    if _fusion.threshold is not None:
        return _fusion.threshold
    value = ctypes.c_char_p()
    if lib.sumo_setting(b"SUMO_FUSION_THRESHOLD", ctypes.byref(value)) != 0:
        msg = ctypes.create_string_buffer(256)
        lib.sumo_env_check(msg, len(msg))  # the parser's sentence, naming the variable
        raise ValueError("sumo.torch: " + msg.value.decode())
    if not os.environ.get("SUMO_FUSION_THRESHOLD") and os.environ.get("HOROVOD_FUSION_THRESHOLD"):
        text = os.environ["HOROVOD_FUSION_THRESHOLD"]
        try:
            threshold = int(text, 10)
        except ValueError:
            threshold = -1
        if not 0 <= threshold <= 1 << 40:
            raise ValueError("sumo.torch: HOROVOD_FUSION_THRESHOLD=%r is not a byte count: "
                             "expected bytes, a whole number in 0 .. 1099511627776 (unset: "
                             "SUMO_FUSION_THRESHOLD, else 67108864)" % text)
    else:
        threshold = int(value.value)
    _fusion.threshold = threshold
    return threshold


def fusion_stats():
    """{"buffers": collectives started for allreduce_async so far, "tensors": the tensors
    they carried, "threshold": the fusion threshold in bytes}: buffers < tensors where calls
    were fused."""
    return {"buffers": _fusion.buffers, "tensors": _fusion.tensors,
            "threshold": _fusion_threshold()}


def _start_fused(b):
    """Packs b (or takes its one tensor in place), announces it and starts its collective.
    An error is kept for the members' synchronize() and raised here too."""
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
        announce(ALLREDUCE, b.what, n, dt, b.op, _is_cuda(flat), wait=False)
        for m in b.members:
            if m.prescale != 1.0:
                k = m.tensor.numel()
                flat.view(-1)[m.offset:m.offset + k].mul_(m.prescale)
        rt.sync()
        req = ctypes.c_void_p()
        b.t0 = time.perf_counter()
        rt.raise_for(_run(SUMO_COLLECTIVE_ALLREDUCE, flat, ptr, ptr, n, dt, op=b.op, request=req,
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
        reap_announcements(block=False)  # those queued ahead of this buffer are done
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
    _check_tensor(tensor, name)
    handle = next(_handle_ids)
    if tensor.dtype not in _tensors._DTYPES:  # integers: through float64, at once
        _allreduce_inplace(tensor, op, name, float(prescale_factor), float(postscale_factor))
        _pending[handle] = _Pending(None, tensor, 1.0, name, 0.0)
        return handle
    _tensors.checked_tensor(tensor, name)
    threshold = _fusion_threshold()
    p = _Pending(None, tensor, float(postscale_factor), name, 0.0)
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
    _pending[handle] = p
    return handle


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0):
    """As allreduce_async_, on a copy: synchronize() returns the new tensor."""
    _check_tensor(tensor, name or "tensor")
    return allreduce_async_(tensor.detach().clone(memory_format=torch.contiguous_format),
                            average, name, op, prescale_factor, postscale_factor)


def poll(handle):
    """True once the collective of the handle has completed (synchronize() will not wait).
    A tensor still in an open fused buffer starts it (and the others open) first."""
    p = _pending.get(handle)
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
    p = _pending.pop(handle, None)
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
        _scale(p.tensor, p.postscale)
        return p.tensor
    if p.req is not None:
        code = lib.sumo_request_wait(p.req)
        rt.record(p.t0, time.perf_counter(), p.tensor.numel() * p.tensor.element_size())
        rt.raise_for(code, "allreduce of %s" % p.name)
        _scale(p.tensor, p.postscale)
    return p.tensor


# A collective of sumo.torch's own starts the open fused buffers first (rt.sync()).
rt.before_collective = _start_open


class _Outstanding:
    """What this module has in flight on the communicator, for when sumo.torch.elastic
    replaces it (bind): every started request is waited for (which frees it), and every
    handle not yet synchronized, started or not, raises the loss on synchronize(): the
    caller redoes the step on the new membership. Join's count of rounds starts again, since
    the processes still here may have got through different numbers of them."""

    def comm_closing(self):
        lost = rt.error_for(SUMO_ERR_PEER_FAILURE, "the communicator was replaced (a process "
                            "was lost or joined) before this collective was waited for")
        while _started:
            lib.sumo_request_wait(_started.pop(0)[1])
        for b in _fusion.open.values():
            b.started = True  # never started now: its members raise below
        _fusion.open.clear()
        for p in _pending.values():
            b = p.fused
            if b is not None and b.req is not None and not b.done and b.error is None:
                lib.sumo_request_wait(b.req)
                b.done = True
            elif b is None and p.req is not None:
                lib.sumo_request_wait(p.req)
                p.req = None
            p.error = lost
        _join.rounds = 0

    def comm_opened(self):
        pass


_outstanding = _Outstanding()
_membership.bind(_outstanding)


# -- bytes: broadcast and allgather of any dtype --------------------------------------------------

def _to_words(t):
    """t's bytes (C order) in a float64 tensor padded with zeros to whole words: a
    broadcast or an allgather copies them bit for bit, whatever t's dtype."""
    flat = t.detach().contiguous().view(-1)
    u8 = flat.view(torch.uint8)
    words = u8.new_zeros((u8.numel() + 7) // 8, dtype=torch.float64)  # on t's device
    words.view(torch.uint8)[:u8.numel()] = u8
    return words, u8.numel()


def _from_bytes(u8, dtype, shape):
    return u8.clone().view(dtype).view(shape)


def _broadcast_raw(t, root, name):
    """t (any dtype) replaced by the root's, in place, with no announcement."""
    _check_tensor(t, name)
    if t.dtype in _tensors._DTYPES and t.is_contiguous():
        _calls.broadcast_tensor(t, root, name)
        return t
    words, nbytes = _to_words(t)
    _calls.broadcast_tensor(words, root, name)
    with torch.no_grad():
        t.copy_(_from_bytes(words.view(torch.uint8)[:nbytes], t.dtype, t.shape))
    return t


def _check_root(root_rank, where):
    if isinstance(root_rank, bool) or not isinstance(root_rank, int) or \
            not 0 <= root_rank < rt.state.size:
        raise ValueError("%s: root_rank %r is not a rank of %d" % (where, root_rank, rt.state.size))


def broadcast_(tensor, root_rank=0, name=None):
    """In place: the root's tensor on every rank (any dtype, bit for bit)."""
    rt.require_init()
    name = name or "tensor"
    _check_root(root_rank, "broadcast_ of %s" % name)
    _check_tensor(tensor, name)
    announce(_BROADCAST, "broadcast of %s" % name)
    return _broadcast_raw(tensor, root_rank, name)


class _Broadcast(torch.autograd.Function):
    """Differentiable, as Horovod's: the root's gradient is the sum of every rank's, the
    others' zero."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name):
        ctx.root_rank, ctx.name = root_rank, name
        out = tensor.detach().clone(memory_format=torch.contiguous_format)
        announce(_BROADCAST, "broadcast of %s" % name)
        return _broadcast_raw(out, root_rank, name)

    @staticmethod
    def backward(ctx, grad):
        out = grad.detach().clone(memory_format=torch.contiguous_format)
        _allreduce_inplace(out, Sum, ctx.name + " (gradient)", 1.0, 1.0)
        if rt.state.rank != ctx.root_rank:
            out.zero_()
        return out, None, None


def broadcast_async_(tensor, root_rank=0, name=None):
    """Starts an in-place broadcast (sumo_broadcast_start) and returns a handle for poll()
    and synchronize(), which returns the tensor. float32/64 and float16/bfloat16 only."""
    rt.require_init()
    name = name or "tensor"
    _check_root(root_rank, "broadcast_async_ of %s" % name)
    _check_tensor(tensor, name)
    ptr, n, dt = _tensors.checked_tensor(tensor, name)
    announce(_BROADCAST, "broadcast of %s" % name)
    rt.sync()
    req = ctypes.c_void_p()
    t0 = time.perf_counter()
    rt.raise_for(_run(SUMO_COLLECTIVE_BROADCAST, tensor, ptr, ptr, n, dt, root=int(root_rank),
                      request=req,
                      cpu=lambda: lib.sumo_broadcast_start(ptr, ptr, n, dt, int(root_rank),
                                                           rt.state.comm, ctypes.byref(req))),
                 "broadcast of %s" % name)
    handle = next(_handle_ids)
    _pending[handle] = _Pending(req, tensor, 1.0, name, t0)
    return handle


def _reducescatter_args(tensor, op, name, where):
    rt.require_init()
    op = resolve_op(op, None, where)
    if op == Adasum:
        raise ValueError("%s: Adasum's result is not defined piece by piece; use Sum or "
                         "Average" % where)
    _check_tensor(tensor, name)
    size = rt.state.size
    if tensor.dim() == 0 or tensor.shape[0] % size:
        rt.fail_together(ValueError("%s of %s: the first dimension (%s) must divide among the "
                                    "%d ranks" % (where, name, tuple(tensor.shape), size)))
    src = tensor.detach().contiguous()
    ptr, n, dt = _tensors.checked_tensor(src, name)
    out = src.new_empty((tensor.shape[0] // size,) + tuple(tensor.shape[1:]))
    announce(_REDUCESCATTER, "reducescatter of %s" % name, out.numel(), dt, op)
    return src, ptr, out, out.numel(), dt, op


def reducescatter(tensor, op=None, name=None):
    """Every rank's tensor reduced (Sum or Average), split along the first dimension: rank r
    gets rows [r n / P, (r + 1) n / P) (the first dimension must divide among the ranks)."""
    name = name or "tensor"
    src, ptr, out, n, dt, op = _reducescatter_args(tensor, op, name, "reducescatter")
    rt.sync()
    t0 = time.perf_counter()
    recv = _tensors.tensor_args(out, name)[0]
    rt.raise_for(_run(SUMO_COLLECTIVE_REDUCE_SCATTER, src, ptr, recv, n, dt, op=op,
                      cpu=lambda: lib.sumo_reduce_scatter(ptr, recv, n, dt, op, rt.state.comm)),
                 "reducescatter of %s" % name)
    rt.record(t0, time.perf_counter(), src.numel() * src.element_size())
    return out


def reducescatter_async(tensor, op=None, name=None):
    """reducescatter started (sumo_reduce_scatter_start): a handle for poll() and
    synchronize(), which returns this rank's rows. The input stays untouched until then."""
    name = name or "tensor"
    src, ptr, out, n, dt, op = _reducescatter_args(tensor, op, name, "reducescatter_async")
    rt.sync()
    req = ctypes.c_void_p()
    t0 = time.perf_counter()
    recv = _tensors.tensor_args(out, name)[0]
    rt.raise_for(_run(SUMO_COLLECTIVE_REDUCE_SCATTER, src, ptr, recv, n, dt, op=op, request=req,
                      cpu=lambda: lib.sumo_reduce_scatter_start(ptr, recv, n, dt, op,
                                                                rt.state.comm,
                                                                ctypes.byref(req))),
                 "reducescatter of %s" % name)
    handle = next(_handle_ids)
    p = _Pending(req, out, 1.0, name, t0)
    p.keep = src  # read by sumo until the request completes
    _pending[handle] = p
    return handle


def broadcast(tensor, root_rank=0, name=None):
    """A new tensor holding the root's; the input is not modified. Differentiable."""
    rt.require_init()
    name = name or "tensor"
    _check_root(root_rank, "broadcast of %s" % name)
    _check_tensor(tensor, name)
    return _Broadcast.apply(tensor, root_rank, name)


def _allgather_tensor(send, recv, name):
    sp, n, dt = _tensors.checked_tensor(send, name)
    rp = _tensors.tensor_args(recv, name)[0]
    rt.sync()
    t0 = time.perf_counter()
    rt.raise_for(_run(SUMO_COLLECTIVE_ALLGATHER, send, sp, rp, n, dt,
                      cpu=lambda: lib.sumo_allgather(sp, rp, n, dt, rt.state.comm)),
                 "allgather of %s" % name)
    rt.record(t0, time.perf_counter(), recv.numel() * recv.element_size())


_CODES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8, torch.int8,
          torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128]
_META = 12  # rows, bytes, dims, dtype code, then up to 8 trailing dimensions


def _allgather_raw(t, name):
    """Every rank's t concatenated along dim 0 (first dimensions may differ) and the
    ranks' first dimensions, with no announcement. Two allgathers: the shapes, then the
    bytes, each rank's padded to the longest."""
    t = t.detach()
    if t.dim() == 0:
        t = t.view(1)
    if t.dim() > _META - 3 or t.dtype not in _CODES:
        raise ValueError("sumo: allgather of %s: %d dimensions of %s; at most %d dimensions of "
                         "%s" % (name, t.dim(), t.dtype, _META - 3,
                                 ", ".join(str(d).replace("torch.", "") for d in _CODES)))
    size = rt.state.size
    words, nbytes = _to_words(t)
    meta = torch.zeros(_META, dtype=torch.float64)
    meta[:4] = torch.tensor([t.shape[0], nbytes, t.dim(), _CODES.index(t.dtype)],
                            dtype=torch.float64)
    meta[4:4 + t.dim() - 1] = torch.tensor(t.shape[1:], dtype=torch.float64)
    metas = torch.empty(size * _META, dtype=torch.float64)
    _allgather_tensor(meta, metas, name + " (shapes)")
    metas = metas.view(size, _META)
    # Every rank sees the same shapes, so all raise alike.
    if not bool((metas[:, 2:] == metas[0, 2:]).all()):
        def shape(m):
            dims = [int(m[0])] + [int(d) for d in m[4:4 + int(m[2]) - 1]]
            return "%s %s" % (str(_CODES[int(m[3])]).replace("torch.", ""), tuple(dims))
        raise ValueError("sumo: allgather of %s: the ranks' tensors differ in dtype or in a "
                         "dimension after the first: %s" % (
                             name, ", ".join("rank %d %s" % (r, shape(metas[r].tolist()))
                                             for r in range(size))))
    rows = [int(r) for r in metas[:, 0].tolist()]
    lengths = [int(b) for b in metas[:, 1].tolist()]
    width = (max(lengths) + 7) // 8
    if width == 0:
        return t.new_empty((sum(rows),) + tuple(t.shape[1:])), rows
    send = words.new_zeros(width)  # on t's device, as recv
    send[:words.numel()] = words
    recv = words.new_empty(size * width)
    _allgather_tensor(send, recv, name)
    u8 = recv.view(size, width).view(torch.uint8)
    joined = torch.cat([u8[r, :lengths[r]] for r in range(size)])
    return _from_bytes(joined, t.dtype, (sum(rows),) + tuple(t.shape[1:])), rows


class _Allgather(torch.autograd.Function):
    """Differentiable, as Horovod's: each rank's gradient is its rows of the sum of the
    ranks' gradients."""

    @staticmethod
    def forward(ctx, tensor, name):
        ctx.name = name
        announce(_ALLGATHER, "allgather of %s" % name)
        out, rows = _allgather_raw(tensor, name)
        ctx.offset, ctx.rows = sum(rows[:rt.state.rank]), rows[rt.state.rank]
        ctx.scalar = tensor.dim() == 0
        return out

    @staticmethod
    def backward(ctx, grad):
        out = grad.detach().clone(memory_format=torch.contiguous_format)
        _allreduce_inplace(out, Sum, ctx.name + " (gradient)", 1.0, 1.0)
        mine = out.narrow(0, ctx.offset, ctx.rows)
        return (mine.view(()) if ctx.scalar else mine), None


def allgather(tensor, name=None):
    """Every rank's tensor concatenated along the first dimension, in rank order; the
    first dimensions may differ, the others and the dtype must not. Any dtype.
    Differentiable."""
    rt.require_init()
    name = name or "tensor"
    _check_tensor(tensor, name)
    return _Allgather.apply(tensor, name)


def barrier():
    announce(_BARRIER, "barrier")
    rt.sync()
    rt.raise_for(lib.sumo_barrier(rt.require_init()), "barrier")


# -- objects, parameters, optimizer state ---------------------------------------------------------

def _broadcast_bytes(data, root_rank, what):
    n = torch.tensor([float(len(data)) if data is not None else 0.0], dtype=torch.float64)
    _calls.broadcast_tensor(n, root_rank, what + " (length)")
    nbytes = int(n[0].item())
    if nbytes == 0:
        return b""
    if data is not None:
        buf = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    else:
        buf = torch.empty(nbytes, dtype=torch.uint8)
    words, _ = _to_words(buf)
    _calls.broadcast_tensor(words, root_rank, what)
    return ctypes.string_at(words.data_ptr(), nbytes)


def broadcast_object(obj, root_rank=0, name=None):
    """The root's object (pickled) on every rank."""
    rt.require_init()
    name = name or type(obj).__name__
    _check_root(root_rank, "broadcast_object of %s" % name)
    announce(_BROADCAST, "broadcast_object of %s" % name)
    data = pickle.dumps(obj) if rt.state.rank == root_rank else None
    data = _broadcast_bytes(data, root_rank, name)
    return obj if rt.state.rank == root_rank else pickle.loads(data)


def allgather_object(obj, name=None):
    """Every rank's object (pickled), as a list in rank order."""
    rt.require_init()
    name = name or type(obj).__name__
    announce(_ALLGATHER, "allgather_object of %s" % name)
    data = pickle.dumps(obj)
    gathered, rows = _allgather_raw(torch.frombuffer(bytearray(data), dtype=torch.uint8), name)
    out, off = [], 0
    for n in rows:
        out.append(pickle.loads(ctypes.string_at(gathered.data_ptr() + off, n)))
        off += n
    return out


@torch.no_grad()
def broadcast_parameters(params, root_rank=0):
    """Copies the root's tensors into every rank's, in place: a state_dict (in key order),
    named_parameters() pairs or plain tensors, as Horovod takes them. Any dtype, bit for
    bit (BatchNorm's counters too)."""
    rt.require_init()
    _check_root(root_rank, "broadcast_parameters")
    items = sorted(params.items()) if isinstance(params, dict) else list(params)
    named = []
    for i, item in enumerate(items):
        name, t = item if isinstance(item, tuple) else ("params[%d]" % i, item)
        if not isinstance(t, torch.Tensor):
            raise TypeError("broadcast_parameters: %s is not a tensor" % name)
        _check_tensor(t, name)
        named.append((name, t))
    _tensors.same_device(named, "broadcast_parameters")
    announce(_BROADCAST, "broadcast_parameters")
    for name, t in named:
        _broadcast_raw(t, root_rank, name)


def broadcast_optimizer_state(optimizer, root_rank=0, model=None):
    """The root's optimizer state (moments, step counts, hyperparameters) on every rank.
    Any torch optimizer (LBFGS too), also one that has not stepped yet: its state_dict
    travels whole. `model` is accepted for Horovod's signature and not needed."""
    rt.require_init()
    sd = broadcast_object(optimizer.state_dict() if rt.state.rank == root_rank else None,
                          root_rank, "optimizer state")
    if rt.state.rank != root_rank:
        optimizer.load_state_dict(sd)


# -- what this build has --------------------------------------------------------------------------

def mpi_built():
    """Whether libsumo was built with its MPI transport (libsumo_mpi beside it)."""
    return bool(_lib.HAVE_MPI)


def mpi_enabled():
    """Whether this process's communicator runs over MPI."""
    return rt.state.comm is not None and rt.state.transport == "mpi"


def gloo_built():
    """sumo's collectives never run on gloo (init() only sets up torch's gloo group for
    the program's own use)."""
    return False


def gloo_enabled():
    return False


def nccl_built():
    """1 where libsumo_cuda is built (its NCCL transport loads NCCL at run time), else 0."""
    return int(cuda_built())


def cuda_built():
    """Whether libsumo_cuda is built beside libsumo: CUDA tensors (sumo.torch.init with the
    threads or the NCCL transport)."""
    return os.path.exists(_lib.CUDA_LIBRARY)


def rocm_built():
    return False


def ddl_built():
    return False


def ccl_built():
    return False


def is_initialized():
    return rt.state.comm is not None

